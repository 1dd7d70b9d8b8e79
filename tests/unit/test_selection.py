"""What a search answers of each item: ``select``, ``extract`` paths, the values filter."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage

from orchestrator.server.selection import contains, extracted, picked, value_at

THREAD = {
    "thread_id": "t1",
    "status": "idle",
    "values": {"messages": [{"content": "hi"}, {"content": "bye", "_secret": 1}], "n": 0},
    "metadata": {"user": {"name": "ada"}},
}


def test_select_keeps_only_the_fields_named() -> None:
    """Given a thread, when fields are selected, then only those stay; none: all stay."""
    assert picked(THREAD, ["thread_id", "status"]) == {"thread_id": "t1", "status": "idle"}
    assert picked(THREAD, None) is THREAD
    assert picked(THREAD, []) is THREAD


def test_paths_walk_keys_and_list_indexes() -> None:
    """Given paths of keys and indexes, then each picks its value, or None where it does
    not resolve (a missing key, an index out of range, a key under a scalar)."""
    assert value_at(THREAD, "values.messages[-1].content") == "bye"
    assert value_at(THREAD, "values.messages[0]") == {"content": "hi"}
    assert value_at(THREAD, "metadata.user.name") == "ada"
    assert value_at(THREAD, "values.n") == 0
    assert value_at(THREAD, "values.messages[5].content") is None
    assert value_at(THREAD, "values.n.deeper") is None
    assert value_at(THREAD, "values.messages[x]") is None
    assert value_at(THREAD, "config.anything") is None


def test_private_keys_never_resolve() -> None:
    """A key starting with ``_`` picks None, as on LangGraph's server."""
    assert value_at(THREAD, "values.messages[1]._secret") is None


def test_extract_names_each_value_by_its_alias() -> None:
    assert extracted(THREAD, {"last": "values.messages[-1].content", "who": "metadata.x"}) == {
        "last": "bye",
        "who": None,
    }


def test_contains_compares_objects_key_by_key() -> None:
    """Given state values, then a filter matches when every key has its value, nested
    objects compared key by key and lists as a whole; no values never match."""
    values = {"n": 1, "user": {"name": "ada", "age": 36}, "tags": ["a", "b"]}
    assert contains(values, {"n": 1})
    assert contains(values, {"user": {"name": "ada"}})
    assert not contains(values, {"user": {"name": "bob"}})
    assert contains(values, {"tags": ["a", "b"]})
    assert not contains(values, {"tags": ["a"]})
    assert not contains(values, {"missing": None})
    assert not contains(None, {"n": 1})
    assert contains(values, {})


def test_paths_step_into_messages_by_their_json_form() -> None:
    """Given state holding message objects (as a thread's values do), then a path reads
    their fields as the client sees them, from the end of the list too."""
    item = {"values": {"messages": [HumanMessage("hi"), AIMessage("hello")]}}
    assert value_at(item, "values.messages[-1].content") == "hello"
    assert value_at(item, "values.messages[0].type") == "human"
    assert value_at(item, "values.messages[-3].content") is None
    assert value_at(item, "values.messages[0]._private") is None
