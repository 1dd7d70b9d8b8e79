"""How the link to Redis is doing, as the errors that end a run during a cut name it.

The publisher and the result listener each note their round trips here: a failure
starts (or continues) a spell of trouble, a success ends it. An error raised while a
spell lasts (a run's deadline passing during a cut, a publication given up) says how
long Redis has been unreachable and why, instead of only that a result did not come.
"""

from __future__ import annotations

import threading
import time


class LinkHealth:
    """The current spell of failed round trips to Redis, if any (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._last: BaseException | None = None

    def failed(self, exc: BaseException, since: float | None = None) -> None:
        """A round trip failed: the spell starts unless one is on, when that round trip
        started (``since``, monotonic: a cut shows as a reply that never came) or now."""
        with self._lock:
            if self._since is None:
                self._since = time.monotonic() if since is None else since
            self._last = exc

    def ok(self) -> None:
        """A round trip succeeded: no trouble now."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            self._since = None
            self._last = None

    def down_for(self) -> float | None:
        """Seconds since the first failure of the current spell; ``None``: none."""
        since = self._since
        return None if since is None else time.monotonic() - since

    def describe(self) -> str | None:
        """``"Redis unreachable for 12.3 s (TimeoutError(...))"``, or ``None``."""
        with self._lock:
            since, last = self._since, self._last
        if since is None:
            return None
        return f"Redis unreachable for {time.monotonic() - since:.1f} s ({last!r})"


def worst(*links: LinkHealth) -> str | None:
    """The description of the longest spell of trouble among ``links``, if any."""
    down = [(d, link) for link in links if (d := link.down_for()) is not None]
    if not down:
        return None
    return max(down, key=lambda pair: pair[0])[1].describe()
