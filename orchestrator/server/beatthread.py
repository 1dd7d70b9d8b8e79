"""Celery's beat in a thread of the replica, started again after it lost Redis.

Beat ends at the first error of a tick or of releasing its lock (Celery's embedded
service does not start it again). :class:`BeatThread` waits, by the shared backoff, until
Redis answers a ping, then starts a new beat, which waits for the lock as any other does.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery
from celery.beat import Service
from redbeat.schedulers import get_redis

from orchestrator.backoff import LOST, Backoff

log = logging.getLogger("toolfleet.server")


class BeatThread(threading.Thread):
    """Celery's beat in a thread, started again after a lost link to Redis (its
    :attr:`service` is the one running now).

    Args:
        app: The beat's Celery app (RedBeat's scheduler and Redis).
        steady_after: Seconds a beat must have run for its loss to count as a new one
            (the backoff starts from its first delay again).
        service: Keyword arguments of Celery's ``Service``.
    """

    def __init__(self, app: Celery, steady_after: float, **service: Any) -> None:
        super().__init__(name="Beat", daemon=True)
        self.app = app
        self._steady_after = steady_after
        self._options = service
        self.service: Service | None = None  # made in the thread (it reads files)
        self._stopping = threading.Event()

    def run(self) -> None:
        self.app.set_current()
        backoff = Backoff()
        while True:
            self.service = Service(self.app, **self._options)
            if self._stopping.is_set():
                return
            began = time.monotonic()
            try:
                self.service.start()
            except LOST as exc:
                log.warning("cron beat lost Redis (%r); starting it again", exc)
            except Exception:  # a bug must not stop every later tick
                log.exception("cron beat failed; starting it again")
            if self._stopping.is_set():
                return
            if time.monotonic() - began > self._steady_after:
                backoff.reset()
            while True:  # until Redis answers: a beat started before fails at once
                if self._stopping.wait(backoff.next()):
                    return
                if self._answers():
                    break

    def _answers(self) -> bool:
        try:
            return bool(get_redis(self.app).ping())
        except LOST:
            return False

    def stop(self) -> None:
        """Have beat stop at its next wake, and not start again."""
        self._stopping.set()
        if self.service is not None:
            self.service.stop(wait=False)
