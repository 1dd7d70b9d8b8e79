"""The worker's event heartbeat, sent without retries so a cut link cannot stall the worker.

Celery's worker sends a ``worker-heartbeat`` event every 2 s from its event loop, and
retries a failed send until the broker answers again. The event loop also fires the pool's
time limits, so during a network cut a retried heartbeat froze the worker: soft and hard
time limits fired only after the link came back, tens of seconds late. A heartbeat is
only worth sending now (the next one is due 2 s later), so this one is sent once; while
the broker is unreachable it is buffered by Celery's event dispatcher and flushed when the
connection is back.
"""

from __future__ import annotations

from typing import Any

from celery.worker.consumer import heart

from tool_workers.compat import celery as celery_compat


class OneShotHeart(celery_compat.Heart):
    """Celery's heartbeat timer, each event sent once (never retried)."""

    def send(self, event: str, retry: bool) -> Any:
        return super().send(event, retry=False)


class Heart(heart.Heart):  # type: ignore[misc]
    """The consumer bootstep that runs :class:`OneShotHeart` in place of Celery's own."""

    def start(self, c: Any) -> None:
        """Start sending heartbeats on the consumer's timer."""
        c.heart = OneShotHeart(c.timer, c.event_dispatcher, self.heartbeat_interval)
        c.heart.start()
