"""Assistants a client creates and changes, against LangGraph's server: the same
``langgraph-sdk`` calls to both servers on one project, compared; then what only a
multi-tenant server has to show (another tenant's assistants, the server's own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.api_pair import ApiPair, api_pair, shape, status_of
from tests.support.serving import prefork_fleet, run
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)

OTHER = f"tft-other-{uuid.uuid4().hex}"
"""A second tenant's token on toolfleet's server."""


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}", OTHER))


def test_create_update_versions_latest_delete(pair: ApiPair) -> None:
    """Given an assistant of the made graph, when it is created again, updated, its
    versions listed, version 1 made current again and it is deleted, then both servers
    answer the same statuses, versions, names and metadata, in the same shapes."""
    team = uuid.uuid4().hex

    async def scenario(c: Any) -> dict[str, Any]:
        made = await c.assistants.create(
            graph_id="made",
            config={"configurable": {"tone": "dry"}},
            metadata={"team": team},
            name="first",
            description="the first one",
        )
        aid = made["assistant_id"]
        out: dict[str, Any] = {"made": made}
        out["again"] = await c.assistants.create(
            graph_id="made", assistant_id=aid, if_exists="do_nothing"
        )
        out["taken"] = await status_of(c.assistants.create(graph_id="made", assistant_id=aid))
        out["no graph"] = await status_of(c.assistants.create(graph_id="no-such-graph"))
        out["updated"] = await c.assistants.update(aid, metadata={"stage": 2}, name="second")
        out["versions"] = await c.assistants.get_versions(aid)
        out["v2 only"] = await c.assistants.get_versions(aid, metadata={"stage": 2})
        out["latest"] = await c.assistants.set_latest(aid, 1)
        out["got"] = await c.assistants.get(aid)
        out["no version"] = await status_of(c.assistants.set_latest(aid, 9))
        out["found"] = await c.assistants.search(metadata={"team": team})
        out["count"] = await c.assistants.count(metadata={"team": team})
        await c.assistants.delete(aid)
        out["gone"] = await status_of(c.assistants.get(aid))
        out["gone again"] = await status_of(c.assistants.delete(aid))
        out["unknown"] = await status_of(c.assistants.update(str(uuid.uuid4()), name="x"))
        return out

    ours, theirs = pair.both(scenario)

    for answers in (ours, theirs):
        assert answers["made"]["version"] == 1 and answers["made"]["name"] == "first"
        assert answers["made"]["context"] == {"tone": "dry"}  # kept in step with config
        assert answers["again"]["assistant_id"] == answers["made"]["assistant_id"]
        assert answers["taken"] == 409
        assert answers["updated"]["version"] == 2 and answers["updated"]["name"] == "second"
        assert answers["updated"]["metadata"] == {"team": team, "stage": 2}
        assert [v["version"] for v in answers["versions"]] == [2, 1]
        assert [v["version"] for v in answers["v2 only"]] == [2]
        assert answers["latest"]["version"] == 1 and answers["latest"]["name"] == "first"
        assert answers["got"]["metadata"] == {"team": team}
        assert [a["name"] for a in answers["found"]] == ["first"]
        assert answers["count"] == 1
        assert answers["gone"] == 404 and answers["gone again"] == 404
        assert answers["no version"] == 404
    for key in ("no graph", "unknown"):
        assert ours[key] == theirs[key], key
    for key in ("made", "again", "updated", "versions", "latest", "got", "found"):
        assert shape(ours[key]) == shape(theirs[key]), key


def test_a_run_of_a_created_assistant_runs_its_graph_with_its_config(pair: ApiPair) -> None:
    """Given an assistant of the made graph with a configurable value, when a run names
    the assistant, then the run is its graph's, the thread is tagged with the assistant,
    and the run's checkpoint carries the assistant's configurable value (the run's own
    value winning where both give one)."""

    async def scenario(c: Any) -> dict[str, Any]:
        made = await c.assistants.create(
            graph_id="made", config={"configurable": {"tone": "dry", "size": "s"}}
        )
        thread = await c.threads.create()
        tid = thread["thread_id"]
        values = await c.runs.wait(
            tid, made["assistant_id"], input={}, config={"configurable": {"size": "l"}}
        )
        state = await c.threads.get_state(tid)
        tagged = await c.threads.get(tid)
        await c.assistants.delete(made["assistant_id"])
        return {
            "seen": values["seen"],
            "tone": state["metadata"].get("tone"),
            "size": state["metadata"].get("size"),
            "tagged": tagged["metadata"]["assistant_id"] == made["assistant_id"],
            "graph": tagged["metadata"]["graph_id"],
        }

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours == {"seen": "made", "tone": "dry", "size": "l", "tagged": True, "graph": "made"}


def test_another_tenants_assistants_are_not_found(pair: ApiPair) -> None:
    """Given an assistant of one tenant, then another tenant's every call on it is a 404,
    it is not in that tenant's search or count, and that tenant may make its own of the
    same id."""
    tenant_b = pair.client(pair.toolfleet, OTHER)

    async def scenario() -> dict[str, Any]:
        async with pair.client(pair.toolfleet) as a, tenant_b as b:
            made = await a.assistants.create(graph_id="made", name="mine")
            aid = made["assistant_id"]
            out = {
                "get": await status_of(b.assistants.get(aid)),
                "update": await status_of(b.assistants.update(aid, name="theirs")),
                "versions": await status_of(b.assistants.get_versions(aid)),
                "latest": await status_of(b.assistants.set_latest(aid, 1)),
                "delete": await status_of(b.assistants.delete(aid)),
                "graph": await status_of(b.assistants.get_graph(aid)),
                "run": await status_of(b.runs.wait(None, aid, input={})),
                "search": [x["assistant_id"] for x in await b.assistants.search(limit=100)],
                "count": await b.assistants.count(),
            }
            own = await b.assistants.create(graph_id="made", assistant_id=aid, name="b's")
            out["own"] = own["name"]
            out["still a's"] = (await a.assistants.get(aid))["name"]
            await a.assistants.delete(aid)
            await b.assistants.delete(aid)
            return out

    out = run(scenario())
    assert {
        k: out[k] for k in ("get", "update", "versions", "latest", "delete", "graph", "run")
    } == {k: 404 for k in ("get", "update", "versions", "latest", "delete", "graph", "run")}
    assert len(out["search"]) == out["count"] == 2  # the project's graphs only
    assert out["own"] == "b's" and out["still a's"] == "mine"


def test_the_servers_own_assistants_do_not_change(pair: ApiPair) -> None:
    """Given the assistant of a graph of the project, then a tenant cannot update or
    delete it, nor create one of its id (409 each, naming the way: create an assistant of
    the graph); its one version is listed and current."""

    async def scenario() -> dict[str, Any]:
        async with pair.client(pair.toolfleet) as c:
            mine = {"created_by": "system"}
            own = (await c.assistants.search(graph_id="made", metadata=mine))[0]["assistant_id"]
            return {
                "update": await status_of(c.assistants.update(own, name="x")),
                "delete": await status_of(c.assistants.delete(own)),
                "create": await status_of(c.assistants.create(graph_id="made", assistant_id=own)),
                "versions": [v["version"] for v in await c.assistants.get_versions(own)],
                "latest": (await c.assistants.set_latest(own, 1))["version"],
            }

    out = run(scenario())
    assert out == {"update": 409, "delete": 409, "create": 409, "versions": [1], "latest": 1}
