"""Assistants: a graph of this server with a config, context and metadata of its own.

Each graph the server runs is an assistant of the server's own (``created_by: system``),
the same for every tenant and never changed through the API. A tenant creates more
(``POST /assistants``), seen by that tenant only, as its threads are; each change
(``PATCH``) is a new version, and any version can be made the current one again
(``POST /assistants/{id}/latest``). A run started with an assistant runs its graph with
the assistant's config and context beneath the run's own.

In Redis: one hash per assistant (its current document, its last version's number and
the bytes it keeps), one hash of its versions, and the tenant's index of assistants by
creation time. A change reads and writes under ``WATCH``: two concurrent changes never
share a version number, and neither is lost.

As threads do, a tenant's assistants expire: ``TOOLFLEET_THREAD_TTL`` seconds after they
were last used (read, run or changed). Each keeps its ``TOOLFLEET_ASSISTANT_MAX_VERSIONS``
most recent versions (a new one past that drops the oldest), and counts with them
against its tenant's storage quota (:mod:`orchestrator.server.guards.account`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from orchestrator.server.encoding import dumps, loads
from orchestrator.server.errors import Conflict, NotFound, RequestRefused
from orchestrator.server.graphs import Graphs, GraphSource
from orchestrator.server.guards.account import TenantAccount, assistant_field, size_of
from orchestrator.server.keys import Keys
from orchestrator.server.records import now_iso
from orchestrator.server.schemas import AssistantCreate, AssistantPatch
from orchestrator.server.tenancy import thread_key

_CREATE = """
-- KEYS: assistant hash, versions hash, the tenant's index.
-- ARGV: id, score, doc, version, ttl, bytes.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'last', 1, 'bytes', ARGV[6])
redis.call('HSET', KEYS[2], '1', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[5]) end
return 1
"""

DEFAULT_TTL = 2_592_000
"""Seconds an unused assistant is kept when no TTL is given (the thread TTL's default)."""

_VERSION_FIELDS = (
    "assistant_id",
    "graph_id",
    "config",
    "context",
    "metadata",
    "name",
    "description",
    "version",
    "created_at",
)


class BothConfigurableAndContext(RequestRefused):
    """An assistant given both ``config.configurable`` and ``context``."""


class AssistantStore:
    """The server's assistants and the tenants'.

    Args:
        client: A ``redis.asyncio`` client created with ``decode_responses=True``.
        keys: Key names of the deployment.
        graphs: The graphs the server runs.
        ttl: Seconds a tenant's assistant is kept after its last use.
        max_versions: Versions kept per assistant.
        quota: Counts each assistant and its versions against its tenant's storage quota.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        graphs: Graphs,
        *,
        ttl: int = DEFAULT_TTL,
        max_versions: int = 20,
        quota: TenantAccount | None = None,
    ) -> None:
        self._r: Any = client
        self._keys = keys
        self._graphs = graphs
        self._ttl = ttl
        self._max_versions = max_versions
        self._quota = quota
        self.graphs = graphs
        """The graphs the server runs."""
        self._create = client.register_script(_CREATE)

    # -- reading ------------------------------------------------------------------------

    async def get(self, tenant: str, assistant_id: str) -> dict[str, Any]:
        """The assistant (the server's own also by its graph id).

        Raises:
            NotFound: the tenant has no such assistant.
        """
        return (await self.resolve(tenant, assistant_id))[1]

    async def resolve(self, tenant: str, assistant_id: str) -> tuple[GraphSource, dict[str, Any]]:
        """The assistant's graph and the assistant.

        Raises:
            NotFound: the tenant has no such assistant.
        """
        own = self._graphs.find(assistant_id)
        if own is not None:
            return own, own.assistant()
        raw = await self._r.hget(self._key(tenant, assistant_id), "doc")
        if raw is None:
            raise NotFound(f"assistant {assistant_id!r} not found")
        await self._touch(tenant, assistant_id)
        doc: dict[str, Any] = loads(raw)
        return self._graph(doc["graph_id"]), doc

    async def all(self, tenant: str) -> list[dict[str, Any]]:
        """The server's assistants, then the tenant's in the order they were created."""
        ids = await self._r.zrange(self._keys.assistants(tenant), 0, -1)
        found = self._graphs.assistants()
        if ids:
            async with self._r.pipeline(transaction=False) as pipe:
                for assistant_id in ids:
                    pipe.hget(self._key(tenant, assistant_id), "doc")
                docs = await pipe.execute()
            found += [loads(doc) for doc in docs if doc is not None]
            gone = [i for i, doc in zip(ids, docs, strict=True) if doc is None]
            if gone:  # expired: their entries leave the index
                await self._r.zrem(self._keys.assistants(tenant), *gone)
        return found

    async def versions(
        self, tenant: str, assistant_id: str, metadata: dict[str, Any], limit: int, offset: int
    ) -> list[dict[str, Any]]:
        """The assistant's versions whose metadata holds ``metadata``, newest first.

        Raises:
            NotFound: the tenant has no such assistant.
        """
        own = self._graphs.find(assistant_id)
        if own is not None:
            every = [_version_of(own.assistant())]
        else:
            raw = await self._r.hgetall(self._versions_key(tenant, assistant_id))
            if not raw:
                raise NotFound(f"assistant {assistant_id!r} not found")
            await self._touch(tenant, assistant_id)
            every = [loads(v) for v in raw.values()]
        wanted = [v for v in every if all(v["metadata"].get(k) == x for k, x in metadata.items())]
        wanted.sort(key=lambda v: int(v["version"]), reverse=True)
        return wanted[offset : offset + limit]

    # -- changing -----------------------------------------------------------------------

    async def create(self, tenant: str, body: AssistantCreate) -> dict[str, Any]:
        """A new assistant of the tenant (or, ``if_exists="do_nothing"``, the one of that id).

        Raises:
            NotFound: the server runs no graph ``body.graph_id``.
            Conflict: the id is taken (the server's own assistants' ids and graph ids
                included), and ``if_exists`` is ``raise``.
            QuotaExceeded: it would take the tenant past its storage quota.
        """
        self._graph(body.graph_id)
        assistant_id = body.assistant_id or str(uuid.uuid4())
        if self._graphs.find(assistant_id) is not None:
            raise Conflict(f"assistant {assistant_id!r} is one of the server's own")
        config, context = _synced(body.config or {}, body.context)
        stamp = now_iso()
        version = {
            "assistant_id": assistant_id,
            "graph_id": body.graph_id,
            "config": config,
            "context": context,
            "metadata": body.metadata or {},
            "name": body.name or "Untitled",
            "description": body.description,
            "version": 1,
            "created_at": stamp,
        }
        doc = {**version, "updated_at": stamp}
        key = self._key(tenant, assistant_id)
        doc_text, version_text = _text(doc), _text(version)
        size = size_of(doc_text, version_text)
        if self._quota is not None and not await self._r.exists(key):
            await self._quota.charge(tenant, assistant_field(assistant_id), size)
        created = await self._create(
            keys=[key, self._versions_key(tenant, assistant_id), self._keys.assistants(tenant)],
            args=[assistant_id, time.time(), doc_text, version_text, self._ttl, size],
        )
        if created:
            return doc
        if body.if_exists == "do_nothing":
            return await self.get(tenant, assistant_id)
        raise Conflict(f"assistant {assistant_id!r} already exists")

    async def patch(self, tenant: str, assistant_id: str, body: AssistantPatch) -> dict[str, Any]:
        """The assistant's new version, made current: ``body``'s fields over the current
        one's (metadata merged into it).

        Raises:
            NotFound: no such assistant, or no graph ``body.graph_id``.
            Conflict: it is one of the server's own assistants.
        """
        self._refuse_own(assistant_id)
        if body.graph_id is not None:
            self._graph(body.graph_id)

        def change(current: dict[str, Any], number: int) -> dict[str, Any]:
            if body.config or body.context is not None:  # the new one, kept in step
                config, context = _synced(
                    body.config or _without_configurable(current), body.context
                )
            else:
                config, context = current["config"], current["context"]
            return {
                **{k: current[k] for k in _VERSION_FIELDS},
                "graph_id": body.graph_id or current["graph_id"],
                "config": config,
                "context": context,
                "metadata": {**current["metadata"], **(body.metadata or {})},
                "name": body.name if body.name is not None else current["name"],
                "description": body.description
                if body.description is not None
                else current["description"],
                "version": number,
                "created_at": now_iso(),
            }

        return await self._change(tenant, assistant_id, change)

    async def set_latest(self, tenant: str, assistant_id: str, version: int) -> dict[str, Any]:
        """The assistant with its version ``version`` made current again.

        Raises:
            NotFound: no such assistant or version.
            Conflict: it is one of the server's own assistants (their one version is
                current already: asking for it answers the assistant).
        """
        own = self._graphs.find(assistant_id)
        if own is not None and version == 1:
            return own.assistant()
        self._refuse_own(assistant_id)
        raw = await self._r.hget(self._versions_key(tenant, assistant_id), str(version))
        if raw is None:
            await self.get(tenant, assistant_id)  # NotFound for the assistant itself first
            raise NotFound(f"assistant {assistant_id!r} has no version {version}")
        chosen: dict[str, Any] = loads(raw)
        return await self._change(tenant, assistant_id, lambda _current, _n: chosen, new=False)

    async def delete(self, tenant: str, assistant_id: str) -> None:
        """Forget the assistant and its versions (its threads stay).

        Raises:
            NotFound: no such assistant.
            Conflict: it is one of the server's own assistants.
        """
        self._refuse_own(assistant_id)
        key = self._key(tenant, assistant_id)
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.delete(key, self._versions_key(tenant, assistant_id))
            pipe.zrem(self._keys.assistants(tenant), assistant_id)
            deleted, *_ = await pipe.execute()
        if not deleted:
            raise NotFound(f"assistant {assistant_id!r} not found")
        if self._quota is not None:
            await self._quota.release(tenant, assistant_field(assistant_id))

    async def _change(
        self, tenant: str, assistant_id: str, change: Any, *, new: bool = True
    ) -> dict[str, Any]:
        """Apply ``change(current, next number)`` under ``WATCH``: a new version (``new``)
        or an existing one, made current. A new version past the versions kept drops the
        oldest; the assistant's bytes are counted before anything is written.

        Raises:
            NotFound: no such assistant.
            QuotaExceeded: the change would take the tenant past its storage quota.
        """
        key = self._key(tenant, assistant_id)
        versions = self._versions_key(tenant, assistant_id)
        async with self._r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key, versions)
                    raw, last, kept = await pipe.hmget(key, ["doc", "last", "bytes"])
                    if raw is None:
                        raise NotFound(f"assistant {assistant_id!r} not found")
                    current = loads(raw)
                    number = int(last) + 1
                    version = change(current, number)
                    doc = {
                        **version,
                        "created_at": current["created_at"],
                        "updated_at": now_iso(),
                    }
                    doc_text, version_text = _text(doc), _text(version)
                    held = await pipe.hgetall(versions) if kept is None or new else {}
                    size = size_of(raw) + sum(size_of(v) for v in held.values())
                    size = int(kept) if kept is not None else size
                    size += size_of(doc_text) - size_of(raw)
                    dropped: list[str] = []
                    if new:
                        size += size_of(version_text)
                        oldest = number - self._max_versions  # and any before it
                        dropped = [n for n in held if int(n) <= oldest]
                        size -= sum(size_of(held[n]) for n in dropped)
                    if self._quota is not None:
                        await self._quota.charge(tenant, assistant_field(assistant_id), size)
                    pipe.multi()
                    pipe.hset(key, mapping={"doc": doc_text, "bytes": size})
                    if new:
                        pipe.hset(key, "last", number)
                        pipe.hset(versions, str(number), version_text)
                        if dropped:
                            pipe.hdel(versions, *dropped)
                    for name in (key, versions, self._keys.assistants(tenant)):
                        pipe.expire(name, self._ttl)
                    await pipe.execute()
                    return doc
                except WatchError:
                    continue

    # -- helpers ------------------------------------------------------------------------

    async def _touch(self, tenant: str, assistant_id: str) -> None:
        """Restart the expiry of the tenant's assistant (it is in use) and its index."""
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.expire(self._key(tenant, assistant_id), self._ttl)
            pipe.expire(self._versions_key(tenant, assistant_id), self._ttl)
            pipe.expire(self._keys.assistants(tenant), self._ttl)
            await pipe.execute()

    def _graph(self, graph_id: str) -> GraphSource:
        for source in self._graphs.sources:
            if source.graph_id == graph_id:
                return source
        served = ", ".join(repr(s.graph_id) for s in self._graphs.sources)
        raise NotFound(f"graph {graph_id!r} not found (this server runs {served})")

    def _refuse_own(self, assistant_id: str) -> None:
        own = self._graphs.find(assistant_id)
        if own is not None:
            raise Conflict(
                f"assistant {assistant_id!r} is the server's own for graph {own.graph_id!r} "
                "and does not change; create an assistant of the graph to give it a config"
            )

    def _key(self, tenant: str, assistant_id: str) -> str:
        return self._keys.assistant(thread_key(tenant, assistant_id))

    def _versions_key(self, tenant: str, assistant_id: str) -> str:
        return self._keys.assistant_versions(thread_key(tenant, assistant_id))


def _synced(
    config: dict[str, Any], context: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Config and context kept in step, as LangGraph's server keeps them: ``context`` is
    the config's ``configurable``, or that is ``context``.

    Raises:
        BothConfigurableAndContext: both were given.
    """
    configurable = config.get("configurable")
    if configurable and context:
        raise BothConfigurableAndContext(
            "give either config.configurable or context, not both (context is the newer form)"
        )
    if configurable:
        return config, dict(configurable)
    if context:
        return {**config, "configurable": dict(context)}, context
    return config, context or {}


def _without_configurable(assistant: dict[str, Any]) -> dict[str, Any]:
    """The assistant's config but its ``configurable`` (which a new context replaces)."""
    return {k: v for k, v in assistant["config"].items() if k != "configurable"}


def _version_of(assistant: dict[str, Any]) -> dict[str, Any]:
    return {k: assistant[k] for k in _VERSION_FIELDS}


def _text(doc: dict[str, Any]) -> str:
    return dumps(doc).decode()
