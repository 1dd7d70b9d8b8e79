"""Webhook hosts and signatures, cron schedules and their RedBeat entries: the decisions
of orchestrator.server.webhooks, cronbeat and routes.crons that need no server."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from orchestrator.server.cronbeat import CronEntry, CronSchedule, beat_app
from orchestrator.server.cronstore import (
    check_interval,
    next_tick,
    run_request,
    shortest_gap,
    to_api,
)
from orchestrator.server.errors import Unsupported
from orchestrator.server.keys import Keys
from orchestrator.server.routes.crons import SCHEDULE_PATTERN
from orchestrator.server.webhooks import Allowlist, Target, signature
from tool_workers.contract.settings import Settings


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("93.184.215.14", True),  # public
        ("127.0.0.1", False),
        ("10.0.0.7", False),
        ("172.16.3.4", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.64.0.1", False),  # shared address space
        ("0.0.0.0", False),
        ("224.0.0.1", False),  # multicast
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("2606:4700::1111", True),
    ],
)
def test_only_public_addresses_pass_an_empty_allowlist(address: str, allowed: bool) -> None:
    assert Allowlist.parse([]).allows("host.example", 443, ipaddress.ip_address(address)) is (
        allowed
    )


def test_the_allowlist_takes_names_addresses_and_networks() -> None:
    allow = Allowlist.parse(["Hooks.Internal.", "127.0.0.1", "10.20.0.0/16", "[::1]", " "])
    assert allow.allows("hooks.internal", 443, ipaddress.ip_address("10.9.9.9"))
    assert allow.allows("x", 80, ipaddress.ip_address("127.0.0.1"))
    assert not allow.allows("x", 80, ipaddress.ip_address("127.0.0.2"))
    assert allow.allows("x", 443, ipaddress.ip_address("10.20.3.4"))
    assert not allow.allows("x", 443, ipaddress.ip_address("10.21.0.1"))
    assert allow.allows("x", 80, ipaddress.ip_address("::1"))


def test_a_target_is_called_at_its_checked_address_with_its_host_kept() -> None:
    target = Target(
        "https://user:pw@hooks.example:8443/p?q=1", "hooks.example", ipaddress.ip_address("::1")
    )
    url, headers, extensions = target.pinned()
    assert url == "https://[::1]:8443/p?q=1"
    assert headers == {"Host": "hooks.example:8443"}
    assert extensions == {"sni_hostname": "hooks.example"}


def test_a_receiver_verifies_the_signature_over_the_raw_body() -> None:
    body = json.dumps({"run_id": "r1", "status": "success"}).encode()
    header = signature("a-secret-of-some-length", body)
    expected = hmac.new(b"a-secret-of-some-length", body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(header, "sha256=" + expected)
    assert signature("another-secret-entirely", body) != header


@pytest.mark.parametrize(
    "schedule",
    ["* * * * *", "*/5 * * * *", "0 9 * * 1-5", "0 9,17 * * 0", "30 2 1 1 *", "* * * * * */2"],
)
def test_usual_schedules_match_the_documented_pattern(schedule: str) -> None:
    assert re.fullmatch(SCHEDULE_PATTERN, schedule)
    assert croniter.is_valid(schedule)


@pytest.mark.parametrize("schedule", ["every minute", "61 * * * *", "* * * *", "*/0 * * * *"])
def test_other_schedules_do_not(schedule: str) -> None:
    assert not re.fullmatch(SCHEDULE_PATTERN, schedule)


def test_a_schedule_ticks_in_its_timezone_and_stops_at_its_end() -> None:
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    assert next_tick("0 9 * * *", start, "Europe/Paris") == datetime(2026, 6, 2, 7, 0, tzinfo=UTC)
    assert next_tick("0 0 31 2 *", start, None) is None  # no 31st of February
    ended = CronSchedule("* * * * *", None, (datetime.now(UTC) - timedelta(days=1)).isoformat())
    assert ended.due_tick(datetime.now(UTC)) is None
    assert ended.remaining_estimate(datetime.now(UTC)) is None
    assert not ended.is_due(datetime.now(UTC)).is_due


def test_a_schedule_is_due_once_its_tick_has_come() -> None:
    every_second = CronSchedule("* * * * * */1")
    assert every_second.is_due(datetime.now(UTC) - timedelta(seconds=3)).is_due
    yearly = CronSchedule("0 0 1 1 *")
    state = yearly.is_due(datetime.now(UTC))
    assert not state.is_due and state.next > 0


def test_a_redbeat_definition_of_a_cron_reads_back_as_its_schedule() -> None:
    app = beat_app(Settings(), Keys("unit"))
    entry = CronEntry("t/c1", "toolfleet.cron", CronSchedule("*/5 * * * *", "UTC"), app=app)
    stored = json.dumps({"schedule": entry.schedule.as_json(), "name": "t/c1"})
    decoded = CronEntry.decode_definition(stored)
    assert isinstance(decoded["schedule"], CronSchedule)
    assert decoded["schedule"].expression == "*/5 * * * *"
    assert 0 < entry.score - datetime.now(UTC).timestamp() <= 300


def test_a_tick_of_a_stateless_cron_is_a_run_that_keeps_or_deletes_its_thread() -> None:
    doc = {
        "cron_id": "c1",
        "thread_id": None,
        "schedule": "* * * * *",
        "payload": {"assistant_id": "a1", "input": {}, "metadata": {"run": 1}},
        "metadata": {"cron": 1, "run": 0},
        "on_run_completed": "keep",
    }
    run = run_request(doc)
    assert run.on_completion == "keep"
    assert run.metadata == {"cron": 1, "run": 1}
    assert run_request({**doc, "on_run_completed": None}).on_completion == "delete"
    assert run_request({**doc, "thread_id": "t1"}).on_completion is None
    assert to_api({**doc, "end_time": "2000-01-01T00:00:00+00:00"})["next_run_date"] is None


def test_a_placeholder_webhook_secret_is_refused_at_start() -> None:
    """Given ``TOOLFLEET_WEBHOOK_SECRET`` left at an example's placeholder, then serve
    refuses to start naming it, as for the other secrets."""
    from tool_workers.contract.errors import ConfigError
    from tool_workers.contract.placeholders import refuse_placeholders

    refuse_placeholders(Settings(webhook_secret="a-secret-of-its-own-0123"))
    with pytest.raises(ConfigError, match="TOOLFLEET_WEBHOOK_SECRET"):
        refuse_placeholders(Settings(webhook_secret="change-me-to-a-long-random-hex-string"))


@pytest.mark.parametrize(
    ("schedule", "gap"),
    [
        ("* * * * *", 60),
        ("*/1 * * * *", 60),
        ("* * * * * *", 1),  # six fields, seconds last
        ("* * * * * */30", 30),
        ("* * * * * 0,59", 1),  # irregular: 59 s, then 1 s
        ("0,1 * * * *", 60),  # irregular: 1 min, then 59
        ("59 23 * * *", None),  # once a day: no gap under a day
        ("0,59 0,23 1,31 * *", 60),  # the 31st at 23:59, then the 1st at 00:00
        ("0,59 0,23 1,15 * *", 3540),  # no two consecutive days
        ("59 0,23 28,29 2 *", 3600),  # the 28th and 29th of February, in leap years
        ("0 0 31 2 *", None),  # never
    ],
)
def test_a_schedules_shortest_gap_is_found_on_its_clock(schedule: str, gap: int | None) -> None:
    """Given a schedule, then its shortest gap between two ticks (under a day) is
    found: within its days, and across midnight only when two days in a row match."""
    assert shortest_gap(schedule) == gap


def test_a_schedule_under_the_minimum_interval_is_refused_naming_it() -> None:
    check_interval("* * * * *", 60)
    with pytest.raises(Unsupported, match=r"TOOLFLEET_CRON_MIN_INTERVAL") as refused:
        check_interval("* * * * * */10", 60)
    assert "'* * * * * */10'" in str(refused.value) and "10 s apart" in str(refused.value)
    with pytest.raises(Unsupported, match=r"every 120 s"):
        check_interval("0,1 * * * *", 120)
