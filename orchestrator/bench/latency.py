"""Scenario a: the latency of one trivial call, against what it is made of.

One whole agent run (scripted model, one ``echo`` call, an answer), measured five ways
side by side, interleaved so drift on a noisy machine hits them all alike:

* ``local_sync`` / ``local_async``: ``create_agent`` with the real ``echo`` tool and no
  toolfleet (a local ``ToolNode``): the agent loop's own cost.
* ``hooks_sync`` / ``hooks_async``: the local run with a pass-through middleware of
  the same hooks as toolfleet's (:class:`~orchestrator.bench.agents.SameHooks`): what
  LangChain's agent costs with such a middleware. In async runs LangChain traces each
  middleware's model and tool hook with LangSmith's ``traceable``, whose async wrapper
  takes two trips to a thread per call when the run is traced (untraced, none: see
  :func:`orchestrator.tracing.untraced_steps_inline`; a sync run makes none).
* ``toolfleet_sync`` / ``toolfleet_async``: the same run with
  :class:`~orchestrator.middleware.CeleryToolMiddleware`; the call runs on a worker.

and three floors, through the same broker and the same workers:

* ``celery_noop``: ``send_task("celery.accumulate")`` + ``AsyncResult.get()``. Every Celery
  app (the workers' included) registers that built-in task, which only returns its
  argument: a no-op Celery round trip with no extra worker module.
* ``celery_echo``: ``send_task("tools.echo")`` with a wire request + ``get()``: the same
  worker-side task toolfleet runs, without toolfleet's orchestrator side.
* ``redis_rtt``: a child process answering BLPOP with LPUSH; the two-process floor.

toolfleet's added latency per call is ``toolfleet_<mode> - local_<mode>`` per round (the
two run back to back), summarised: its median and p99. Its own share is
``toolfleet_<mode> - hooks_<mode>``: what it adds beyond having a middleware at all.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from orchestrator.bench.agents import (
    Runner,
    check_results,
    fleet_agent,
    hooks_agent,
    local_agent,
    one_turn_model,
)
from orchestrator.bench.measure import added_latency, summarise
from orchestrator.dispatch.dispatcher import CeleryDispatcher
from tool_workers.contract.models import ToolRequest

MODES = (
    "local_sync",
    "local_async",
    "hooks_sync",
    "hooks_async",
    "toolfleet_sync",
    "toolfleet_async",
    "celery_noop",
    "celery_echo",
    "redis_rtt",
)

_PONG_CHILD = """
import sys, redis
client = redis.Redis.from_url(sys.argv[1])
ping, pong = sys.argv[2], sys.argv[3]
while True:
    item = client.blpop([ping], timeout=30)
    if item is None or item[1] == b"stop":
        break
    client.lpush(pong, item[1])
"""


class RedisPingPong:
    """A child process that answers each LPUSH on one list with an LPUSH on another."""

    def __init__(self, url: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.ping, self.pong = f"bench-ping-{tag}", f"bench-pong-{tag}"
        self.client = redis.Redis.from_url(url)
        self.child = subprocess.Popen(
            [sys.executable, "-c", _PONG_CHILD, url, self.ping, self.pong]
        )

    def round_trip(self) -> float:
        """Seconds for one ping answered by the child."""
        t0 = time.perf_counter()
        self.client.lpush(self.ping, b"x")
        if self.client.blpop([self.pong], timeout=10) is None:
            raise RuntimeError("the ping-pong child did not answer")
        return time.perf_counter() - t0

    def close(self) -> None:
        """Stop the child (by its pid) and drop the lists."""
        try:
            self.client.lpush(self.ping, b"stop")
            self.child.wait(timeout=5)
        except Exception:
            self.child.kill()
            self.child.wait(timeout=5)
        finally:
            self.client.delete(self.ping, self.pong)
            self.client.close()


def celery_round_trip(dispatcher: CeleryDispatcher, task: str) -> float:
    """Seconds for one raw ``send_task`` + ``get`` of ``task`` (``noop`` or ``echo``)."""
    app = dispatcher.app
    t0 = time.perf_counter()
    if task == "noop":
        result = app.send_task("celery.accumulate", args=(0,))
    else:
        request = ToolRequest(
            tool="echo", call_id="bench", args={"text": "hi"}, idempotency_key=uuid.uuid4().hex
        )
        result = app.send_task("tools.echo", args=(request.to_wire(),))
    # Workers refuse Celery's own tasks and store a failure for them: the no-op's round
    # trip (publish, fetch, store, notify) is the same either way, so it is not raised.
    result.get(timeout=30, propagate=False)
    return time.perf_counter() - t0


def run_latency(
    dispatcher: CeleryDispatcher, broker_url: str, *, iterations: int, warmup: int, budget: float
) -> dict[str, Any]:
    """Measure every mode ``iterations`` times (after ``warmup`` discarded rounds).

    Stops early, with what it has, when ``budget`` seconds have passed.
    """
    runner = Runner()
    pingpong = RedisPingPong(broker_url)
    call = [("echo", {"text": "hi"})]
    local = local_agent(one_turn_model(call))
    hooks = hooks_agent(one_turn_model(call))
    remote = fleet_agent(one_turn_model(call), dispatcher)

    def agent_run(agent: Any, mode: str) -> Callable[[], float]:
        def sample() -> float:
            t0 = time.perf_counter()
            state = runner.run(agent, mode)
            elapsed = time.perf_counter() - t0
            check_results(state, 1)
            return elapsed

        return sample

    samplers: dict[str, Callable[[], float]] = {
        "local_sync": agent_run(local, "sync"),
        "local_async": agent_run(local, "async"),
        "hooks_sync": agent_run(hooks, "sync"),
        "hooks_async": agent_run(hooks, "async"),
        "toolfleet_sync": agent_run(remote, "sync"),
        "toolfleet_async": agent_run(remote, "async"),
        "celery_noop": lambda: celery_round_trip(dispatcher, "noop"),
        "celery_echo": lambda: celery_round_trip(dispatcher, "echo"),
        "redis_rtt": pingpong.round_trip,
    }
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    deadline = time.monotonic() + budget
    try:
        for round_ in range(warmup + iterations):
            if round_ >= warmup and time.monotonic() > deadline:
                break
            for mode in MODES:
                elapsed = samplers[mode]()
                if round_ >= warmup:
                    samples[mode].append(elapsed)
    finally:
        pingpong.close()
        runner.close()
    modes = {mode: summarise(values) for mode, values in samples.items()}
    added_by_mode = {
        mode: added_latency(samples[f"toolfleet_{mode}"], samples[f"local_{mode}"])
        for mode in ("sync", "async")
    }
    added = {mode: stats["median"] for mode, stats in added_by_mode.items()}
    own = {
        mode: added_latency(samples[f"toolfleet_{mode}"], samples[f"hooks_{mode}"])["median"]
        for mode in ("sync", "async")
    }
    added_p99 = {mode: stats["p99"] for mode, stats in added_by_mode.items()}
    floors = {name: modes[f"celery_{name}"]["median"] for name in ("noop", "echo")}
    ratios = {
        mode: {name: added[mode] / floor if floor else 0.0 for name, floor in floors.items()}
        for mode in added
    }
    return {
        "modes": modes,
        "added": added,
        "added_p99": added_p99,
        "own": own,
        "ratios": ratios,
    }
