"""Scale-down that loses nothing (deploy/kubernetes/: SIGTERM from a scale-down or a
rolling update): the worker takes no new call, finishes what it runs, and the calls it
had fetched but not started run on the other workers at once, not after its running calls
nor after the visibility timeout. Real workers, real Redis, side effects counted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.local import WorkerProcess
from tests.faults.scaling import calls
from tests.support.fleet import effects, wait_started, wait_until, worker_env
from tool_workers.contract.broker import visibility_timeout
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(150)
POLICY = Path(__file__).with_name("k8s_policy.toml")
RUNNING = 20.0
"""Seconds each call runs: the ones running at SIGTERM must finish on their worker, and
must still be running once worker B has booted (which takes seconds on a loaded machine)."""


def test_sigterm_hands_prefetched_calls_to_other_workers_at_once(
    make_settings: Callable[..., Settings], redis_url: str, tmp_path: Path
) -> None:
    """Given worker A (2 processes, 3 calls prefetched per process) holding 6 calls (2
    running, 4 fetched and waiting, idempotent and not) and an idle worker B, when A gets
    SIGTERM, then the 4 waiting calls start on B while A's 2 still run, a call sent after
    the SIGTERM runs on B, A's running calls finish on A, A exits 0, every call succeeds,
    and each side effect happened exactly once."""
    settings = make_settings(config=POLICY, prefetch_multiplier=3)
    env = worker_env(settings)
    a = WorkerProcess(settings, name="tool-worker-1", concurrency=2, extra_env=env,
                      log_file=tmp_path / "a.log")  # fmt: skip
    b = WorkerProcess(settings, name="tool-worker-2", concurrency=4, extra_env=env,
                      log_file=tmp_path / "b.log")  # fmt: skip
    dispatcher = None
    try:
        a.start()
        a.wait_ready()
        dispatcher = dispatcher_for(settings=settings)
        specs = dispatcher.served_tools(fresh=True)
        assert specs["touch"].queue == specs["charge"].queue == "tools"
        held = calls(specs, "touch", 3, seconds=RUNNING) + calls(
            specs, "charge", 3, seconds=RUNNING
        )
        sent_at = time.time()
        dispatcher.submit(held)
        # A holds all six: two started, four fetched (its prefetch), none left queued.
        client = redis.Redis.from_url(redis_url)
        wait_until(
            lambda: (
                client.hlen(f"{settings.namespace}:unacked") == 6
                and client.llen(f"{settings.namespace}:tools") == 0
            ),
            20,
            "A holding six calls",
        )
        wait_until(lambda: len(_started_on(settings, held, a)) >= 2, 20, "two starts on A")
        running_on_a = _started_on(settings, held, a)
        assert len(running_on_a) == 2
        b.start()
        b.wait_ready()
        assert _started_on(settings, held, a) == running_on_a, "A started a fetched call early"
        term = time.monotonic()
        os.kill(a.pid, signal.SIGTERM)
        waiting = [c for c in held if c.task_id not in running_on_a]
        moved_at = []
        for call in waiting:
            started = wait_started(settings, call.task_id, timeout=RUNNING)
            assert started["hostname"] == b.hostname, started
            moved_at.append(time.monotonic() - term)
        # Nothing new goes to A once it got SIGTERM.
        (late,) = calls(specs, "touch", 1)
        dispatcher.submit([late])
        # B's four processes run the moved calls: the late one starts when one ends.
        late_start = wait_started(settings, late.task_id, timeout=RUNNING + 20)
        assert late_start["hostname"] == b.hostname
        results = {c.task_id: dispatcher.wait(c, timeout=60) for c in [*held, late]}
        assert a.process is not None
        exit_code = a.process.wait(timeout=30)
        exited_after = time.monotonic() - term
        assert exit_code == 0
        assert all(r.status == "success" for r in results.values()), {
            t: r.content for t, r in results.items() if r.status != "success"
        }
        assert {results[t].worker for t in running_on_a} == {a.hostname}
        assert {results[c.task_id].worker for c in waiting} == {b.hostname}
        for kind in ("touch", "charge"):
            assert set(effects(client, settings, kind).values()) == {1}, kind
        total = sum(sum(effects(client, settings, k).values()) for k in ("touch", "charge"))
        assert total == 7
        hold = visibility_timeout(settings.policies(), settings.redelivery_margin)
        assert time.time() - sent_at < hold  # nothing waited for the visibility timeout
        print(
            f"\nscale-down: 4 fetched calls started on the other worker "
            f"{min(moved_at):.2f}-{max(moved_at):.2f} s after SIGTERM (its running calls "
            f"had {RUNNING:g} s to go); the worker exited {exited_after:.1f} s after "
            f"SIGTERM; lost 0, run twice 0 (visibility timeout {hold:g} s)"
        )
        client.close()
    finally:
        if dispatcher is not None:
            dispatcher.close()
        a.stop()
        b.stop()


def _started_by(settings: Settings, task_id: str) -> Any:
    try:
        return wait_started(settings, task_id, timeout=0.01)["hostname"]
    except AssertionError:
        return None


def _started_on(settings: Settings, held: list[Any], worker: WorkerProcess) -> set[str]:
    return {c.task_id for c in held if _started_by(settings, c.task_id) == worker.hostname}
