"""The store API (put, get, search, delete, list namespaces) against LangGraph's server:
the same ``langgraph-sdk`` calls to both servers, compared; then one tenant's items are
out of another's reach."""

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


@pytest.fixture(scope="module")
def pair(prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiPair]:
    yield from api_pair(prefork_fleet, tmp_path_factory, (f"tft-main-{uuid.uuid4().hex}", OTHER))


def test_put_get_delete(pair: ApiPair) -> None:
    """Given an item put, then get answers it, a second put replaces its value, delete
    removes it (get then answers null) on both servers, in the same shape."""
    top = uuid.uuid4().hex

    async def scenario(c: Any) -> tuple[Any, ...]:
        await c.store.put_item([top, "prefs"], "colour", {"v": "blue"})
        first = await c.store.get_item([top, "prefs"], "colour")
        await c.store.put_item([top, "prefs"], "colour", {"v": "green"})
        second = await c.store.get_item([top, "prefs"], "colour")
        await c.store.delete_item([top, "prefs"], "colour")
        gone = await c.store.get_item([top, "prefs"], "colour")
        never = await c.store.get_item([top, "other"], "colour")
        return first, second, gone, never

    ours, theirs = pair.both(scenario)

    for first, second, gone, never in (ours, theirs):
        assert first["namespace"] == [top, "prefs"] and first["key"] == "colour"
        assert (first["value"], second["value"]) == ({"v": "blue"}, {"v": "green"})
        assert (gone, never) == (None, None)
    assert shape(ours[0]) == shape(theirs[0])


def test_search_by_prefix_filter_and_pages(pair: ApiPair) -> None:
    """Given five items in two namespaces, then a search by prefix, by filter, with a
    query (no index: all match) and by pages finds the same keys on both servers."""
    top = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        for n in range(5):
            ns = [top, "a" if n < 3 else "b"]
            await c.store.put_item(ns, f"k{n}", {"n": n, "even": n % 2 == 0})
        found = []
        for prefix, kwargs in (
            ([top], {}),
            ([top, "a"], {}),
            ([top], {"filter": {"even": True}}),
            ([top], {"query": "anything"}),
            ([top], {"limit": 2, "offset": 1}),
        ):
            items = (await c.store.search_items(prefix, **kwargs))["items"]
            found.append(sorted(i["key"] for i in items) if "offset" not in kwargs else len(items))
        whole = await c.store.search_items([top, "a"], limit=1)
        found.append(shape(whole))
        return found

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours[:5] == [
        ["k0", "k1", "k2", "k3", "k4"],
        ["k0", "k1", "k2"],
        ["k0", "k2", "k4"],
        ["k0", "k1", "k2", "k3", "k4"],
        2,
    ]


def test_list_namespaces(pair: ApiPair) -> None:
    """Given items in three nested namespaces, then listing them by prefix, by suffix and
    cut at a depth answers the same on both servers."""
    top = uuid.uuid4().hex

    async def scenario(c: Any) -> list[Any]:
        for ns in ([top, "u1", "notes"], [top, "u1", "prefs"], [top, "u2", "notes"]):
            await c.store.put_item(ns, "k", {"x": 1})
        return [
            sorted(map(tuple, (await c.store.list_namespaces(prefix=[top]))["namespaces"])),
            sorted(
                map(
                    tuple,
                    (await c.store.list_namespaces(prefix=[top], suffix=["notes"]))["namespaces"],
                )
            ),
            sorted(
                map(tuple, (await c.store.list_namespaces(prefix=[top], max_depth=2))["namespaces"])
            ),
            len((await c.store.list_namespaces(prefix=[top], limit=1))["namespaces"]),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs
    assert ours == [
        [(top, "u1", "notes"), (top, "u1", "prefs"), (top, "u2", "notes")],
        [(top, "u1", "notes"), (top, "u2", "notes")],
        [(top, "u1"), (top, "u2")],
        1,
    ]


def test_bad_namespaces_and_values_are_refused(pair: ApiPair) -> None:
    """Given a label with a period, an empty label, a value that is not an object, then
    both servers refuse them with 422."""

    async def scenario(c: Any) -> list[int]:
        return [
            await status_of(
                c.http.put("/store/items", json={"namespace": ["a.b"], "key": "k", "value": {}})
            ),
            await status_of(
                c.http.put("/store/items", json={"namespace": ["a", ""], "key": "k", "value": {}})
            ),
            await status_of(
                c.http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": 3})
            ),
            await status_of(c.http.post("/store/items/search", json={"namespace_prefix": ["a.b"]})),
        ]

    ours, theirs = pair.both(scenario)

    assert ours == theirs == [422, 422, 422, 422]


def test_tenants_never_see_each_others_items(pair: ApiPair) -> None:
    """Given one tenant's item, then another tenant's get answers null, its search and
    namespace list are empty, and its delete leaves the item in place."""
    top = uuid.uuid4().hex

    async def scenario() -> tuple[Any, ...]:
        async with (
            pair.client(pair.toolfleet) as mine,
            pair.client(pair.toolfleet, OTHER) as theirs,
        ):
            await mine.store.put_item([top], "secret", {"v": 1})
            # Listed first: reading a namespace of the in-memory store makes it (empty).
            listed = (await theirs.store.list_namespaces(prefix=[top]))["namespaces"]
            seen = (
                await theirs.store.get_item([top], "secret"),
                (await theirs.store.search_items([top]))["items"],
                listed,
            )
            await theirs.store.delete_item([top], "secret")
            return seen, await mine.store.get_item([top], "secret")

    (got, searched, listed), still = run(scenario())

    assert (got, searched, listed) == (None, [], [])
    assert still is not None and still["value"] == {"v": 1}
