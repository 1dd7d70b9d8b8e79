"""The epoch of toolfleet's records in Redis: how either side tells that Redis lost data.

A call's marker (:mod:`tool_workers.contract.marker`) is what keeps a non-idempotent call
from running twice. Redis can lose it: a restart of a server without persistence, a
``FLUSHALL``, an eviction, a failover to a replica that had not caught up. A missing
marker then reads as "never started", and the call would run again.

``<prefix>epoch`` holds a random id, written once (``SET NX``) by the first process that
finds it missing, and never expiring. Every call's message carries the epoch its
publisher knew (the :data:`EPOCH_HEADER`). A worker that starts a call finds:

* its marker: the marker says what happened (nothing lost about this call);
* no marker, and the call's epoch is the current one: a call the marker of which
  expired, or that was published by a client that writes none (runs as before);
* no marker, and the call was published under another epoch (or the epoch key itself
  is gone, so a new one is written): the records of the call were lost after it was
  published. Whether it started is unknown: a non-idempotent call is refused with the
  "may have partially run" answer on every worker; an idempotent one runs.

An orchestrator that finds the marker of a call it published gone (while no result is
stored) knows Redis lost data even where the epoch key survived (a replica promoted
while behind carries the epoch it copied): it replaces the epoch (:data:`LUA_RENEW`), so
the call's copies still on the queues are refused, and answers a non-idempotent call
"may have run" instead of publishing it again.

Each process remembers the epoch it saw last (:class:`EpochWatch`): a change is a loss,
logged once, counted, and noted in ``<prefix>epoch:lost`` for ``toolfleet status``. A
worker's start reads the epoch in its script when the call has no marker (where the
epoch decides) and, for the watch, once per :data:`CHECK_INTERVAL` otherwise: not a
command per call.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

log = logging.getLogger("toolfleet.epoch")

EPOCH = "epoch"
"""What the epoch key has after toolfleet's key prefix."""

LOSSES = "epoch:lost"
"""What the list of noted losses has after toolfleet's key prefix (newest first)."""

LOSSES_KEPT = 20
"""Losses the list keeps."""

LEFT_KEPT = 16
"""Epochs a process remembers having left (to tell a stale answer naming one)."""

CHECK_INTERVAL = 1.0
"""Seconds between a process's looks at the epoch when nothing else reads it (a worker
whose calls all have their markers)."""

EPOCH_HEADER = "toolfleet_epoch"
"""Message header: the epoch the call's publisher knew when it published the call.

On a fleet with a signing key it is covered by the request's signature
(:mod:`tool_workers.contract.signing`): a message whose header was dropped, added or
changed is refused as tampered with, so a captured call whose marker is gone cannot be
made to run again as one from a client that stamps no epoch, or from the current one."""


def epoch_key(key_prefix: str) -> str:
    """The epoch key."""
    return f"{key_prefix}{EPOCH}"


def losses_key(key_prefix: str) -> str:
    """The list of noted losses (JSON objects, newest first)."""
    return f"{key_prefix}{LOSSES}"


def new_epoch() -> str:
    """A fresh epoch id."""
    return uuid.uuid4().hex


def epoch_of(request: Any) -> str:
    """The epoch a delivery's message names (``""``: none, or not a plain short id)."""
    value = getattr(request, EPOCH_HEADER, None) if request is not None else None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, str) and 0 < len(value) <= 64 and value.isalnum():
        return value
    return ""


LUA_EPOCH = """
local function current_epoch(key, candidate)
    local epoch = redis.call('GET', key)
    if epoch then return epoch, 0 end
    redis.call('SET', key, candidate)
    return candidate, 1
end
"""
"""Lua: ``current_epoch(key, candidate)``: the epoch, and 1 when it was missing and
``candidate`` was written in its place."""

LUA_RENEW = """
-- KEYS: the epoch key. ARGV: the epoch the caller knew, a fresh one.
-- Replaces the epoch when it is still the one the caller knew (or gone); returns the
-- epoch now.
local epoch = redis.call('GET', KEYS[1])
if (not epoch) or epoch == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2])
    return ARGV[2]
end
return epoch
"""
"""Lua: a new epoch after a loss the epoch key did not show (another process may have
replaced it first: then its epoch stands)."""


def read_epoch(client: Any, key_prefix: str) -> tuple[str, bool]:
    """The current epoch (written when missing) and whether it was missing.

    Raises:
        redis.RedisError: Redis did not answer.
    """
    candidate = new_epoch()
    if client.set(epoch_key(key_prefix), candidate, nx=True):
        return candidate, True
    value = client.get(epoch_key(key_prefix))
    if value is None:  # deleted in between: take ours
        client.set(epoch_key(key_prefix), candidate)
        return candidate, True
    return value.decode() if isinstance(value, bytes) else str(value), False


def renew_epoch(client: Any, key_prefix: str, known: str) -> str:
    """Replace the epoch ``known`` after a loss it did not show; the epoch now.

    Raises:
        redis.RedisError: Redis did not answer.
    """
    value = client.eval(LUA_RENEW, 1, epoch_key(key_prefix), known, new_epoch())
    return value.decode() if isinstance(value, bytes) else str(value)


def note_loss(client: Any, key_prefix: str, side: str, how: str, epoch: str) -> None:
    """Note a loss in ``<prefix>epoch:lost`` for ``toolfleet status`` (best effort)."""
    entry = json.dumps(
        {
            "at": round(time.time(), 3),
            "side": side,
            "host": socket.gethostname(),
            "how": how,
            "epoch": epoch,
        },
        separators=(",", ":"),
    )
    try:
        with client.pipeline(transaction=False) as pipe:
            pipe.lpush(losses_key(key_prefix), entry)
            pipe.ltrim(losses_key(key_prefix), 0, LOSSES_KEPT - 1)
            pipe.execute()
    except Exception as exc:  # the note is for operators; the loss is handled anyway
        log.warning("could not note the loss of Redis data: %r", exc)


def read_losses(client: Any, key_prefix: str) -> list[dict[str, Any]]:
    """The losses noted, newest first (malformed entries left out)."""
    losses: list[dict[str, Any]] = []
    for raw in client.lrange(losses_key(key_prefix), 0, LOSSES_KEPT - 1):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            losses.append(
                {
                    "at": float(entry["at"]) if isinstance(entry.get("at"), (int, float)) else 0.0,
                    "side": str(entry.get("side", ""))[:32],
                    "host": str(entry.get("host", ""))[:128],
                    "how": str(entry.get("how", ""))[:200],
                }
            )
    return losses


class EpochWatch:
    """The epoch one process saw last; a change is a loss of Redis data.

    Args:
        side: ``worker`` or ``orchestrator`` (in the log line and the loss note).
        on_loss: Called once per loss this process notices (its metric).
    """

    def __init__(self, side: str, on_loss: Callable[[], None] | None = None) -> None:
        self.side = side
        self._on_loss = on_loss
        self._lock = threading.Lock()
        self.known = ""
        """The epoch seen last (``""``: none yet)."""
        self.losses = 0
        """Losses this process noticed."""
        self.generation = 0
        """How many times :attr:`known` changed here. A caller takes it before it reads
        the epoch and passes it as ``since``: the answer of a read begun before the
        epoch it names was left here is stale (another thread's newer answer was taken
        first), not a return of that epoch."""
        self._left: dict[str, int] = {}
        self._looked_at = float("-inf")

    def due(self, interval: float = CHECK_INTERVAL) -> bool:
        """Whether this process should look at the epoch now (``interval`` seconds since
        it last did); a ``True`` counts as the look, so one caller of several makes it."""
        now = time.monotonic()
        with self._lock:
            if now - self._looked_at < interval:
                return False
            self._looked_at = now
            return True

    def _stale(self, epoch: str, since: int | None) -> bool:
        """Whether an answer naming ``epoch``, read from :attr:`generation` ``since``, was
        read before this process left that epoch (call with the lock held)."""
        left_at = self._left.get(epoch)
        return since is not None and left_at is not None and since < left_at

    def _take(self, epoch: str) -> str:
        """``epoch`` is the one known now; the one before (call with the lock held)."""
        previous, self.known = self.known, epoch
        if previous and previous != epoch:
            self.generation += 1
            self._left[previous] = self.generation
            self._left.pop(epoch, None)
            while len(self._left) > LEFT_KEPT:
                del self._left[next(iter(self._left))]
        return previous

    def seen(
        self, epoch: str, *, missing: bool = False, stamped: str = "", since: int | None = None
    ) -> bool:
        """``epoch`` was read (``missing``: the key was gone and this process wrote it;
        ``since``: :attr:`generation` when the read began).

        A loss when this process knew another epoch, or when the key was gone although
        a call (``stamped``) names an epoch. An answer read before this process left
        the epoch it names is stale and ignored. Returns whether this is a loss not yet
        noticed here (the caller notes it in Redis); it is logged and counted here.
        """
        with self._lock:
            self._looked_at = time.monotonic()
            if self._stale(epoch, since):
                return False
            previous = self._take(epoch)
            lost = bool(previous and previous != epoch) or (missing and bool(stamped))
            if lost:
                self.losses += 1
        if lost:
            log.error(
                "Redis lost toolfleet's records (%s): the epoch %s is gone. Calls published "
                "before it that cannot be shown not to have started are not run again when "
                "their tool is not idempotent. Keep Redis persistent (AOF) to avoid this.",
                "its epoch key was missing" if missing else "its epoch changed",
                previous or stamped,
            )
            if self._on_loss is not None:
                self._on_loss()
        return lost

    def lost_marker(self, epoch: str, *, since: int | None = None) -> bool:
        """This process found a marker it wrote gone (the epoch did not show it) and
        replaced the epoch with ``epoch``: logged and counted as :meth:`seen` does
        (``since`` as there)."""
        with self._lock:
            if self._stale(epoch, since):
                return False
            previous = self._take(epoch)
            changed = epoch != previous
            if changed:
                self.losses += 1
        if changed:
            log.error(
                "Redis lost toolfleet's records: the marker of a call published here is "
                "gone while the call has no result (epoch %s replaced). Calls published "
                "before it are not run again when their tool is not idempotent.",
                previous or "-",
            )
            if self._on_loss is not None:
                self._on_loss()
        return changed


def records_lost_text(tool: str) -> str:
    """The answer to a non-idempotent call whose records Redis lost: it may have run."""
    return (
        f"Error: the call to '{tool}' was interrupted when Redis lost its records of it, "
        "and may have partially run. It was not run again because the tool is not "
        "idempotent.\n Check whether its effect happened before calling it again."
    )
