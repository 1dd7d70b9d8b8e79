"""An autoscaling trial: a load ramp against real workers, scaled by a small controller
applying KEDA's formula (desired replicas = ceil(list length / target), between min and
max) to the list the Kubernetes manifests watch, by starting workers and stopping them
with SIGTERM (the scale-down path of deploy/kubernetes/). Reports the queue wait (p50,
p99) and the calls lost, which must be 0, as must the calls run twice."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from orchestrator import dispatcher_for
from orchestrator.local import WorkerProcess
from tests.faults.scaling import calls
from tests.support.fleet import effects, worker_env
from tool_workers.contract.names import queue_key
from tool_workers.contract.settings import Settings

POLICY = Path(__file__).with_name("k8s_policy.toml")
TARGET, MIN, MAX = 2, 1, 3
"""The ScaledObject's listLength and replica bounds of the trial (workers of -c 1)."""


@pytest.mark.parametrize(
    ("ramp", "seconds"),
    [
        pytest.param([(4, 2), (8, 4), (0, 0)], 0.4, id="short"),
        pytest.param([(10, 2), (20, 4), (20, 8), (10, 2)], 0.5, id="long", marks=pytest.mark.soak),
    ],
)
@pytest.mark.timeout(400)
def test_queue_length_autoscaling_loses_nothing(
    make_settings: Callable[..., Settings],
    redis_url: str,
    tmp_path: Path,
    ramp: list[tuple[float, float]],
    seconds: float,
) -> None:
    """Given calls published in phases of (duration s, calls per s), when a controller
    sets the worker count from the list length every 0.5 s, then every call succeeds
    once, and scale-ups and scale-downs (SIGTERM) happened."""
    settings = make_settings(config=POLICY)
    env = worker_env(settings)
    client = redis.Redis.from_url(redis_url)
    key = queue_key(settings.namespace, "tools")
    workers: list[WorkerProcess] = []
    stopping: list[threading.Thread] = []
    events: list[str] = []

    def add() -> None:
        n = len(events)
        worker = WorkerProcess(
            settings, name=f"tool-worker-{n}", concurrency=1, extra_env=env,
            log_file=tmp_path / f"w{n}.log",
        )  # fmt: skip
        workers.append(worker.start())
        events.append(f"+1 at {time.monotonic() - t0:.1f}s")

    def remove() -> None:
        worker = workers.pop()
        thread = threading.Thread(target=worker.stop, kwargs={"grace": 60})
        thread.start()
        stopping.append(thread)
        events.append(f"-1 at {time.monotonic() - t0:.1f}s")

    t0 = time.monotonic()
    add()
    workers[0].wait_ready()
    dispatcher = dispatcher_for(settings=settings)
    specs = dispatcher.served_tools(fresh=True)
    sent: list[tuple[float, object]] = []
    done = threading.Event()

    def produce() -> None:
        for duration, rate in ramp:
            end = time.monotonic() + duration
            while time.monotonic() < end:
                if rate:
                    batch = calls(specs, "touch", 1, seconds=seconds)
                    sent.append((time.time(), batch[0]))
                    dispatcher.submit(batch)
                    time.sleep(1 / rate)
                else:
                    time.sleep(0.1)
        done.set()

    producer = threading.Thread(target=produce)
    peak = 1
    try:
        t0 = time.monotonic()
        producer.start()
        quiet_since = None
        while True:
            length = int(client.llen(key))
            desired = min(MAX, max(MIN, math.ceil(length / TARGET)))
            while len(workers) < desired:
                add()
            # Scale down only after 2 s at the lower count (KEDA's cooldown, shortened).
            if len(workers) > desired:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 2:
                    remove()
                    quiet_since = None
            else:
                quiet_since = None
            peak = max(peak, len(workers))
            if done.is_set() and length == 0 and len(workers) == MIN:
                break
            time.sleep(0.5)
        results = [(at, call, dispatcher.wait(call, timeout=120)) for at, call in sent]  # type: ignore[arg-type]
        waits = sorted(r.started_at - at for at, _, r in results if r.status == "success")
        lost = sum(1 for _, _, r in results if r.status != "success")
        runs = effects(client, settings, "touch")
        twice = sum(1 for n in runs.values() if n > 1)
        p99 = waits[min(len(waits) - 1, math.ceil(0.99 * len(waits)) - 1)]
        print(
            f"\nautoscale trial: {len(sent)} calls, workers 1->{peak}->{len(workers)} "
            f"({', '.join(events)}); queue wait p50 {statistics.median(waits):.2f} s, "
            f"p99 {p99:.2f} s; lost {lost}, run twice {twice}"
        )
        assert lost == 0
        assert twice == 0 and len(runs) == len(sent)
        assert peak > MIN and any(e.startswith("-1") for e in events)
    finally:
        producer.join(timeout=60)
        dispatcher.close()
        for worker in workers:
            worker.stop()
        for thread in stopping:
            thread.join(timeout=90)
        client.close()
