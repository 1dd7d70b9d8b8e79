"""Another tenant's call while one tenant fans out: ``toolfleet serve`` before and after
fair shares of tool calls, side by side on one fleet, in one run.

Usage (Redis on 127.0.0.1:6379, from the repository's root)::

    python bench/fairness.py [BEFORE_TREE]

One prefork worker of four slots (the compose file's tool worker) serves both servers in
turn. Tenant A's run fans out to twelve ``sleep_for(10)`` calls; 1.5 s after it started,
tenant B's run makes one ``sleep_for(0.1)`` call; printed: B's run from its request to
its answer. ``BEFORE_TREE``: a checkout of the code before the change (default: none,
only the current code is measured); each server imports the code of its own tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.local import WorkerProcess  # noqa: E402
from tests.support.fleet import fleet_settings, worker_env  # noqa: E402
from tests.support.serving import TEST_MODEL, ServerProcess  # noqa: E402

FAN_OUT = 12
LONG = 10.0
SLOTS = 4


def ask(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": json.dumps({"calls": [list(c) for c in calls]})}]
    }


async def measure(url: str, a_token: str, b_token: str) -> float:
    a, b = get_client(url=url, api_key=a_token), get_client(url=url, api_key=b_token)
    thread_a = await a.threads.create()
    fan_out = [("sleep_for", {"seconds": LONG, "label": f"a{i}"}) for i in range(FAN_OUT)]
    run_a = await a.runs.create(thread_a["thread_id"], "agent", input=ask(*fan_out))
    try:
        while (await a.runs.get(thread_a["thread_id"], run_a["run_id"]))["status"] != "running":
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)
        thread_b = await b.threads.create()
        t0 = time.monotonic()
        await b.runs.wait(
            thread_b["thread_id"], "agent", input=ask(("sleep_for", {"seconds": 0.1}))
        )
        return time.monotonic() - t0
    finally:
        with contextlib.suppress(ConflictError):  # A's run may have ended by then
            await a.runs.cancel(thread_a["thread_id"], run_a["run_id"])
        await asyncio.sleep(3)  # A's calls revoked, the slots free again
        await a.aclose()
        await b.aclose()


def main() -> None:
    before = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else None
    workdir = Path(tempfile.mkdtemp(prefix="tf-fairness-"))
    settings = fleet_settings("redis://127.0.0.1:6379/0", workdir)
    worker = WorkerProcess(
        settings,
        name=f"tf-fair-{uuid.uuid4().hex[:6]}",
        pool="prefork",
        concurrency=SLOTS,
        queues=("tools",),
        log_file=workdir / "worker.log",
        extra_env=worker_env(settings),
    )
    worker.start()
    results: list[tuple[str, float]] = []
    try:
        worker.wait_ready()
        trees: list[tuple[str, Path, dict[str, Any]]] = [("before", before, {})] if before else []
        trees += [
            ("after", REPO, {}),  # the default share: 4 calls of a tenant, all 4 slots
            ("after, TENANT_MAX_CALLS=3", REPO, {"tenant_max_calls": SLOTS - 1}),
        ]
        for name, tree, overrides in trees:
            a_token, b_token = (f"tft-{t}-{uuid.uuid4().hex}" for t in ("a", "b"))
            server = ServerProcess(
                settings.model_copy(
                    update={
                        "api_tokens": (f"a:{a_token}", f"b:{b_token}"),
                        "model": TEST_MODEL,
                        "checkpoint_path": workdir / f"{uuid.uuid4().hex}.sqlite",
                        **overrides,
                    }
                ),
                workdir,
                workdir / f"{uuid.uuid4().hex}.log",
                extra_env={"PYTHONPATH": str(tree)},
            ).start()
            try:
                results.append((name, asyncio.run(measure(server.url, a_token, b_token))))
            finally:
                server.stop()
    finally:
        worker.stop(grace=5)
    print(
        f"tenant B's one sleep_for(0.1) while tenant A's run fans out to {FAN_OUT} x "
        f"sleep_for({LONG:g}) on {SLOTS} worker slots:"
    )
    for name, seconds in results:
        print(f"  {name:<27} B answered after {seconds:6.2f} s")


if __name__ == "__main__":
    main()
