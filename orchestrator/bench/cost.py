"""Scenario g: what one tool call costs, side by side with a bare Celery app's call.

Four contenders on one Redis server, in one run, each with workers of the same pool
type and size:

* ``celery_raw``: the bare app of :mod:`orchestrator.bench.raw_celery`, served by a stock
  ``celery -A orchestrator.bench.raw_celery worker``. K threads, each a "run" of T turns;
  a turn sends W ``noop`` tasks, then waits for each result (an agent making W parallel
  tool calls per turn, without an agent).
* ``toolfleet_async``: K ``create_agent`` runs with
  :class:`~orchestrator.middleware.CeleryToolMiddleware` gathered in one event loop; a
  scripted model calls ``echo`` W times in parallel per turn for T turns, then answers.
* ``toolfleet_sync``: the same agent, ``invoke`` on K threads, ``max_concurrency`` 8.
* ``diy_agent``: what a user would write instead of toolfleet: the same ``create_agent``
  agent and scripted model as ``toolfleet_async``, gathered on the same event loop, but
  its ``echo`` is a plain async LangChain tool (same schema) that sends the bare app's
  ``noop`` task and awaits its result on a thread pool of its own
  (:func:`diy_echo_tool`); no toolfleet code in its path. The bare app's workers run
  its calls.

``toolfleet_async`` and ``diy_agent`` are also measured at a second, smaller
concurrency (``runs_small``, K = 10 by default): each level's toolfleet throughput is
divided by the do-it-yourself agent's of the same level (``levels``).

Each contender is measured in windows of its own, taking turns in rounds (the order
rotating, every window of both levels in every round) so drift in the machine's other
load falls on all alike. Around each window the server's ``INFO commandstats`` (commands
run inside Lua scripts count, as the server counts them) and ``INFO stats`` (bytes in and
out) are read, and the CPU seconds of this process, of the contender's own workers (main
process and pool children) and of the server. Only the contender's workers have calls to
run; the other fleet is up and idle.
The counters and CPU keep running for :data:`SETTLE` seconds after a window's last result
(its calls per second do not). Nothing is subtracted: a window of the same fleets with no
calls at all is measured and reported beside them, per second, for the reader to judge.

The agent contenders' orchestrator CPU includes the agent loop itself (LangGraph and
the scripted model), which the raw client has none of; scenario c's local ``ToolNode``
contender measures that loop alone (this scenario does not: the do-it-yourself agent's
orchestrator CPU is that loop, a LangChain tool run and a thread pool's hop together).
The counters are the whole server's: on a server others use too (``use_settings``) their
traffic is in them, and a server on another host counts no CPU.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import redis
from langchain.agents import create_agent
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel, Field

from orchestrator.bench.agents import (
    PAYLOAD,
    RUN_CONFIG,
    Runner,
    check_results,
    fleet_agent,
    local_agent,
    tool_messages,
    turns_model,
)
from orchestrator.bench.fleet import BenchFleet
from orchestrator.bench.measure import SETTLE, cpu_seconds
from orchestrator.bench.raw_celery import NOOP, create_raw_app
from orchestrator.bench.raw_worker import RawCeleryWorker, raw_worker_for
from orchestrator.local import WorkerProcess
from tool_workers.contract.settings import Settings

AGENT_LOOP = "agent_loop"
"""The same agent with its tools local (a ``ToolNode``): the agent loop alone, which
toolfleet's runs and raw Celery's calls together are measured against."""
CONTENDERS = ("celery_raw", "toolfleet_async", "toolfleet_sync", AGENT_LOOP)
"""The contenders of ``contenders`` in the report, measured at K (``runs``) only."""
DIY = "diy_agent"
LEVEL_CONTENDERS = ("toolfleet_async", DIY)
"""The contenders measured at each concurrency level (``levels`` in the report)."""
CPU_PARTS = ("orchestrator", "workers", "server")
PROCESS_GROUPS = {
    "celery_raw": ("raw_workers", "raw_main"),
    "toolfleet_async": ("toolfleet_workers", "toolfleet_main"),
    "toolfleet_sync": ("toolfleet_workers", "toolfleet_main"),
    DIY: ("raw_workers", "raw_main"),
    AGENT_LOOP: ("", ""),
}
"""Whose workers ran each contender's calls (their CPU is the contender's; the agent
loop alone has none), and those workers' main processes (their pool processes' CPU is
what the workers' leaves over)."""

ECHO_TEXT = "hi"
NOOP_ANSWER = {"text": ECHO_TEXT}
"""What the bare app's ``noop`` returns for :data:`ECHO_TEXT`."""
SYNC_MAX_CONCURRENCY = 8
WINDOW_TIMEOUT = 240.0
CALL_TIMEOUT = 120.0


# --- Pure helpers: counters and normalisation -------------------------------------------


def command_calls(info: Mapping[str, Any]) -> dict[str, int]:
    """Calls per command from a parsed ``INFO commandstats`` (``cmdstat_<name>`` entries)."""
    prefix = "cmdstat_"
    return {
        key[len(prefix) :]: int(value["calls"])
        for key, value in info.items()
        if key.startswith(prefix) and isinstance(value, Mapping)
    }


def net_bytes(info: Mapping[str, Any]) -> int:
    """Bytes in and out of the server so far, from a parsed ``INFO stats``."""
    return int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])


def diff_counts(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """``after - before`` per name, leaving out names that did not grow.

    A command first run in the window is absent from ``before`` and counts from 0.
    """
    out = {}
    for name, count in after.items():
        grown = count - before.get(name, 0)
        if grown > 0:
            out[name] = grown
    return out


def per_unit(counts: Mapping[str, float], units: float, digits: int = 3) -> dict[str, float]:
    """``counts`` divided by ``units``, largest first, rounded (zero units: an empty dict)."""
    if units <= 0:
        return {}
    scaled = {name: round(count / units, digits) for name, count in counts.items()}
    return dict(sorted(scaled.items(), key=lambda item: (-item[1], item[0])))


def top(counts: Mapping[str, float], n: int) -> dict[str, float]:
    """The ``n`` largest entries of ``counts``, largest first."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n])


@dataclass
class Usage:
    """What a window used: calls completed, wall seconds of the calls, Redis commands by
    name, bytes on the wire, CPU seconds by process group."""

    calls: int = 0
    seconds: float = 0.0
    commands: dict[str, int] = field(default_factory=dict)
    net_bytes: int = 0
    cpu: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: Usage) -> Usage:
        commands = dict(self.commands)
        for name, count in other.commands.items():
            commands[name] = commands.get(name, 0) + count
        cpu = dict(self.cpu)
        for group, seconds in other.cpu.items():
            cpu[group] = cpu.get(group, 0.0) + seconds
        return Usage(
            calls=self.calls + other.calls,
            seconds=self.seconds + other.seconds,
            commands=commands,
            net_bytes=self.net_bytes + other.net_bytes,
            cpu=cpu,
        )


def per_call(usage: Usage, workers: str, main: str | None = None) -> dict[str, Any]:
    """A contender's usage per call; ``workers`` names the CPU group of its workers, and
    ``main`` that of their main processes (then the workers' CPU is also given split into
    the main processes' and the pool processes').

    Raises:
        ValueError: the usage has no calls.
    """
    calls = usage.calls
    if calls <= 0:
        raise ValueError("no calls were measured")
    cpu_ms = {
        "orchestrator": usage.cpu.get("orchestrator", 0.0) * 1000 / calls,
        "workers": usage.cpu.get(workers, 0.0) * 1000 / calls,
        "server": usage.cpu.get("server", 0.0) * 1000 / calls,
    }
    cpu_ms["total"] = sum(cpu_ms.values())
    # /proc counts CPU in ticks (10 ms): more digits would be noise from the division.
    cpu_ms = {part: round(value, 4) for part, value in cpu_ms.items()}
    split: dict[str, Any] = {}
    if main is not None and main in usage.cpu:
        main_ms = round(usage.cpu[main] * 1000 / calls, 4)
        split["worker_processes_ms_per_call"] = {
            "main": main_ms,
            "pool": round(max(cpu_ms["workers"] - main_ms, 0.0), 4),
        }
    return {
        "calls": calls,
        "seconds": usage.seconds,
        "calls_per_second": calls / usage.seconds if usage.seconds > 0 else 0.0,
        "commands_per_call": sum(usage.commands.values()) / calls,
        "commands_by_name_per_call": per_unit(usage.commands, calls),
        "bytes_per_call": usage.net_bytes / calls,
        "cpu_ms_per_call": cpu_ms,
        **split,
    }


def per_second(usage: Usage) -> dict[str, Any]:
    """A window's usage per second of it (the idle background)."""
    seconds = usage.seconds
    if seconds <= 0:
        raise ValueError("the window has no length")
    return {
        "seconds": seconds,
        "commands_per_second": sum(usage.commands.values()) / seconds,
        "commands_by_name_per_second": per_unit(usage.commands, seconds),
        "bytes_per_second": usage.net_bytes / seconds,
        "cpu_ms_per_second": {
            group: value * 1000 / seconds for group, value in sorted(usage.cpu.items())
        },
    }


def ratio(value: float, base: float) -> float | None:
    """``value / base``; None where ``base`` is 0 (a ratio to nothing says nothing)."""
    return value / base if base else None


def versus(contender: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """A contender's per-call numbers against raw Celery's (both from :func:`per_call`)."""
    cpu, raw_cpu = contender["cpu_ms_per_call"], raw["cpu_ms_per_call"]
    return {
        "commands_difference_per_call": contender["commands_per_call"] - raw["commands_per_call"],
        "bytes_ratio": ratio(contender["bytes_per_call"], raw["bytes_per_call"]),
        "throughput_ratio": ratio(contender["calls_per_second"], raw["calls_per_second"]),
        "cpu_ratio": {part: ratio(cpu[part], raw_cpu[part]) for part in (*CPU_PARTS, "total")},
    }


Window = tuple[str, int]
"""A contender's window: its name and its concurrent runs."""


def windows(runs: int, runs_small: int) -> list[Window]:
    """Every window of a round: each contender at ``runs``, and those of
    :data:`LEVEL_CONTENDERS` again at ``runs_small`` (unless it is 0 or ``runs``)."""
    out = [(name, runs) for name in (*CONTENDERS, DIY)]
    if 0 < runs_small != runs:
        out += [(name, runs_small) for name in LEVEL_CONTENDERS]
    return out


def rotated(items: Sequence[Window], round_: int) -> list[Window]:
    """``items`` starting at the ``round_``-th (modulo their number): no window always
    follows the same one."""
    shift = round_ % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def level(runs: int, toolfleet: Mapping[str, Any], diy: Mapping[str, Any]) -> dict[str, Any]:
    """One concurrency level: toolfleet's and the do-it-yourself agent's numbers (both from
    :func:`per_call`) and toolfleet's against the do-it-yourself agent's."""
    return {
        "runs": runs,
        "contenders": {"toolfleet_async": dict(toolfleet), DIY: dict(diy)},
        "versus_diy": versus(toolfleet, diy),
    }


def check_answers(state: dict[str, Any], expected: int, answer: Mapping[str, Any]) -> None:
    """:func:`~orchestrator.bench.agents.check_results`, and every ToolMessage's content is
    ``answer`` (a tool's dict result is its JSON in the message).

    Raises:
        RuntimeError: a run's results are missing, failed or wrong.
    """
    check_results(state, expected)
    for message in tool_messages(state):
        content = message.content
        try:
            got = json.loads(content) if isinstance(content, str) else content
        except ValueError:
            got = content
        if got != answer:
            raise RuntimeError(f"benchmark run expected {dict(answer)!r}, got: {content!r}")


# --- The do-it-yourself agent -----------------------------------------------------------


class EchoArgs(BaseModel):
    """The arguments of toolfleet's ``echo`` (the workers' built-in tool)."""

    text: str = Field(description="Text to return unchanged.")


def diy_echo_tool(app: Any, pool: ThreadPoolExecutor, timeout: float = CALL_TIMEOUT) -> BaseTool:
    """A plain LangChain ``echo`` tool over a bare Celery app: it sends the app's
    :data:`~orchestrator.bench.raw_celery.NOOP` task and awaits its result on ``pool``
    (``AsyncResult.get`` blocks), returning what the task returned.

    Args:
        app: The bare app (:func:`~orchestrator.bench.raw_celery.create_raw_app`).
        pool: The tool's own threads for the waits.
        timeout: Seconds a call may wait for its result.
    """

    async def echo(text: str) -> Any:
        result = app.send_task(NOOP, args=(text,))
        return await asyncio.wrap_future(pool.submit(result.get, timeout=timeout))

    return StructuredTool.from_function(
        coroutine=echo,
        name="echo",
        description="Return the given text unchanged. For latency benchmarks and tests.",
        args_schema=EchoArgs,
    )


def diy_agent(model: Any, tool: BaseTool) -> Any:
    """``create_agent`` with ``tool`` and no middleware: what a user writes without
    toolfleet."""
    return create_agent(model, [tool])


# --- Measuring ----------------------------------------------------------------------------


class Meter:
    """Reads the server's counters and the processes' CPU around a window of work.

    Args:
        url: The server's URL.
        groups: CPU groups besides this process and the server: name -> pids (asked at
            each reading, as pool children may change).
        server_cpu: CPU seconds of the server so far (0 when it is not on this host).
    """

    def __init__(
        self,
        url: str,
        groups: Mapping[str, Callable[[], Sequence[int]]],
        server_cpu: Callable[[], float],
    ) -> None:
        self.client = redis.Redis.from_url(url)
        self.groups = dict(groups)
        self.server_cpu = server_cpu

    def _counters(self) -> tuple[dict[str, int], int]:
        # One INFO of both sections: one round trip, one command, at each end.
        info = self.client.info("stats", "commandstats")
        return command_calls(info), net_bytes(info)

    def _cpu(self) -> dict[str, float]:
        out = {"orchestrator": cpu_seconds(os.getpid()), "server": self.server_cpu()}
        for name, pids in self.groups.items():
            out[name] = sum(cpu_seconds(pid) for pid in pids())
        return out

    def measure(self, work: Callable[[], int], settle: float = SETTLE) -> Usage:
        """Run ``work`` (it returns the calls it completed) and return what it used.

        Its wall time is the calls' alone; the counters and CPU also take in ``settle``
        seconds after it.
        """
        commands0, bytes0 = self._counters()
        cpu0 = self._cpu()
        t0 = time.perf_counter()
        calls = work()
        seconds = time.perf_counter() - t0
        time.sleep(settle)
        cpu1 = self._cpu()
        commands1, bytes1 = self._counters()
        return Usage(
            calls=calls,
            seconds=seconds,
            commands=diff_counts(commands1, commands0),
            net_bytes=bytes1 - bytes0,
            cpu={group: cpu1[group] - cpu0[group] for group in cpu1},
        )

    def idle(self, seconds: float) -> Usage:
        """What ``seconds`` of no calls at all use."""

        def wait() -> int:
            time.sleep(seconds)
            return 0

        return self.measure(wait, settle=0.0)

    def close(self) -> None:
        """Close the connection."""
        self.client.close()


class Gang:
    """``size`` daemon threads that live across windows; each runs one job per round.

    The same threads in every window: state a client keeps per thread is set up in the
    warm-up, not in each measured window. Daemon threads, so a scenario abandoned on its
    time bound does not keep the process from exiting.
    """

    def __init__(self, size: int) -> None:
        self._inboxes: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(size)
        ]
        self._done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        for index, inbox in enumerate(self._inboxes):
            threading.Thread(
                target=self._serve, args=(inbox,), name=f"bench-cost-{index}", daemon=True
            ).start()

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := inbox.get()) is not None:
            try:
                job()
            except BaseException as exc:
                self._done.put(exc)
            else:
                self._done.put(None)

    def run(self, job: Callable[[], None], timeout: float = WINDOW_TIMEOUT) -> None:
        """Run ``job`` once on every thread at the same time; raise the first failure.

        Raises:
            TimeoutError: not every thread finished within ``timeout`` seconds.
            RuntimeError: a job raised (chained to the first exception).
        """
        for inbox in self._inboxes:
            inbox.put(job)
        deadline = time.monotonic() + timeout
        errors = []
        for _ in self._inboxes:
            try:
                outcome = self._done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"runs not done within {timeout:g} s") from None
            if outcome is not None:
                errors.append(outcome)
        if errors:
            raise RuntimeError(f"{len(errors)} run(s) failed: {errors[0]!r}") from errors[0]

    def close(self) -> None:
        """Let every thread end after its current job."""
        for inbox in self._inboxes:
            inbox.put(None)


def _raw_run(app: Any, turns: int, width: int) -> None:
    for _ in range(turns):
        results = [app.send_task(NOOP, args=(ECHO_TEXT,)) for _ in range(width)]
        for result in results:
            value = result.get(timeout=CALL_TIMEOUT)
            if value != NOOP_ANSWER:
                raise RuntimeError(f"raw Celery noop returned {value!r}")


def run_cost(
    fleet: BenchFleet,
    settings: Settings,
    *,
    runs: int = 50,
    runs_small: int = 10,
    turns: int = 5,
    width: int = 4,
    rounds: int = 3,
    pool: str = "prefork",
    concurrency: int = 4,
    idle_seconds: float = 2.0,
    settle: float = SETTLE,
    workers: Sequence[WorkerProcess] = (),
    raw_worker: RawCeleryWorker | None = None,
) -> dict[str, Any]:
    """Measure a call's cost for each contender with ``runs`` concurrent runs, and
    toolfleet's against the do-it-yourself agent's with ``runs_small`` too.

    Args:
        fleet: The run's fleet (its server; it starts and stops toolfleet's workers).
        settings: The scenario's settings (its own namespace).
        runs: Concurrent runs (K).
        runs_small: The second level's concurrent runs, of ``toolfleet_async`` and the
            do-it-yourself agent only (0: none).
        turns: Turns per run.
        width: Parallel calls per turn.
        rounds: Windows per contender and level.
        pool: Pool type of both fleets' workers.
        concurrency: Pool size of both fleets' workers.
        idle_seconds: Length of the window with no calls.
        settle: Seconds the counters keep running after each window (:data:`SETTLE`).
        workers: Running toolfleet workers of ``settings`` to measure (of ``pool`` and
            ``concurrency``; left running); without them one is started and stopped.
        raw_worker: The bare app's worker (:func:`raw_worker_for`), already started so
            that it boots while something else runs (whoever started it stops it).
            Without it one is started and stopped.

    Raises:
        RuntimeError: the server is not Redis (INFO and the bare app need it), the results
            go to another server, a worker did not start, or a run got a wrong result.
    """
    url = fleet.broker_url
    own_workers: list[WorkerProcess] = []
    if raw_worker is None:
        raw_worker = raw_worker_for(fleet, settings, pool=pool, concurrency=concurrency)
        raw_worker.start()
        own_workers.append(raw_worker)
    prefix = raw_worker.prefix
    toolfleet_workers = list(workers)
    plan = windows(runs, runs_small)
    runner = Runner()
    gang = Gang(runs)
    # The do-it-yourself agent's own threads: one per call in flight at the most, so no
    # call waits for a thread.
    diy_threads = max(k for _, k in plan) * width
    diy_pool = ThreadPoolExecutor(max_workers=diy_threads, thread_name_prefix="bench-diy")
    raw_app = create_raw_app(url, prefix)
    meter: Meter | None = None
    try:
        if not toolfleet_workers:
            # Both fleets start together: the raw worker boots while toolfleet's is awaited.
            toolfleet_workers = fleet.start_workers(settings, 1, pool=pool, concurrency=concurrency)
            own_workers += toolfleet_workers
        raw_worker.wait_ready(timeout=90)
        dispatcher = fleet.dispatcher(settings)
        calls = [("echo", {"text": ECHO_TEXT})] * width
        diy_tool = diy_echo_tool(raw_app, diy_pool)

        def toolfleet_pids() -> list[int]:
            return [pid for w in toolfleet_workers for pid in (w.pid, *w.children())]

        meter = Meter(
            url,
            {
                "toolfleet_workers": toolfleet_pids,
                "toolfleet_main": lambda: [w.pid for w in toolfleet_workers],
                "raw_workers": raw_worker.pids,
                "raw_main": lambda: [raw_worker.pid],
            },
            lambda: fleet.cpu_times()["server"],
        )

        sync_config = {**RUN_CONFIG, "max_concurrency": SYNC_MAX_CONCURRENCY}

        def contenders_of(run_turns: int) -> dict[Window, Callable[[], int]]:
            """Each window's work: its runs, concurrent, of ``run_turns`` turns; each
            returns the calls it completed (all of them, or it raises)."""
            agent = fleet_agent(turns_model(calls, run_turns), dispatcher)
            local = local_agent(turns_model(calls, run_turns))
            diy = diy_agent(turns_model(calls, run_turns), diy_tool)
            expected = run_turns * width

            def raw(k: int) -> int:
                gang.run(lambda: _raw_run(raw_app, run_turns, width))
                return k * expected

            def toolfleet_async(k: int) -> int:
                for state in runner.gather([agent] * k, timeout=WINDOW_TIMEOUT):
                    check_results(state, expected)
                return k * expected

            def toolfleet_sync(k: int) -> int:
                gang.run(lambda: check_results(agent.invoke(PAYLOAD, sync_config), expected))
                return k * expected

            def agent_loop(k: int) -> int:
                for state in runner.gather([local] * k, timeout=WINDOW_TIMEOUT):
                    check_results(state, expected)
                return k * expected

            def diy_async(k: int) -> int:
                for state in runner.gather([diy] * k, timeout=WINDOW_TIMEOUT):
                    check_answers(state, expected, NOOP_ANSWER)
                return k * expected

            work: dict[str, Callable[[int], int]] = {
                "celery_raw": raw,
                "toolfleet_async": toolfleet_async,
                "toolfleet_sync": toolfleet_sync,
                AGENT_LOOP: agent_loop,
                DIY: diy_async,
            }
            return {(name, k): functools.partial(work[name], k) for name, k in plan}

        # A warm-up of one turn each: connections, threads, imports and the workers'
        # pools are all up before anything is measured.
        for warm_up in contenders_of(1).values():
            warm_up()
        work = contenders_of(turns)
        time.sleep(settle)  # the warm-up's last acknowledgements are no idle traffic
        idle = meter.idle(idle_seconds)
        usage = {window: Usage() for window in plan}
        per_round: dict[Window, list[float]] = {window: [] for window in plan}
        for round_ in range(rounds):
            # The order rotates: no window always follows the same one.
            for window in rotated(plan, round_):
                measured = meter.measure(work[window], settle)
                usage[window] = usage[window] + measured
                per_round[window].append(
                    measured.calls / measured.seconds if measured.seconds else 0.0
                )
    finally:
        gang.close()
        runner.close()
        diy_pool.shutdown(wait=False, cancel_futures=True)
        if meter is not None:
            meter.close()
        _close_raw_app(raw_app)
        # Both fleets stop together (a warm shutdown each).
        fleet.stop_workers(own_workers)
    numbers = {
        window: {
            **per_call(usage[window], *PROCESS_GROUPS[window[0]]),
            "calls_per_second_by_round": per_round[window],
        }
        for window in plan
    }
    contenders = {name: numbers[(name, runs)] for name in CONTENDERS}
    raw_numbers = contenders["celery_raw"]
    levels = sorted({k for _, k in plan}, reverse=True)
    return {
        "runs": runs,
        "runs_small": runs_small,
        "turns": turns,
        "width": width,
        "rounds": rounds,
        "pool": pool,
        "concurrency": concurrency,
        "contenders": contenders,
        "versus_raw": {
            name: versus(numbers[(name, runs)], raw_numbers)
            for name in ("toolfleet_async", "toolfleet_sync", DIY)
        },
        "levels": [level(k, numbers[("toolfleet_async", k)], numbers[(DIY, k)]) for k in levels],
        "diy_pool_threads": diy_threads,
        "idle": per_second(idle),
    }


def _close_raw_app(app: Any) -> None:
    # The result backend's pub/sub connection and pool, then the producer pool: on a
    # shared server nothing of the bench's stays connected.
    try:
        app.backend.result_consumer.stop()
        app.backend.client.connection_pool.disconnect()
    except Exception:  # best effort on the way out
        pass
    app.close()
