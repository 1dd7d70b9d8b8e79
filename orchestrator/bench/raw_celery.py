"""A bare Celery app: the floor scenario g (``cost``) measures toolfleet's calls against.

Stock Celery on the same Redis server as toolfleet, with the settings a careful user of
plain Celery would pick and toolfleet also has (JSON only, late acknowledgement), and
nothing of toolfleet's: kombu's own Redis transport, Celery's own Redis result backend,
one ``noop`` task that returns a small dict. Its queue and every key it writes carry a
prefix of its own, so it never sees toolfleet's calls nor they its.

The bench serves it with a stock worker::

    TOOLFLEET_BENCH_RAW_URL=redis://... TOOLFLEET_BENCH_RAW_PREFIX=bench-x-raw: \\
        celery -A orchestrator.bench.raw_celery worker -P prefork -c 4 -Q raw-bench

and its client side builds the same app with :func:`create_raw_app` from the same two
values, so both ends agree.
"""

from __future__ import annotations

import os

from celery import Celery

URL_ENV = "TOOLFLEET_BENCH_RAW_URL"
"""Broker and result backend URL of the worker's app."""
PREFIX_ENV = "TOOLFLEET_BENCH_RAW_PREFIX"
"""Key prefix of the worker's app (its queue, unacked set and results)."""

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_PREFIX = "toolfleet-bench-raw:"

QUEUE = "raw-bench"
NOOP = "raw.noop"

STOCK_REDIS_TRANSPORT = "kombu.transport.redis:Transport"
"""kombu's Redis transport by its import path: a process that also built a toolfleet app
has ``redis://`` aliased to toolfleet's transport, and the bare app must not use it."""


def _noop(text: str) -> dict[str, str]:
    return {"text": text}


def create_raw_app(url: str, prefix: str) -> Celery:
    """A bare Celery app on ``url`` (broker and result backend), its keys under ``prefix``.

    Args:
        url: ``redis://`` URL of the server.
        prefix: Prefix of every key and queue the app uses (e.g. ``"bench-1234-raw:"``).

    Returns:
        The app, with the :data:`NOOP` task registered.
    """
    app = Celery("raw", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        broker_transport=STOCK_REDIS_TRANSPORT,
        broker_transport_options={"global_keyprefix": prefix},
        result_backend_transport_options={"global_keyprefix": prefix},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_default_queue=QUEUE,
        task_default_exchange=QUEUE,
        task_default_routing_key=QUEUE,
        # As toolfleet: acknowledged after the task ran, so a lost worker loses no call.
        task_acks_late=True,
    )
    # Not shared: a shared task would also be registered on every other app this process
    # finalizes (the toolfleet apps of the bench among them).
    app.task(name=NOOP, shared=False)(_noop)
    return app


app = create_raw_app(
    os.environ.get(URL_ENV, DEFAULT_URL), os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)
)
"""The app ``celery -A orchestrator.bench.raw_celery worker`` serves (from the environment)."""
