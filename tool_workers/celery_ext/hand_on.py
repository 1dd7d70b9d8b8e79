"""Calls a worker does not serve are handed on, not failed.

Orchestrators route a call to its tool queue (``tool:<name>:<version>``), which only
workers serving that tool at that schema consume. A call can still reach a worker that
does not serve it: a stale route, a message published by hand to a shared queue, a
rolling upgrade that moved the tool. Such a worker hands the call on: it republishes the
message, unchanged but for a hop count, to the tool queue of a live worker that serves
the version the call was made with (else any served version), then acknowledges its own
copy. The worker answers with an error only when no live worker serves the tool, or
after :data:`~tool_workers.contract.names.MAX_HOPS` hand-ons (each one logged and
counted in the worker's metrics as the outcome ``handed_on``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis

from tool_workers.contract.connections import redis_client
from tool_workers.contract.fleet import read_entries, tool_queues_serving
from tool_workers.contract.models import WorkerEntry
from tool_workers.contract.names import (
    HOPS_HEADER,
    MAX_HOPS,
    VERSION_HEADER,
    tool_from_task,
    tool_queue,
)
from tool_workers.contract.settings import Settings

log = logging.getLogger("toolfleet.worker")

REGISTRY_SECONDS = 1.0
"""How long a read of the registry is reused for hand-on decisions."""


class NotServed(Exception):
    """Stored as the failure of a call no live worker serves."""


class HandOn:
    """Decides where a call this worker should not run goes.

    Args:
        settings: The worker's settings (the registry's Redis and key prefix).
        served: ``{tool: schema version}`` of the tools this worker serves.
    """

    def __init__(self, settings: Settings, served: Mapping[str, str]) -> None:
        self._settings = settings
        self._served = dict(served)
        self._client: redis.Redis | None = None
        self._entries: list[WorkerEntry] = []
        self._read_at = float("-inf")

    def target(self, headers: Mapping[str, Any]) -> str | None:
        """The tool queue to hand the call with ``headers`` on to; ``None``: run it here.

        Raises:
            NotServed: this worker does not serve the tool and no live worker does (or
                the call was handed on too many times already).
        """
        name = headers.get("task")
        tool = tool_from_task(name) if isinstance(name, str) else None
        if tool is None:
            return None
        mine = self._served.get(tool)
        wanted = headers.get(VERSION_HEADER)
        wanted = wanted if isinstance(wanted, str) else None
        if mine is not None and (wanted is None or wanted == mine):
            return None
        hops = headers.get(HOPS_HEADER, 0)
        hops = hops if isinstance(hops, int) and not isinstance(hops, bool) else MAX_HOPS
        serving = tool_queues_serving(self._entries_now(), tool)
        serving.pop(mine or "", None)
        if wanted is not None and wanted in serving:
            version: str | None = wanted
        elif mine is not None:
            return None  # the version asked for is gone: this one checks the arguments
        else:
            version = max(serving, key=lambda v: len(serving[v]), default=None)
        if version is None:
            if mine is not None:
                return None
            raise NotServed(f"no live worker serves '{tool}'")
        if hops >= MAX_HOPS:
            if mine is not None:
                return None
            raise NotServed(f"'{tool}' was handed on {MAX_HOPS} times and no worker took it")
        return tool_queue(tool, version)

    def forward(self, app: Any, message: Any, queue: str) -> None:
        """Republish ``message`` (body and headers as received, one hop more) to ``queue``
        and acknowledge the received copy. Raises what the broker raises (nothing is
        acknowledged then: the call comes back)."""
        headers = dict(message.headers)
        hops = headers.get(HOPS_HEADER, 0)
        headers[HOPS_HEADER] = (hops if isinstance(hops, int) else 0) + 1
        properties = message.properties if isinstance(message.properties, dict) else {}
        kept = {k: properties[k] for k in ("reply_to", "correlation_id") if k in properties}
        target = app.amqp.queues[queue]
        with app.producer_pool.acquire(block=True) as producer:
            producer.publish(
                message.body,
                exchange="",
                routing_key=target.name,
                headers=headers,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=2,
                declare=[target],
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
                **kept,
            )
        message.ack()

    def _entries_now(self) -> list[WorkerEntry]:
        if time.monotonic() - self._read_at > REGISTRY_SECONDS:
            if self._client is None:
                self._client = redis_client(self._settings.own_redis_url, self._settings)
            try:
                self._entries = read_entries(self._client, self._settings.key_prefix)
                self._read_at = time.monotonic()
            except redis.RedisError as exc:
                log.warning("cannot read the registry to hand a call on: %r", exc)
        return self._entries
