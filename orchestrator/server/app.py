"""The ASGI app: the Agent Protocol routes over one replica's services.

``create_app(settings)`` builds it; its lifespan opens the checkpointer (SQLite file, or
Postgres when ``TOOLFLEET_DATABASE_URL`` is set), connects to Redis, builds the agent (or
takes a project's graphs) and starts the event relay and the run manager; on shutdown it
cancels this replica's runs (their tool tasks are revoked) and closes everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from langchain_core.language_models import BaseChatModel
from langgraph.store.memory import InMemoryStore
from redis.exceptions import RedisError
from starlette.middleware.cors import CORSMiddleware

from orchestrator import fairshare
from orchestrator.agent import async_checkpointer
from orchestrator.dispatch.fleet import dispatcher_for
from orchestrator.server import a2a, mcp, openapi
from orchestrator.server import late as late_records
from orchestrator.server.assistant_store import AssistantStore
from orchestrator.server.auth import TokenAuth
from orchestrator.server.connections import ConnectionGuard, ConnectionLimits, connection_cap
from orchestrator.server.cors import CorsPolicy, cors_policy, middleware_options
from orchestrator.server.cronbeat import CronBeat
from orchestrator.server.cronstore import CronStore
from orchestrator.server.errors import RequestRefused
from orchestrator.server.eventlog import BLOCK_MS, EventLog, EventRelay
from orchestrator.server.graph import AgentProvider, resolve_model
from orchestrator.server.graphs import Graphs, GraphSource, ProjectSource
from orchestrator.server.guard import Guard
from orchestrator.server.guards.account import TenantAccount
from orchestrator.server.keys import Keys
from orchestrator.server.projects import ProjectGraph
from orchestrator.server.routes import (
    assistant_edits,
    assistant_graphs,
    assistants,
    crons,
    metrics,
    run_batches,
    runs,
    store_items,
    system,
    thread_commands,
    thread_edits,
    thread_stream,
    threads,
)
from orchestrator.server.runner import RunManager
from orchestrator.server.services import Services
from orchestrator.server.store import Store
from orchestrator.server.streamquota import StreamQuota
from orchestrator.server.takeover import Drain
from orchestrator.server.tenancy import call_gate, tenant_key, tenant_quota
from orchestrator.server.webhooks import WebhookSender
from tool_workers.contract.connections import async_redis_client
from tool_workers.contract.errors import ConfigError, StartupError
from tool_workers.contract.masking import mask_text, masked_settings
from tool_workers.contract.placeholders import refuse_placeholders
from tool_workers.contract.settings import Settings
from tool_workers.contract.store import store_for

log = logging.getLogger("toolfleet.server")


def create_app(
    settings: Settings,
    *,
    replica_id: str | None = None,
    graphs: Sequence[ProjectGraph] | None = None,
    cors: CorsPolicy | None = None,
    model: BaseChatModel | None = None,
    drain: Drain | None = None,
) -> FastAPI:
    """The service's ASGI app.

    Args:
        settings: Where Redis, the fleet and the checkpointer are; the model; the API
            tokens (none: no authentication); the origins of browser pages allowed.
        replica_id: This replica's id (default: host, pid and a random suffix).
        graphs: A project's graphs to serve (see :mod:`orchestrator.server.projects`);
            default: the built-in agent, with the model ``settings`` names.
        cors: The project's ``http.cors`` (see :mod:`orchestrator.server.cors`).
        model: The built-in agent's chat model, already made (default: made from
            ``settings`` as the app starts).
        drain: The replica's drain time, begun when it is told to stop (default: none:
            runs still going at shutdown are handed on to other replicas at once).
    """
    auth = TokenAuth(settings.api_tokens)
    replica = replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _services(settings, replica, graphs, model, drain) as svc:
            key = await tenant_key(svc.redis, Keys(settings.key_prefix))
            auth.bind(key)
            app.state.services = svc
            registry = metrics.attach(app, svc, label_key=key).registry
            if svc.runs.webhooks is not None:
                registry.register(svc.runs.webhooks.deliveries)
            keys = Keys(settings.key_prefix)
            assert svc.store.quota is not None  # the service's stores always count
            cron_store = CronStore(svc.redis, keys, svc.store.quota, settings.cron_min_interval)
            beat = CronBeat(
                settings,
                keys,
                svc.redis,
                cron_store,
                svc.runs.start_run,
                assistants=svc.assistants,
                threads=svc.store,
            )
            app.state.cron_beat = beat
            beat.start()
            if drain is not None:
                drain.when_begun(beat.stop_soon)
            log.info(
                "toolfleet service up: replica %s, redis %s, checkpointer %s, %s",
                replica,
                mask_text(settings.own_redis_url),
                "postgres" if settings.database_url else f"sqlite {settings.checkpoint_path}",
                f"{len(settings.api_tokens)} API token(s) in {auth.tenants} tenant(s)"
                if auth.enabled
                else "NO AUTH",
            )
            log.info("toolfleet settings", extra={"toolfleet": masked_settings(settings)})
            try:
                yield
            finally:
                await beat.close()

    app = FastAPI(
        title="toolfleet",
        version=version("toolfleet"),
        summary="LangGraph Agent Protocol over an agent whose tool calls run on Celery workers",
        lifespan=lifespan,
    )
    app.state.auth = auth
    app.state.stream_quota = StreamQuota(settings.tenant_max_streams)
    app.include_router(system.router)
    app.include_router(metrics.router)  # unauthenticated, like /ok and Flower's /metrics
    for router in (
        assistants.router,
        assistant_edits.router,
        assistant_graphs.router,
        crons.router,
        thread_edits.router,
        thread_commands.router,
        thread_stream.router,
        threads.router,
        run_batches.router,
        runs.router,
        store_items.router,
    ):
        app.include_router(router)
    mcp.install(app)  # the fleet's tools and the assistants to MCP clients
    app.include_router(a2a.router)  # each assistant as an A2A agent
    # Outermost of the app's own layers: refusals here never reach routing or a body read.
    app.add_middleware(
        Guard,
        auth=auth,
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.http_body_timeout,
    )
    policy = cors_policy(settings, cors)
    if policy is not None:  # in front of the guard: a preflight carries no token
        app.add_middleware(CORSMiddleware, **middleware_options(policy))
    app.add_exception_handler(RequestRefused, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(RedisError, _redis_down)
    openapi.install(app)
    return app


@asynccontextmanager
async def _services(
    settings: Settings,
    replica: str,
    project: Sequence[ProjectGraph] | None,
    model: BaseChatModel | None = None,
    drain: Drain | None = None,
) -> AsyncIterator[Services]:
    dispatcher = dispatcher_for(settings=settings)
    # Every graph's toolfleet middleware in this process takes its runs' turns here.
    fairshare.install(call_gate(settings))
    keys = Keys(settings.key_prefix)
    url = settings.own_redis_url
    strings = pooled_client(url, settings, settings.redis_pool_size, decode_responses=True)
    raw = pooled_client(url, settings, settings.redis_pool_size)
    # Its XREAD blocks: a connection of its own (and one for a probe of a failed read).
    # Its socket timeout outlasts the read's block: an idle relay is not a lost Redis.
    relay_client = pooled_client(url, settings, 2, socket_timeout=BLOCK_MS / 1000 + 10)
    # Opening the store connects and creates its tables: blocking, off the loop. Without
    # TOOLFLEET_STORE_URL, as under `langgraph dev`, one in memory (this replica's own).
    graph_store = await asyncio.to_thread(store_for, settings) or InMemoryStore()
    async with async_checkpointer(settings) as checkpointer:
        agent: AgentProvider | None = None
        sources: list[GraphSource]
        if project is None:
            chat = model if model is not None else resolve_model(settings.model)
            agent = AgentProvider(settings, chat, checkpointer, dispatcher)
            sources = [agent]
        else:
            sources = [ProjectSource(graph, checkpointer, graph_store) for graph in project]
        graphs = Graphs(sources)
        # Every kind a tenant keeps is counted, and expires, by this one account.
        account = TenantAccount(
            strings,
            keys,
            settings.tenant_max_bytes,
            settings.thread_ttl,
            max_crons=settings.tenant_max_crons,
        )
        assistants = AssistantStore(
            strings,
            keys,
            graphs,
            ttl=account.retention,
            max_versions=settings.assistant_max_versions,
            quota=account,
        )
        store = Store(strings, keys, settings.run_ttl, account.retention, account)
        relay = EventRelay(relay_client, raw, keys, replica)
        webhooks = WebhookSender(strings, keys, settings)
        manager = RunManager(
            client=strings,
            keys=keys,
            store=store,
            events=EventLog(raw, keys, settings.run_ttl),
            relay=relay,
            assistants=assistants,
            checkpointer=checkpointer,
            max_runs=settings.max_runs,
            replica_id=replica,
            quota=tenant_quota(settings),
            webhooks=webhooks,
            drain=drain,
            max_attempts=settings.run_attempts,
            shared_checkpoints=bool(settings.database_url),
        )
        await relay.start()
        await manager.start()
        forget_late = late_records.install(dispatcher.lost, store, asyncio.get_running_loop())
        try:
            if agent is not None:
                await agent.get()
            yield Services(
                settings,
                strings,
                store,
                manager,
                graphs,
                checkpointer,
                dispatcher,
                graph_store,
                assistants,
            )
        finally:
            forget_late()
            await manager.close()
            await webhooks.close()
            await relay.close()
            fairshare.install(None)
            for client in (strings, raw, relay_client):
                await client.aclose()


def pooled_client(url: str, settings: Settings, size: int, **kwargs: Any) -> aioredis.Redis:
    """A ``redis.asyncio`` client of at most ``size`` connections, where a caller that
    finds them all busy waits (up to ``TOOLFLEET_REDIS_POOL_TIMEOUT``) instead of failing:
    a burst of requests queues for Redis, it is not answered with errors."""
    return async_redis_client(url, settings, pool_size=size, **kwargs)


async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning(
        "request %s %s: Redis unavailable (%s)",
        request.method,
        request.url.path[:256],
        type(exc).__name__,
    )
    return JSONResponse(
        {"detail": "the service's Redis is unavailable or busy; retry later"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 400)
    headers = {"Retry-After": "1"} if status == 429 else None
    return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)


async def _invalid(request: Request, exc: Exception) -> Response:
    errors: list[dict[str, Any]] = list(getattr(exc, "errors", list)())
    # One line naming every bad field, where the SDK's error message shows it.
    described = "; ".join(f"{_field(e.get('loc', ()))}: {e.get('msg')}" for e in errors)
    content = {"detail": described or "invalid request", "errors": jsonable_encoder(errors)}
    # ASCII, escapes and all: the errors repeat the input, which may hold a lone
    # surrogate (the reason for the 422) that no UTF-8 encoder writes.
    return Response(json.dumps(content, ensure_ascii=True), 422, media_type="application/json")


def _field(location: Any) -> str:
    parts = [str(p) for p in location]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    return ".".join(parts)


LOGGED_PATH_CHARS = 256
"""Characters of a request's path an access-log line keeps."""


def short_paths(record: logging.LogRecord) -> bool:
    """Log filter: cut the path of an access-log line to ``LOGGED_PATH_CHARS``.

    A client chooses its URL: a line holding all of a long one would cost every
    formatter and log pipeline in its way (and the operator's disk) as much as the
    client likes.
    """
    args = record.args
    if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
        path = args[2]
        if len(path) > LOGGED_PATH_CHARS:
            cut = f"{path[:LOGGED_PATH_CHARS]}...({len(path)} chars)"
            record.args = (*args[:2], cut, *args[3:])
    return True


def check_settings(settings: Settings, *, no_auth: bool = False) -> None:
    """Refuse settings the service must not start with, before it connects anywhere.

    Raises:
        ConfigError: no API tokens are configured and ``no_auth`` is not set, or a
            password or token is a placeholder (``change-me``).
    """
    if not settings.api_tokens and not no_auth:
        raise ConfigError(
            "no API tokens: set TOOLFLEET_API_TOKENS (comma-separated), or pass --no-auth "
            "to serve without authentication"
        )
    refuse_placeholders(settings)


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    no_auth: bool = False,
    graphs: Sequence[ProjectGraph] | None = None,
    cors: CorsPolicy | None = None,
    model: BaseChatModel | None = None,
) -> None:
    """Serve the app with uvicorn until SIGINT/SIGTERM.

    Args:
        settings: The service's settings.
        host: Address to listen on.
        port: Port to listen on.
        no_auth: Serve without API tokens.
        graphs: A project's graphs (default: the built-in agent).
        cors: The project's ``http.cors``.
        model: The built-in agent's chat model (default: made from ``settings``).

    Raises:
        ConfigError: no API tokens are configured and ``no_auth`` is not set, a
            password or token is a placeholder (``change-me``), or the address cannot
            be listened on (a port in use).
        StartupError: the app's startup failed (a checkpointer or Redis that does not
            answer); its one-line reason is in the message.
    """
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    check_settings(settings, no_auth=no_auth)
    # Bound before anything starts: a port in use is a line and an exit, not a service
    # that starts, connects everywhere, and then finds it has nowhere to listen.
    listening = listen_socket(host, port)
    for name in ("uvicorn.error", "uvicorn.access"):  # startup line and one line a request
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("uvicorn.access").addFilter(short_paths)
    pools = 2 * settings.redis_pool_size + settings.database_pool_size + 2
    connections = ConnectionGuard(
        ConnectionLimits(
            header_timeout=settings.http_header_timeout,
            max_connections=connection_cap(settings.http_max_connections, pools),
        )
    )
    drain = Drain(settings.drain_seconds)
    app = create_app(settings, graphs=graphs, cors=cors, model=model, drain=drain)
    startup = StartupFailure(app)
    config = uvicorn.Config(
        startup,
        host=host,
        port=port,
        # httptools, as the guard in front of it parses with (the same requests for both).
        http=connections.protocol_factory(HttpToolsProtocol),
        log_config=None,  # configure_logging's handler and format
    )
    server = DrainingServer(config, drain, connections)
    with listening:
        try:
            server.run(sockets=[listening])
        except SystemExit:  # uvicorn's exit of a failed startup
            if startup.reason is None:
                raise
    if startup.reason is not None:
        raise StartupError(f"the service could not start: {startup.reason}")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose SIGTERM (or SIGINT) also begins the replica's drain: it
    takes no more runs and no more takeovers from then on. Its shutdown stops listening,
    answers the requests already on their way on connections it accepted, and lets the
    streams and waits open on it go on for what is left of the drain time."""

    def __init__(self, config: uvicorn.Config, drain: Drain, connections: ConnectionGuard) -> None:
        super().__init__(config)
        self.drain = drain
        self.connections = connections

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Begin the drain, then uvicorn's own shutdown."""
        self.drain.begin()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop listening (a new connection is refused: a load balancer sends it to
        another replica), let the requests of connections accepted before come in, then
        uvicorn's shutdown, its grace what is left of the drain time."""
        for server in self.servers:
            server.close()
        limits = self.connections.limits
        await self.connections.first_requests(min(limits.header_timeout, self.drain.left()))
        # Open streams may last the drain time; then they are cut (their clients reconnect
        # to another replica) and the runs still going are handed on.
        self.config.timeout_graceful_shutdown = math.ceil(self.drain.left())
        await super().shutdown(sockets)


class StartupFailure:
    """An ASGI app whose failed startup is kept as one line (``reason``), not logged
    as the traceback Starlette sends with it: ``serve`` then says it and exits."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.reason: str | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def quiet(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                lines = [line for line in str(message.get("message", "")).splitlines() if line]
                self.reason = mask_text(lines[-1]) if lines else "its startup failed"
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, quiet)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``SO_REUSEADDR``, as uvicorn binds).

    Raises:
        ConfigError: the address cannot be listened on (in use, not this host's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from None
