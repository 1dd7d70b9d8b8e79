"""``toolfleet demo``: a whole fleet on this machine, one agent run, every process stopped.

Starts an embedded Redis-compatible server and two kinds of tool worker with the stock
Celery CLI, all on the queue ``tools``: two workers of the built-in toolset and one of the
sample project's own tools (``stock_level``, importing the project's code). Runs an agent
whose tool calls fan out across them; prints, for each call, which worker process ran it
(each call on a worker of its kind) and for how long, then the answer.

Ctrl-C at any moment stops everything the demo started within a few seconds: the server
and the workers run in sessions of their own, so the terminal's SIGINT reaches this process
alone, which stops them in order (workers, then server), each wait bounded. The agent runs
in a thread of its own: its waits on calls in flight are abandoned, not waited out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, InputAgentState
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from rich.console import Console
from rich.live import Live
from rich.markup import escape

from orchestrator.agent import chat_model
from orchestrator.cli.progress import InFlight, cli_console
from orchestrator.dispatch.fleet import close_all, dispatcher_for
from orchestrator.local import EmbeddedRedis, WorkerProcess
from orchestrator.middleware import CeleryToolMiddleware
from orchestrator.sample import (
    DEFAULT_PROMPT,
    PROJECT_TOOLS,
    PROJECT_TOOLS_MODULE,
    scripted_model,
    seed_workspace,
)
from orchestrator.scripted import SCRIPTED
from orchestrator.tools import discover_tools
from tool_workers.contract.errors import ToolfleetError
from tool_workers.contract.settings import DEFAULT_CONFIG_PATH, Settings

# Seconds a worker gets to finish its calls: a normal end lets them finish; after Ctrl-C
# the user wants out, and the calls' results have no one left to read them.
STOP_GRACE = 10.0
FAN_OUT = 32
"""Tool calls of one model turn sent at once."""
INTERRUPT_GRACE = 2.0


def run_demo(
    *,
    model: str | None = None,
    prompt: str = DEFAULT_PROMPT,
    workers: int = 2,
    concurrency: int = 2,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the demo end to end and stop everything it started.

    Args:
        model: ``provider:name`` for ``init_chat_model``; the scripted model if ``None``.
        prompt: What the user asks.
        workers: Worker processes to start.
        concurrency: Pool processes per worker.
        console: Where to print (a new rich console if omitted).

    Returns:
        The final agent state.
    """
    console = console or cli_console()
    with tempfile.TemporaryDirectory(prefix="toolfleet-demo-") as tmp:
        root = Path(tmp)
        workspace = root / "workspace"
        # The model first: a spec that leads nowhere is said before anything starts.
        chat = chat_for(model, workspace, console, project_tools=True)
        seed_workspace(workspace)
        server = EmbeddedRedis(root / "redis")
        fleet: list[WorkerProcess] = []
        interrupted = False
        try:
            server.start()
            settings = Settings(
                broker_url=server.url,
                workspace_root=workspace,
                config=DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None,
                registry_refresh=2.0,
            )
            console.print(f"[bold]embedded server[/] {server.url}")
            t0 = time.perf_counter()
            # Two kinds of worker, as a team runs them: the built-in toolset, and the
            # project's own tools (importing the project's code), both on the queue
            # "tools": each call is routed by tool to a worker of the kind that serves it.
            project_tools = root / "project-tools"
            project_tools.mkdir()
            (project_tools / f"{PROJECT_TOOLS_MODULE}.py").write_text(PROJECT_TOOLS)
            for i in range(workers):
                fleet.append(
                    WorkerProcess(
                        settings,
                        name=f"builtins-{i + 1}",
                        pool="prefork",
                        concurrency=concurrency,
                        queues=("tools", "sandbox"),
                        log_file=root / f"builtins-{i + 1}.log",
                    )
                )
            path = os.pathsep.join(
                p for p in (str(project_tools), str(workspace), os.environ.get("PYTHONPATH")) if p
            )
            fleet.append(
                WorkerProcess(
                    settings,
                    name="inventory-1",
                    pool="prefork",
                    concurrency=1,
                    queues=("tools",),
                    log_file=root / "inventory-1.log",
                    extra_env={"TOOLFLEET_TOOL_MODULES": PROJECT_TOOLS_MODULE, "PYTHONPATH": path},
                )
            )
            for worker in fleet:
                worker.start()
            for worker in fleet:
                worker.wait_ready()
                console.print(f"[bold]worker[/] {worker.hostname} (pid {worker.pid}) ready")
            console.print(f"fleet up in {time.perf_counter() - t0:.1f} s\n")
            return _in_thread(
                lambda: run_agent(
                    settings,
                    model,
                    prompt,
                    console=console,
                    workspace=workspace,
                    wait_for_tools=["stock_level"],
                    chat=chat,
                )
            )
        except KeyboardInterrupt:
            interrupted = True
            console.print("\n[yellow]interrupted: stopping the workers and the embedded server[/]")
            # The abandoned agent thread's waits now fail against a fleet being stopped;
            # their warnings would only bury the line above.
            logging.getLogger("toolfleet").setLevel(logging.CRITICAL)
            raise
        finally:
            with _sigint_ignored():
                close_all()
                for worker in fleet:
                    worker.stop(grace=INTERRUPT_GRACE if interrupted else STOP_GRACE)
                server.stop()
            console.print("\nstopped the workers and the embedded server")


def _in_thread(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``fn`` in a daemon thread; Ctrl-C interrupts the wait for it here at once.

    In the main thread, a KeyboardInterrupt in the middle of an agent step would wait for
    the step's tool threads, and they for their calls, before it surfaced.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the main thread, which reports it
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="toolfleet-demo-agent", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if "error" in outcome:
        raise outcome["error"]
    return cast(dict[str, Any], outcome["value"])


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """A second Ctrl-C must not cut the (bounded) stopping short and leave processes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class NoWorkers(ToolfleetError):
    """No worker published a tool within the wait."""


class ModelFailed(ToolfleetError):
    """The chat model's call failed (no network, no key, a provider's error)."""


class ModelErrors(AgentMiddleware):
    """A model call that fails ends the run with one line naming the model and the
    reason (:class:`ModelFailed`), not the provider client's traceback."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.spec = spec

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Call the model; its failure becomes :class:`ModelFailed`."""
        try:
            return handler(request)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            raise ModelFailed(f"the model {self.spec} failed: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def chat_for(
    spec: str | None, workspace: Path | None, console: Console, project_tools: bool = False
) -> BaseChatModel:
    """The chat model a spec names, said on ``console`` (the scripted one, with a note,
    when none is named).

    Raises:
        ConfigError: the spec leads to no chat model.
    """
    if spec is None or spec == SCRIPTED:
        console.print(
            "[yellow]No --model given: using toolfleet's deterministic scripted model "
            "(no API key needed). Pass --model provider:name for a real one.[/]\n"
        )
        return scripted_model(workspace, project_tools=project_tools)
    console.print(f"model: {escape(spec)}\n")
    return chat_model(spec)


def run_agent(
    settings: Settings,
    model_spec: str | None,
    prompt: str,
    *,
    console: Console,
    workspace: Path | None = None,
    wait_for_workers: float = 10.0,
    thread_id: str | None = None,
    wait_for_tools: Sequence[str] = (),
    chat: BaseChatModel | None = None,
) -> dict[str, Any]:
    """Run one agent turn against the fleet ``settings`` point at, printing each step.

    Args:
        settings: Where the broker and the workers are.
        model_spec: ``provider:name``; the scripted model if ``None``.
        prompt: What the user asks.
        console: Where to print.
        workspace: The workers' workspace path, when it is on this machine.
        wait_for_workers: Seconds to wait for a worker to publish its tools.
        thread_id: Conversation thread id (a fresh one if omitted).
        wait_for_tools: Tools to wait for (each served by a worker of some kind).
        chat: The chat model, already built (else built from ``model_spec``).

    Returns:
        The final agent state.
    """
    # The model first: a spec that leads nowhere is said at once, not after the wait.
    if chat is None:
        chat = chat_for(model_spec, workspace, console, project_tools=False)
    dispatcher = dispatcher_for(settings=settings)
    deadline = time.monotonic() + wait_for_workers
    served = dispatcher.served_tools()
    if (not served or any(t not in served for t in wait_for_tools)) and wait_for_workers > 2:
        waiting = ", ".join(wait_for_tools) or "their tools"
        console.print(
            f"[dim]waiting up to {wait_for_workers:g} s for workers to publish {escape(waiting)}[/]"
        )
    while any(t not in served for t in wait_for_tools) and time.monotonic() < deadline:
        time.sleep(0.2)
        served = dispatcher.served_tools(fresh=True)
    tools = discover_tools(dispatcher=dispatcher, wait=max(deadline - time.monotonic(), 0.0))
    if not tools:
        raise NoWorkers(f"no worker published any tool within {wait_for_workers:g} s")
    agent = create_agent(
        chat,
        tools,
        system_prompt="You are a careful engineer. Use the tools; call independent ones together.",
        middleware=[
            ModelErrors(model_spec or SCRIPTED),
            CeleryToolMiddleware(dispatcher=dispatcher),
        ],
    )
    console.print(f"[bold cyan]user[/] {escape(prompt)}\n")
    state: dict[str, Any] = {}
    t0 = time.perf_counter()
    config: RunnableConfig = {
        "configurable": {"thread_id": thread_id or str(uuid.uuid4())},
        # Every call of a fan-out at once (LangGraph's sync pool runs 6 by default).
        "max_concurrency": FAN_OUT,
    }
    # A (role, text) pair is a message to LangGraph; InputAgentState's type leaves it out.
    inputs = cast(InputAgentState, {"messages": [("user", prompt)]})
    # With a list of stream modes, it yields (mode, chunk) pairs (its type says otherwise).
    parts = cast(
        Iterator[tuple[str, Any]],
        agent.stream(inputs, config, stream_mode=["updates", "values"]),
    )
    in_flight = InFlight()
    # Transient: on a terminal, the calls still running and for how long, redrawn under
    # the finished lines; on a pipe nothing (the finished lines say it all).
    with Live(in_flight, console=console, transient=True, refresh_per_second=4):
        for mode, chunk in parts:
            if mode == "values":
                state = chunk
                continue
            for update in chunk.values():
                for message in (update or {}).get("messages", []):
                    _show(message, console)
                    _track(message, in_flight)
    console.print(f"\nrun took {time.perf_counter() - t0:.2f} s")
    return state


def _track(message: BaseMessage, in_flight: InFlight) -> None:
    if isinstance(message, AIMessage):
        for call in message.tool_calls:
            in_flight.start(call["id"] or call["name"], call["name"])
    elif isinstance(message, ToolMessage):
        in_flight.finish(message.tool_call_id)


def _text(content: Any) -> str:
    """A message's content as text (content blocks: their text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(block.get("text", "")) if isinstance(block, dict) else str(block)
            for block in content
        )
    return str(content)


def _show(message: BaseMessage, console: Console) -> None:
    if isinstance(message, AIMessage):
        if message.content:
            console.print(f"[bold green]agent[/] {escape(_text(message.content))}")
        for call in message.tool_calls:
            args = json.dumps(call["args"])
            console.print(
                f"  -> {escape(call['name'])}({escape(args)})", no_wrap=True, overflow="ellipsis"
            )
    elif isinstance(message, ToolMessage):
        meta = message.response_metadata.get("toolfleet", {})
        text = " ".join(str(message.content).split())
        status = "[green]ok[/]   " if message.status == "success" else "[red]error[/]"
        name = escape(f"{message.name:<10}")
        worker = escape(f"{meta.get('worker', '?'):<18}")
        pid = escape(f"{meta.get('pid', '?'):<7}")
        console.print(
            f"  <- {name} [magenta]{worker}[/] "
            f"pid {pid} {meta.get('duration', 0) * 1000:6.0f} ms  {status} "
            f"[dim]{escape(text)}[/]",
            no_wrap=True,
            overflow="ellipsis",
            markup=True,
        )
