"""A worker's container healthcheck: ``python -m tool_workers.health <node name>``.

Healthy means both halves of a worker's job work: its consumer answers a ``ping``
addressed to its own node over the broker (only that node is asked), and its registry
entry is in Redis (orchestrators can discover its tools). Exit status 0 when both hold,
1 otherwise, with one line saying which failed. ``--live`` checks the first half only
(its consumer is alive): a liveness probe, where the readiness probe checks both.

``--exit-after N`` ends a worker whose consumer failed the check N times in a row: it
sends SIGQUIT to process 1, the container's init (compose's ``init: true``), which passes
it on to the worker (a cold shutdown; its lease lapses, so its calls are handed on) and
compose's restart policy starts it again. Compose restarts a container that exits, never
one that is only unhealthy. The count is kept in ``--state-dir``; a passing check, or one
where only the registry entry is missing, resets it.

It imports no tool module: ``celery -A tool_workers inspect ping`` loads the worker's
whole app, every tool module included, on every check (seconds of CPU and a hundred
megabytes a time with heavy tool dependencies); this builds a bare app from the same
settings, which is all a ping needs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import redis_client
from tool_workers.contract.errors import ToolfleetError
from tool_workers.contract.names import worker_registry_key
from tool_workers.contract.settings import Settings

NOT_ANSWERING = "did not answer a ping"
"""What a failed check says when the worker's consumer did not answer (its liveness)."""


def count_failures(state_dir: Path, node: str, problem: str | None) -> int:
    """Record this check's outcome; the liveness failures in a row, this one included
    (0 when the consumer answered)."""
    path = state_dir / f"toolfleet-health-{node.replace('/', '_')}"
    failed = problem is not None and (NOT_ANSWERING in problem or "cannot ping" in problem)
    try:
        previous = int(path.read_text()) if failed else 0
    except (OSError, ValueError):
        previous = 0
    count = previous + 1 if failed else 0
    # A read-only filesystem: the check still reports; the count stays at one.
    with contextlib.suppress(OSError):
        path.write_text(str(count))
    return count


def check(settings: Settings, node: str, timeout: float, *, live: bool = False) -> str | None:
    """Why ``node`` is unhealthy, or ``None`` when it is healthy.

    Args:
        settings: The worker's settings (its broker, namespace and policy file).
        node: The worker's node name (``tool-worker@<host>``).
        timeout: Seconds to wait for the ping's reply.
        live: Only whether its consumer answers (not its registry entry).
    """
    app = create_app(settings)
    try:
        # limit=1: return on the node's reply instead of waiting out the timeout.
        replies = app.control.ping(destination=[node], timeout=timeout, limit=1)
    except Exception as exc:  # any broker failure is a failed check, told in one line
        return f"cannot ping {node}: {type(exc).__name__}: {exc}"
    finally:
        app.close()
    if not any(node in reply for reply in replies or []):
        return f"{node} {NOT_ANSWERING} within {timeout:g} s"
    if live:
        return None
    client = redis_client(settings.own_redis_url, settings)
    try:
        registered = client.exists(worker_registry_key(settings.key_prefix, node))
    except redis.RedisError as exc:
        return f"cannot read the registry: {type(exc).__name__}: {exc}"
    finally:
        client.close()
    if not registered:
        return f"{node} answers but has no registry entry (orchestrators cannot see its tools)"
    return None


def main(argv: Sequence[str] | None = None, kill: Callable[[int, int], None] = os.kill) -> int:
    """Run the check for the node named on the command line; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tool_workers.health")
    parser.add_argument("node", help="the worker's node name, e.g. tool-worker@$HOSTNAME")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait")
    parser.add_argument(
        "--live", action="store_true", help="only check that its consumer answers a ping"
    )
    parser.add_argument(
        "--exit-after",
        type=int,
        default=0,
        metavar="N",
        help="after N failed pings in a row, end the worker (SIGQUIT to process 1)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path("/tmp"), help="where --exit-after counts"
    )
    args = parser.parse_args(argv)
    try:
        problem = check(Settings(), args.node, args.timeout, live=args.live)
    except (ToolfleetError, ValueError) as exc:
        problem = f"cannot check {args.node}: {exc}"
    if args.exit_after > 0:
        failures = count_failures(args.state_dir, args.node, problem)
        if failures >= args.exit_after:
            print(
                f"unhealthy: {args.node}'s consumer failed {failures} checks in a row; "
                "ending the worker (SIGQUIT to process 1) for its supervisor to restart it",
                file=sys.stderr,
            )
            kill(1, signal.SIGQUIT)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print(f"healthy: {args.node}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
