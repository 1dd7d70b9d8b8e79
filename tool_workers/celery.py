"""The worker's Celery app: ``celery -A tool_workers worker`` finds ``app`` here.

Celery looks for ``<package>.celery`` when ``-A`` names a package; the worker itself is
built in :mod:`tool_workers.runtime.worker`.
"""

from __future__ import annotations

import os
import sys

from tool_workers.runtime.worker import app

if "flower" in sys.argv[1:]:
    # Flower on this app (celery -A tool_workers flower): the files it writes (its
    # persistent database of tasks, FLOWER_DB) are readable by its user alone.
    os.umask(0o077)

__all__ = ["app"]
