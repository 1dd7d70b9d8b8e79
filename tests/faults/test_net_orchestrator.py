"""The orchestrator cut off from Redis before and during a fan-out: every call is answered
once with its real result, or the run fails cleanly and a resume collects them.

Redis, two workers and the orchestrator are each on a host of their own
(:mod:`tests.support.netns`); the orchestrator is a process on its host
(:mod:`tests.faults.net_orchestrator_proc`), running a checkpointed agent turn that fans
out 20 ``step`` calls. The cut is a silent drop on the orchestrator's bridge port, both
directions or only Redis -> orchestrator, so the workers keep running what they already
got. Side effects are counted in a file the workers write, outside Redis.

What must hold in every case: no call runs twice; when the run ends normally, every call
has exactly one ToolMessage with its real result; when it cannot (the cut outlasts the
retries) it fails with ``DispatchError`` or the run's deadline error, and resuming the
thread after the heal answers every call exactly once with its real result: none was
published and then left without a waiter to collect it.

A run with a deadline rides out any cut shorter than it, sync and async alike; when the
deadline comes first, ``RunDeadlineExceeded`` names the cut and reaches the caller within
2 s of the deadline (:data:`DEADLINE_KEPT` allows 3 s on a loaded machine).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import REPO
from tests.support.net_fleet import NET_POLICY, NetFleet
from tests.support.net_tools import read_effects
from tests.support.netns import Direction, Host

pytestmark = pytest.mark.timeout(240)

CALLS = 20
"""The fan-out: calls of one AIMessage."""

RUN_WITHIN = 100.0
"""Seconds an orchestrator process may take (its run, or its resume)."""

FAILED_WITH = ("DispatchError", "RunDeadlineExceeded")
"""The errors a run may fail with when the cut outlasts its retries."""

DEADLINE_KEPT = 3.0
"""Seconds past its deadline a run may raise ``RunDeadlineExceeded`` (kept within 2 s,
with a second of headroom for a loaded machine)."""


def report(name: str, **numbers: float) -> None:
    print(f"\n[{name}] " + " ".join(f"{k}={v:.1f}s" for k, v in numbers.items()))


class Orchestrator:
    """The orchestrator's host and the processes the test runs on it."""

    def __init__(self, fleet: NetFleet, workdir: Path) -> None:
        self.fleet = fleet
        self.host: Host = fleet.net.add_host("orch")
        self.signals = workdir / "signals"
        self.signals.mkdir()
        self.db = workdir / "checkpoints.sqlite"
        self.logs = workdir

    def start(
        self, mode: str, flavour: str, seconds: float, deadline: float = 0
    ) -> subprocess.Popen[bytes]:
        settings = self.fleet.settings
        cmd = [
            sys.executable, "-m", "tests.faults.net_orchestrator_proc", mode, flavour,
            settings.broker_url, settings.namespace, str(NET_POLICY), str(self.db),
            str(self.signals), str(CALLS), str(seconds), str(deadline),
        ]  # fmt: skip
        with (self.logs / f"orchestrator-{mode}.log").open("wb") as log:
            return self.host.popen(
                ["env", f"PYTHONPATH={REPO}", *cmd], cwd=REPO, stdout=subprocess.PIPE, stderr=log
            )

    def outcome(self, process: subprocess.Popen[bytes], mode: str) -> dict[str, Any]:
        """The JSON line the process printed (it must end within :data:`RUN_WITHIN`)."""
        try:
            out, _ = process.communicate(timeout=RUN_WITHIN)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.communicate(timeout=10)
            what = f"the orchestrator's {mode} did not end in {RUN_WITHIN:g} s"
            raise AssertionError(what) from exc
        log = (self.logs / f"orchestrator-{mode}.log").read_text(errors="replace")
        assert process.returncode == 0, log[-4000:]
        lines = out.decode().strip().splitlines()
        assert lines, log[-4000:]
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def wait_for(self, name: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not (self.signals / name).exists():
            assert time.monotonic() < deadline, f"no {name!r} from the orchestrator"
            time.sleep(0.05)

    def go(self) -> None:
        (self.signals / "go").touch()


def starts(fleet: NetFleet) -> collections.Counter[str]:
    """How many times each call (by idempotency key) started."""
    return collections.Counter(k for e, k, _, _ in read_effects(fleet.effects_file) if e == "start")


def assert_all_answered_once(outcome: dict[str, Any], seconds: float) -> None:
    """Every call of the fan-out has exactly one ToolMessage, its real result."""
    answers = outcome["tool_messages"]
    ids = collections.Counter(a["id"] for a in answers)
    assert sorted(ids) == sorted(f"c{i}" for i in range(CALLS)), answers
    assert set(ids.values()) == {1}, ids
    wrong = [a for a in answers if a["content"] != f"slept {seconds:g}"]
    assert not wrong, wrong


def assert_all_closed_once(outcome: dict[str, Any], seconds: float) -> None:
    """Every call has exactly one ToolMessage: its real result, or an error that does not
    claim the call did not run."""
    answers = outcome["tool_messages"]
    ids = collections.Counter(a["id"] for a in answers)
    assert sorted(ids) == sorted(f"c{i}" for i in range(CALLS)), answers
    assert set(ids.values()) == {1}, ids
    for answer in answers:
        if answer["content"] != f"slept {seconds:g}":
            assert answer["status"] == "error", answer
            assert "may have run" in answer["content"], answer


def cut_trial(
    make_fleet: Callable[..., NetFleet],
    tmp_path: Path,
    *,
    flavour: str,
    direction: Direction,
    cut: float,
    before: float | None,
    seconds: float,
    after_failure: str = "resume",
    deadline: float = 0,
) -> dict[str, Any]:
    """Run the fan-out with the orchestrator cut off for ``cut`` seconds, starting
    ``before`` seconds before the fan-out (``None``: once every call has started), under
    a run deadline of ``deadline`` seconds (0: none). A run that fails with its deadline
    must have raised within :data:`DEADLINE_KEPT` of it."""
    fleet = make_fleet()
    fleet.start_worker("w1", pool="threads", concurrency=10)
    fleet.start_worker("w2", pool="threads", concurrency=10)
    orch = Orchestrator(fleet, tmp_path)
    first = orch.start("start", flavour, seconds, deadline)
    try:
        orch.wait_for("ready")
        if before is not None:
            fleet.net.cut(orch.host, direction)
            cut_at = time.monotonic()
            time.sleep(before)
            orch.go()
        else:
            orch.go()
            deadline = time.monotonic() + 60
            while len(starts(fleet)) < CALLS:
                assert time.monotonic() < deadline, f"only {len(starts(fleet))} calls started"
                time.sleep(0.05)
            fleet.net.cut(orch.host, direction)
            cut_at = time.monotonic()
        time.sleep(max(cut - (time.monotonic() - cut_at), 0.0))
    finally:
        fleet.net.heal()
    healed = time.monotonic()
    outcome = orch.outcome(first, "start")
    ended = time.monotonic() - healed
    name = f"orchestrator {flavour}, cut {direction} {cut:g}s " + (
        f"{before:g}s before the fan-out" if before is not None else "during the fan-out"
    )
    numbers = {"run_ended_after_heal": ended}
    if outcome["deadline_at"] is not None:
        numbers["ended_after_deadline"] = outcome["ended_at"] - outcome["deadline_at"]
    if outcome["error"] is not None and outcome["error"].startswith("RunDeadlineExceeded"):
        late = outcome["ended_at"] - outcome["deadline_at"]
        assert late <= DEADLINE_KEPT, f"the deadline error came {late:.1f} s late"
    if outcome["error"] is None:
        assert_all_answered_once(outcome, seconds)
    else:
        assert outcome["error"].startswith(FAILED_WITH), outcome["error"]
        wrong = [a for a in outcome["tool_messages"] if a["content"] != f"slept {seconds:g}"]
        assert not wrong, wrong  # what the failed run did answer, it answered right
        # Nothing a failed run published may be left without an answer: resuming the
        # thread collects every call, the ones that ran with the result they had.
        if after_failure == "close":
            closed = orch.outcome(orch.start("close", flavour, seconds), "close")
            assert_all_closed_once(closed, seconds)
            report(f"{name}, then closed", **numbers)
            assert set(starts(fleet).values()) <= {1}, starts(fleet)  # none ran twice
            return outcome
        ran_before_resume = set(starts(fleet))
        t0 = time.monotonic()
        resumed = orch.outcome(orch.start("resume", flavour, seconds), "resume")
        numbers["resume"] = time.monotonic() - t0
        assert resumed["error"] is None, resumed["error"]
        assert_all_answered_once(resumed, seconds)
        assert ran_before_resume <= set(starts(fleet))
    report(name, **numbers)
    print(f"  run error: {outcome['error']}; answered by the run: {len(outcome['tool_messages'])}")
    ran = starts(fleet)
    assert len(ran) == CALLS, ran
    assert set(ran.values()) == {1}, f"calls run more than once: {ran}"
    return outcome


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("direction", ["both", "in"])
def test_orchestrator_cut_off_3s_before_a_fan_out_past_the_retry_window(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str, direction: Direction
) -> None:
    """Given an orchestrator about to fan out 20 calls, when its link to Redis is cut 3 s
    before the fan-out, for 30 s (past the 10 s routing and publishing retries), then no
    call runs twice, and the run either answers every call with its real result or fails
    with DispatchError, after which a resume answers every call once."""
    cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction=direction, cut=30, before=3, seconds=1
    )


def test_a_run_failed_by_a_cut_closed_with_close_pending_calls_says_calls_may_have_run(
    net_fleet: Callable[..., NetFleet], tmp_path: Path
) -> None:
    """Given a sync run failed by a 30 s cut before its fan-out, when its thread is closed
    with close_pending_calls instead of resumed, then every call has exactly one answer,
    and none that lacks its result says the call did not run: each may have."""
    outcome = cut_trial(
        net_fleet,
        tmp_path,
        flavour="sync",
        direction="both",
        cut=30,
        before=3,
        seconds=1,
        after_failure="close",
    )
    assert outcome["error"] is not None


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("direction", ["both", "in"])
def test_orchestrator_cut_off_briefly_before_a_fan_out_answers_every_call(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str, direction: Direction
) -> None:
    """Given the same fan-out, when the cut heals within the retry window (12 s, from 3 s
    before the fan-out: the calls are claimed and published during the cut), then the
    run itself answers every call once with its result, soon after the heal."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction=direction, cut=12, before=3, seconds=1
    )
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("direction", ["both", "in"])
def test_orchestrator_cut_off_for_20s_during_a_fan_out_answers_every_call(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str, direction: Direction
) -> None:
    """Given 20 calls published and running, when the orchestrator is cut off for 20 s,
    then after the heal every call is answered once with its real result, none ran twice."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction=direction, cut=20, before=None, seconds=4
    )
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.soak
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("direction", ["both", "in"])
def test_orchestrator_cut_off_for_60s_during_a_fan_out_answers_every_call(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str, direction: Direction
) -> None:
    """The 60 s cut of the during-the-fan-out trial."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction=direction, cut=60, before=None, seconds=4
    )
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_run_with_a_deadline_rides_out_a_20s_cut_before_its_fan_out(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str
) -> None:
    """Given a run with a 50 s deadline about to fan out 20 calls, when its link to Redis
    is cut 3 s before the fan-out for 20 s (past the 10 s publication retries of a run
    without a deadline), then the run itself answers every call once with its result:
    only the deadline ends a run that has one."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction="both", cut=20, before=3, seconds=1,
        deadline=50,
    )  # fmt: skip
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.soak
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_run_with_a_deadline_rides_out_a_60s_cut_before_its_fan_out(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str
) -> None:
    """The 60 s cut (deadline 90 s) of the before-the-fan-out trial."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction="both", cut=60, before=3, seconds=1,
        deadline=90,
    )  # fmt: skip
    assert outcome["error"] is None, outcome["error"]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_deadline_shorter_than_a_cut_during_the_fan_out_is_kept(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str
) -> None:
    """Given 20 calls published and running under a 30 s run deadline, when the
    orchestrator is cut off for 60 s, then the run raises RunDeadlineExceeded within 2 s
    of its deadline (3 s allowed), naming the cut, and a resume after the heal answers
    every call once with its real result."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction="both", cut=60, before=None, seconds=4,
        deadline=30,
    )  # fmt: skip
    assert outcome["error"] is not None
    assert outcome["error"].startswith("RunDeadlineExceeded"), outcome["error"]
    assert "Redis" in outcome["error"], outcome["error"]


@pytest.mark.parametrize(
    ("flavour", "before"),
    [
        ("sync", 1.0),
        ("async", None),
        pytest.param("async", 1.0, marks=pytest.mark.soak),
        pytest.param("sync", None, marks=pytest.mark.soak),
    ],
)
def test_orchestrator_cut_off_for_3s_answers_every_call(
    net_fleet: Callable[..., NetFleet], tmp_path: Path, flavour: str, before: float | None
) -> None:
    """Given the fan-out under a 60 s run deadline, when the orchestrator is cut off for
    3 s (from 1 s before the fan-out, or once every call has started), then the run
    itself answers every call once with its result, none ran twice."""
    outcome = cut_trial(
        net_fleet, tmp_path, flavour=flavour, direction="both", cut=3, before=before,
        seconds=1 if before is not None else 4, deadline=60,
    )  # fmt: skip
    assert outcome["error"] is None, outcome["error"]
