"""The sessions of one worker process with its MCP servers.

Each process of a worker holds one session per server, owned by a task on an event loop
of its own (a daemon thread), so the pool's threads call synchronously and many calls
share one session. A session starts at its first call (or when a pool process starts, see
:mod:`tool_workers.mcp.lifecycle`), never in a parent that forks: a stdio server's pipes
and an HTTP session would be shared by every child. A server that exits, or a call
stuck in it past the call's time limit, ends the session; the next call starts a new
one. The owner task enters and leaves the transport's context itself, as anyio requires.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CONNECTION_CLOSED, CallToolResult, PaginatedRequestParams, Tool

from tool_workers.compat.mcp import McpError, error_data, streamable_http, wire
from tool_workers.mcp.servers import ServerConfig

log = logging.getLogger("toolfleet.mcp")

ProgressFn = Callable[[float, float | None, str | None], None]
"""Called with an MCP progress notification's ``progress``, ``total`` and ``message``."""

START_TIMEOUT = 30.0
"""Seconds a server has to start and answer ``initialize``."""


class ServerExited(Exception):
    """Raised when the session with an MCP server ended while a call was in it."""


@asynccontextmanager
async def open_session(config: ServerConfig) -> AsyncIterator[ClientSession]:
    """An initialised session with ``config``'s server, closed (its process stopped) on exit."""
    async with AsyncExitStack() as stack:
        if config.command is not None:
            params = StdioServerParameters(
                command=config.command, args=list(config.args), env=config.env, cwd=config.cwd
            )
            read, write = await stack.enter_async_context(stdio_client(params))
        else:
            assert config.url is not None
            read, write = await stack.enter_async_context(
                streamable_http(config.url, config.headers, timeout=30.0, read=300.0)
            )
        session = await stack.enter_async_context(ClientSession(read, write))
        await asyncio.wait_for(session.initialize(), START_TIMEOUT)
        yield session


async def list_tools(config: ServerConfig) -> list[Tool]:
    """Every tool ``config``'s server offers (all pages), from a session of its own."""
    async with open_session(config) as session:
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            params = PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = wire(page).get("nextCursor")
            if not cursor:
                return tools


class _Connection:
    """One server's session on the process's MCP loop (used on that loop only)."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._current: _Generation | None = None

    async def session(self) -> tuple[ClientSession, set[asyncio.Task[Any]]]:
        """The live session (started if there is none) and the set its calls join."""
        current = self._current
        if current is None or current.owner.done():
            current = self._current = _Generation(self.config)
        return await asyncio.shield(current.ready), current.calls

    async def call(
        self, tool: str, args: dict[str, Any], on_progress: ProgressFn | None
    ) -> CallToolResult:
        session, calls = await self.session()

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            if on_progress is not None:
                on_progress(progress, total, message)

        task = asyncio.create_task(
            session.call_tool(tool, args, progress_callback=relay if on_progress else None)
        )
        calls.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise ServerExited(
                    f"MCP server {self.config.name!r} exited during the call"
                ) from None
            raise
        finally:
            calls.discard(task)
            task.cancel()

    async def stop(self) -> None:
        """End the current session (a later call starts a new one)."""
        current, self._current = self._current, None
        if current is not None:
            await current.stop()


class _Generation:
    """One run of a server: the task that owns its session, and the calls in it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.calls: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.owner = asyncio.create_task(self._own())

    async def _own(self) -> None:
        try:
            async with open_session(self.config) as session:
                log.info("MCP server %s started", self.config.name)
                self.ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(
                    ServerExited(f"MCP server {self.config.name!r} did not start: {exc!r}")
                )
            elif not self._stop.is_set():
                log.warning("MCP server %s exited: %r", self.config.name, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            # A call in a session that ended would wait for an answer that never comes.
            for call in list(self.calls):
                call.cancel(f"MCP server {self.config.name!r} exited")

    async def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.owner), 10.0)
        if not self.owner.done():
            self.owner.cancel()
            with contextlib.suppress(BaseException):
                await self.owner


class Connections:
    """The sessions of this process with its MCP servers; thread-safe.

    Args:
        servers: The servers, by name.
    """

    def __init__(self, servers: Mapping[str, ServerConfig]) -> None:
        self._servers = dict(servers)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[str, _Connection] = {}

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="toolfleet-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                self._connections = {n: _Connection(c) for n, c in self._servers.items()}
            return self._loop

    def start(self) -> None:
        """Start every server's session now (a pool process that just started)."""
        loop = self._running_loop()
        for connection in self._connections.values():
            asyncio.run_coroutine_threadsafe(_start_quietly(connection), loop)

    def call(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        *,
        timeout: float | None = None,
        progress: ProgressFn | None = None,
    ) -> CallToolResult:
        """Call ``tool`` on ``server`` and wait for its result.

        A call that does not finish in ``timeout`` seconds, or is interrupted (the pool's
        soft time limit), is cancelled and the server's session restarted: a stuck server
        would hold every later call too.

        Raises:
            TimeoutError: no result in ``timeout`` seconds.
            ServerExited: the server exited (or did not start) during the call.
            McpError: the server answered the call with a JSON-RPC error.
        """
        loop = self._running_loop()
        connection = self._connections[server]
        future = asyncio.run_coroutine_threadsafe(connection.call(tool, args, progress), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"MCP tool {tool!r} of server {server!r} took over {timeout} s"
            ) from None
        except ServerExited:
            raise
        except McpError as exc:
            if error_data(exc)[0] != CONNECTION_CLOSED:
                raise
            self._restart(connection)
            raise ServerExited(f"MCP server {server!r} exited during the call") from exc
        finally:
            if not future.done():
                # Timed out, or interrupted here (the soft time limit): the call is stuck.
                # Restarted first: the pool's soft time limit, due at about the same time
                # as ``timeout``, may interrupt what comes after.
                self._restart(connection)
                future.cancel()
                log.warning("restarted MCP server %s: a call was stuck in it", server)

    def _restart(self, connection: _Connection) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(connection.stop(), self._loop)

    def close(self) -> None:
        """Stop every server and the loop (the worker process ends)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        stops = [c.stop() for c in self._connections.values()]

        async def stop_all() -> None:
            await asyncio.gather(*stops, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(15.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)


async def _start_quietly(connection: _Connection) -> None:
    try:
        await connection.session()
    except Exception as exc:  # the first call reports it to the model
        log.warning("MCP server %s did not start: %r", connection.config.name, exc)
