"""The worker's Celery app: ``celery -A tool_workers worker`` finds ``app`` here.

Celery looks for ``<package>.celery`` when ``-A`` names a package; the worker itself is
built in :mod:`tool_workers.runtime.worker`.
"""

from __future__ import annotations

from tool_workers.runtime.worker import app

__all__ = ["app"]
