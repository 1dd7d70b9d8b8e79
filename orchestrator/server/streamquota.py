"""Each tenant's share of one replica's long-lived event streams.

A stream a client joins (``GET /threads/{id}/stream``, ``GET .../runs/{id}/stream``)
holds a connection and a follower for as long as the client listens, doing nothing
else: without a bound, one tenant's idle listeners fill the replica's connections.
Per replica, a tenant holds at most ``TOOLFLEET_TENANT_MAX_STREAMS`` of them; one more
is a 429 (``Retry-After``). A slot is taken just before the response is made and given
back when the response ends, however it ends (the run's end, the client leaving, the
server shutting down).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from orchestrator.server.errors import AtCapacity


class StreamQuota:
    """The event streams each tenant holds open on this replica.

    Args:
        limit: Streams one tenant may hold at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def held(self, tenant: str) -> int:
        """Streams the tenant holds now."""
        return self._open[tenant]

    def take(self, tenant: str) -> Callable[[], None]:
        """Count one more stream of the tenant; returns what gives it back (once,
        however often it is called).

        Raises:
            AtCapacity: the tenant already holds its maximum of streams here.
        """
        if self._open[tenant] >= self.limit:
            raise AtCapacity(
                f"this tenant has {self._open[tenant]} event streams open on this replica "
                f"(at most {self.limit}); close one, or retry later"
            )
        self._open[tenant] += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self._open[tenant] -= 1
            if self._open[tenant] <= 0:
                del self._open[tenant]

        return give_back


def stream_quota(request: Request) -> StreamQuota:
    """FastAPI dependency: the replica's stream quota."""
    found: StreamQuota = request.app.state.stream_quota
    return found


Streams = Annotated[StreamQuota, Depends(stream_quota)]
"""A route parameter of this type receives the replica's stream quota."""
