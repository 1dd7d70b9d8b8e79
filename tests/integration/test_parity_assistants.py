"""Assistant endpoints Studio and ``RemoteGraph`` read (count, graph, schemas,
subgraphs), against LangGraph's server: the same ``langgraph-sdk`` calls to both servers
on one project, compared."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.api_pair import ApiPair, api_pair, shape, status_of
from tests.support.serving import prefork_fleet
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}",))


async def assistant_of(c: Any, graph_id: str) -> str:
    found = await c.assistants.search(graph_id=graph_id)
    return str(found[0]["assistant_id"])


def test_count(pair: ApiPair) -> None:
    """Given the project's two graphs, then both servers count two assistants, one per
    graph id, and none for metadata no assistant has."""

    async def scenario(c: Any) -> list[int]:
        return [
            await c.assistants.count(),
            await c.assistants.count(graph_id="made"),
            await c.assistants.count(metadata={"created_by": "system"}),
            await c.assistants.count(metadata={"nobody": "has this"}),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [2, 1, 2, 0]


def test_graph_drawn_alike(pair: ApiPair) -> None:
    """When each server draws the made graph and the create_agent graph (plain and with
    xray), then the nodes and edges are the same."""

    async def scenario(c: Any) -> list[Any]:
        drawn = []
        for graph_id in ("made", "fleet"):
            aid = await assistant_of(c, graph_id)
            drawn.append(await c.assistants.get_graph(aid))
            drawn.append(await c.assistants.get_graph(aid, xray=True))
            drawn.append(await c.assistants.get_graph(aid, xray=1))
        return drawn

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert {n["id"] for n in ours[0]["nodes"]} == {"__start__", "note", "__end__"}


def test_schemas_alike(pair: ApiPair) -> None:
    """When each server gives the schemas of both graphs, then they are the same."""

    async def scenario(c: Any) -> list[Any]:
        return [await c.assistants.get_schemas(await assistant_of(c, g)) for g in ("made", "fleet")]

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    made = ours[0]
    assert made["graph_id"] == "made"
    assert set(made["state_schema"]["properties"]) == {"seen", "marker", "runs"}


def test_subgraphs_alike(pair: ApiPair) -> None:
    """When each server lists the subgraphs of both graphs (plain and recursing), then
    the answers are the same."""

    async def scenario(c: Any) -> list[Any]:
        found = []
        for graph_id in ("made", "fleet"):
            aid = await assistant_of(c, graph_id)
            found.append(await c.assistants.get_subgraphs(aid))
            found.append(await c.assistants.get_subgraphs(aid, recurse=True))
        return found

    ours, theirs = pair.both(scenario)

    assert shape(ours) == shape(theirs)
    assert ours == theirs


def test_unknown_assistant_404_and_bad_xray_422(pair: ApiPair) -> None:
    """Given an assistant id no graph has, then graph, schemas and subgraphs answer 404 on
    both servers; an xray that is neither a boolean nor a positive depth is 422."""

    async def scenario(c: Any) -> list[int]:
        nobody = str(uuid.uuid4())
        aid = await assistant_of(c, "made")
        return [
            await status_of(c.assistants.get_graph(nobody)),
            await status_of(c.assistants.get_schemas(nobody)),
            await status_of(c.assistants.get_subgraphs(nobody)),
            await status_of(c.http.get(f"/assistants/{aid}/graph", params={"xray": "-1"})),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [404, 404, 404, 422]
