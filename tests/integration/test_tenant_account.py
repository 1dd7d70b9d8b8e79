"""One account per tenant for what it keeps, crons included, and crons' ticks refused
cleanly: ``toolfleet serve``'s app in this process (the project's ``made`` graph, real
Redis, SQLite checkpoints), its ticks fired by calling the beat's tick function with the
tick's time, never by waiting for the clock.

Every cron here has a yearly schedule, so the replica's own beat never fires one while
a test runs; the tests fire the ticks they want themselves.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from orchestrator.server import create_app
from orchestrator.server.cronbeat import CronBeat
from orchestrator.server.cronstore import cron_key
from orchestrator.server.projects import read_project
from tests.support.api_pair import PROJECT
from tests.support.fleet import fleet_settings
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

TOKEN = f"tft-account-{uuid.uuid4().hex}"
QUOTA = 1_048_576
MAX_CRONS = 4
THREAD_TTL = 3_600
BIG = "x" * 300_000
"""A run input of 300 kB: three crons of it fit the quota, four do not."""
YEARLY = "0 0 1 1 *"
TICK = datetime(2030, 1, 1, tzinfo=UTC)


class Served:
    """The app, a client of it, and its Redis."""

    def __init__(self, client: TestClient, settings: Settings, r: redis.Redis) -> None:
        self.http = client
        self.settings = settings
        self.redis = r
        self.beat: CronBeat = client.app.state.cron_beat  # type: ignore[attr-defined]
        client.post("/threads", json={})  # the tenant's first key: its index of threads
        (index,) = self.keys("threads:*")
        self.tenant = index.rsplit(":", 1)[1]
        """The tenant of the token, as the server names it in its keys."""

    def fire(self, cron_id: str, tick: datetime = TICK) -> str | None:
        """Fire the cron's tick, as beat does, on the app's event loop."""
        name = cron_key(self.tenant, cron_id)
        portal = self.http.portal
        assert portal is not None
        found: str | None = portal.call(self.beat.fire, name, tick)
        return found

    @property
    def prefix(self) -> str:
        return f"{self.settings.key_prefix}server:"

    def keys(self, pattern: str) -> list[str]:
        return sorted(k.decode() for k in self.redis.scan_iter(f"{self.prefix}{pattern}"))


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("account")
    project = read_project(PROJECT)
    project.apply_env()
    settings = fleet_settings(
        redis_url,
        workdir,
        api_tokens=(TOKEN,),
        model=None,
        checkpoint_path=workdir / "account.sqlite",
        tenant_max_bytes=QUOTA,
        tenant_max_crons=MAX_CRONS,
        thread_ttl=THREAD_TTL,
    )
    app = create_app(settings, graphs=project.load())
    r = redis.Redis.from_url(redis_url)
    try:
        with TestClient(app, headers={"X-Api-Key": TOKEN}) as client:
            yield Served(client, settings, r)
    finally:
        r.close()


@pytest.fixture
def crons(served: Served) -> Iterator[list[str]]:
    """The crons a test makes, deleted after it (with every thread it made)."""
    made: list[str] = []
    yield made
    for cron_id in made:
        served.http.delete(f"/runs/crons/{cron_id}")
    for thread in served.http.post("/threads/search", json={"limit": 1000}).json():
        served.http.delete(f"/threads/{thread['thread_id']}")


def new_cron(served: Served, made: list[str], **body: Any) -> httpx.Response:
    request = {"assistant_id": "made", "schedule": YEARLY, "input": {}, **body}
    thread = request.pop("thread", None)
    path = f"/threads/{thread}/runs/crons" if thread else "/runs/crons"
    answer = served.http.post(path, json=request)
    if answer.status_code == 200:
        made.append(answer.json()["cron_id"])
    return answer


def usage(served: Served) -> int:
    """The tenant's counted bytes, as ``/metrics`` shows them."""
    text = served.http.get("/metrics").text
    values = re.findall(
        r'^toolfleet_server_tenant_storage_bytes\{tenant_hash="[0-9a-f]+"\} (\S+)$', text, re.M
    )
    return int(float(values[0])) if values else 0


def test_crons_count_towards_the_tenant_quota_and_free_it_when_deleted(
    served: Served, crons: list[str]
) -> None:
    """Given crons of 300 kB each, then the tenant's counted bytes grow by each, the one
    past the quota is a 413 naming ``TOOLFLEET_TENANT_MAX_BYTES`` (as a thread's is) and
    is not kept; deleting one frees its bytes and the next goes through."""
    before = usage(served)
    statuses = [new_cron(served, crons, input={"blob": BIG}).status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 413], statuses
    refused = new_cron(served, crons, input={"blob": BIG})
    assert refused.status_code == 413 and "TOOLFLEET_TENANT_MAX_BYTES" in refused.text
    assert usage(served) >= before + 3 * len(BIG)
    count = served.http.post("/runs/crons/count", json={}).json()
    assert count == 3, count

    # A thread is refused as the crons are: one account.
    thread = served.http.post("/threads", json={"metadata": {"blob": BIG}})
    assert thread.status_code == 413, thread.text
    assert thread.json()["detail"].split(":")[0] == refused.json()["detail"].split(":")[0]

    assert served.http.delete(f"/runs/crons/{crons.pop()}").status_code == 204
    assert usage(served) < before + 3 * len(BIG)
    assert new_cron(served, crons, input={"blob": BIG}).status_code == 200


def test_a_tenant_keeps_at_most_its_cap_of_crons(served: Served, crons: list[str]) -> None:
    """Given ``TOOLFLEET_TENANT_MAX_CRONS`` crons, then one more is a 413 naming the
    setting, in the quota's message shape; deleting one makes room."""
    for _ in range(MAX_CRONS):
        assert new_cron(served, crons).status_code == 200
    refused = new_cron(served, crons)
    assert refused.status_code == 413, refused.text
    detail = refused.json()["detail"]
    assert "TOOLFLEET_TENANT_MAX_CRONS" in detail and str(MAX_CRONS) in detail, detail
    assert detail.startswith("this tenant's "), detail
    assert served.http.post("/runs/crons/count", json={}).json() == MAX_CRONS
    assert served.http.delete(f"/runs/crons/{crons.pop()}").status_code == 204
    assert new_cron(served, crons).status_code == 200


def test_cron_records_expire_within_the_thread_retention(served: Served, crons: list[str]) -> None:
    """Given a cron, then every key of it (record, index, schedule entry) expires, and
    within the thread retention plus the wait for its next tick."""
    cron_id = new_cron(served, crons, schedule="*/5 * * * *").json()["cron_id"]
    found = served.keys(f"cron*{cron_id}*") + served.keys(f"crons:{served.tenant}")
    assert len(found) >= 3, found  # record, schedule entry, the tenant's index
    ttls = {k: served.redis.ttl(k) for k in found}
    assert all(0 < ttl <= THREAD_TTL + 300 for ttl in ttls.values()), ttls


@pytest.mark.parametrize(
    ("schedule", "allowed"),
    [
        ("* * * * * *", False),  # every second (seconds last)
        ("* * * * * */30", False),  # every 30 s
        ("* * * * * 0,59", False),  # irregular: 59 s, then 1 s
        ("* * * * * 0", True),  # once a minute, at its second 0
        ("*/1 * * * *", True),
        ("0,1 * * * *", True),  # 1 min, then 59
        ("0 9 * * 1-5", True),
    ],
)
def test_a_schedule_more_frequent_than_the_minimum_is_a_422_naming_it(
    served: Served, crons: list[str], schedule: str, allowed: bool
) -> None:
    """Given the default ``TOOLFLEET_CRON_MIN_INTERVAL`` (a minute), then a schedule
    whose ticks ever come closer is a 422 naming the limit, on create and on update."""
    answer = new_cron(served, crons, schedule=schedule)
    if allowed:
        assert answer.status_code == 200, answer.text
        return
    assert answer.status_code == 422, answer.text
    assert "TOOLFLEET_CRON_MIN_INTERVAL" in answer.json()["detail"], answer.text
    assert "schedule" in answer.json()["detail"], answer.text
    cron_id = new_cron(served, crons).json()["cron_id"]
    patched = served.http.patch(f"/runs/crons/{cron_id}", json={"schedule": schedule})
    assert patched.status_code == 422, patched.text
    assert "TOOLFLEET_CRON_MIN_INTERVAL" in patched.json()["detail"], patched.text


def test_a_cron_whose_thread_or_assistant_is_gone_stops_with_its_reason(
    served: Served, crons: list[str]
) -> None:
    """Given a cron on a thread and a stateless cron of an assistant, when the thread
    and the assistant are deleted and their ticks come, then each cron is disabled with
    the reason in its metadata (as read and searched), its schedule entry is gone, and
    a later tick starts nothing."""
    thread = served.http.post("/threads", json={}).json()["thread_id"]
    assistant = served.http.post("/assistants", json={"graph_id": "made"}).json()["assistant_id"]
    on_thread = new_cron(served, crons, thread=thread).json()["cron_id"]
    of_assistant = new_cron(served, crons, assistant_id=assistant).json()["cron_id"]
    assert served.fire(on_thread) is not None  # both alive: the tick is a run
    served.http.delete(f"/threads/{thread}")
    served.http.delete(f"/assistants/{assistant}")

    assert served.fire(on_thread, TICK + timedelta(days=366)) is None
    assert served.fire(of_assistant, TICK + timedelta(days=366)) is None
    for cron_id, reason in ((on_thread, "thread_not_found"), (of_assistant, "assistant_not_found")):
        cron = served.http.get(f"/runs/crons/{cron_id}").json()
        assert cron["enabled"] is False, cron
        assert cron["metadata"]["stopped_reason"] == reason, cron
        assert cron["metadata"]["stopped_at"], cron
        assert not served.keys(f"cron-beat:*{cron_id}"), "its schedule entry is kept"
    found = served.http.post(
        "/runs/crons/search", json={"metadata": {"stopped_reason": "thread_not_found"}}
    ).json()
    assert [c["cron_id"] for c in found] == [on_thread]
    assert served.fire(on_thread, TICK + timedelta(days=731)) is None
    enabled = served.http.patch(f"/runs/crons/{of_assistant}", json={"enabled": True}).json()
    assert enabled["enabled"] and "stopped_reason" not in enabled["metadata"], enabled
    runs = served.http.post("/runs/crons/count", json={"metadata": {"stopped_reason": "x"}})
    assert runs.json() == 0


def test_refused_ticks_leave_no_state_and_log_once_per_reason(
    served: Served, crons: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Given a stateless cron whose tenant is at its quota, when five of its ticks come,
    then none starts a run, none leaves a claim or a thread, and one line says why;
    the same tick fired twice (a lost claim) starts one run and logs at most once."""
    caplog.set_level(logging.INFO, logger="toolfleet.server")
    cron_id = new_cron(served, crons, on_run_completed="keep").json()["cron_id"]
    fillers = []
    size = len(BIG)
    while size >= 64:  # until the tenant has less room left than any run takes
        made = served.http.post("/threads", json={"metadata": {"blob": "x" * size}})
        if made.status_code == 200:
            fillers.append(made.json()["thread_id"])
        else:
            size //= 2
    threads_before = len(served.http.post("/threads/search", json={"limit": 1000}).json())
    claims_before = len(served.keys("cron-fired:*"))
    for day in range(5):
        assert served.fire(cron_id, TICK + timedelta(days=day)) is None
    assert len(served.http.post("/threads/search", json={"limit": 1000}).json()) == threads_before
    assert len(served.keys("cron-fired:*")) <= max(claims_before, 1)
    lines = [r for r in caplog.records if cron_id in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "TOOLFLEET_TENANT_MAX_BYTES" in lines[0].getMessage()

    for thread in fillers:
        served.http.delete(f"/threads/{thread}")
    caplog.clear()
    later = TICK + timedelta(days=10)
    assert served.fire(cron_id, later) is not None
    for _ in range(4):
        assert served.fire(cron_id, later) is None  # fired already: claimed once
    lost = [
        r for r in caplog.records if cron_id in r.getMessage() and "fired already" in r.getMessage()
    ]
    assert len(lost) <= 1, [r.getMessage() for r in lost]
    claims = [k for k in served.keys("cron-fired:*") if cron_id in k]
    assert len(claims) <= 1, claims


def test_a_cron_gone_from_its_records_drops_its_schedule_entry(
    served: Served, crons: list[str]
) -> None:
    """Given a cron whose record expired (deleted behind the API's back), when its
    schedule entry ticks, then nothing starts and the entry is removed."""
    cron_id = new_cron(served, crons).json()["cron_id"]
    for key in served.keys(f"cron:*{cron_id}"):
        served.redis.delete(key)
    assert served.keys(f"cron-beat:*{cron_id}")
    assert served.fire(cron_id) is None
    assert not served.keys(f"cron-beat:*{cron_id}")
    assert not [k for k in served.keys("cron-fired:*") if cron_id in k]


def test_a_cron_that_fires_is_kept_as_long_as_it_does(served: Served, crons: list[str]) -> None:
    """Given a cron on a thread whose keys are about to expire, when one of its ticks
    starts a run, then every key of the cron is kept the retention again."""
    thread = served.http.post("/threads", json={}).json()["thread_id"]
    cron_id = new_cron(served, crons, thread=thread).json()["cron_id"]
    assert served.fire(cron_id) is not None
    found = served.keys(f"cron*{cron_id}*") + served.keys(f"crons:{served.tenant}")
    assert len(found) == 4, found  # record, schedule entry, last fired tick, index
    for key in found:
        served.redis.expire(key, 10)
    assert served.fire(cron_id, TICK + timedelta(days=366)) is not None
    ttls = {k: served.redis.ttl(k) for k in found}
    assert all(ttl >= THREAD_TTL for ttl in ttls.values()), ttls
