"""The shape a task message must have before Celery's worker code reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kombu.serialization import loads

from tool_workers.celery_ext.envelope import MAX_TASK_ID_CHARS, check_message, usable_task_id

TASK_ID = "0b9c7c5e-3a0f-5c55-9d6e-2f1c8c3d9a10"


class Message:
    """What check_message reads of a kombu message."""

    def __init__(
        self,
        body: Any,
        headers: Any = None,
        content_type: str = "application/json",
        content_encoding: str = "utf-8",
    ) -> None:
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.headers = (
            {"id": TASK_ID, "task": "tools.add", "timelimit": [None, None], "retries": 0}
            if headers is None
            else headers
        )
        self.content_type = content_type
        self.content_encoding = content_encoding

    def decode(self) -> Any:
        accept = {"application/json"}
        return loads(self.body, self.content_type, self.content_encoding, accept=accept)


GOOD_BODY = [[{"tool": "add"}], {}, {"callbacks": None, "errbacks": None, "chain": None}]


def test_a_message_as_toolfleet_sends_it_passes() -> None:
    assert check_message(Message(GOOD_BODY)) is None


@pytest.mark.parametrize(
    "body",
    ["hello", {}, None, [[], {}, {}, {}], [{}, {}, {}], [[], [], {}], [[], {}, []]],
    ids=["string", "object", "null", "four-items", "args-object", "kwargs-list", "embed-list"],
)
def test_a_body_not_args_kwargs_embed_is_refused_with_its_id(body: Any) -> None:
    refusal = check_message(Message(body))

    assert refusal is not None and refusal.task_id == TASK_ID
    assert "body" in refusal.reason


@pytest.mark.parametrize(
    "embed",
    [{"id": "other"}, {"reply_to": "x"}, {"callbacks": [{"task": "celery.backend_cleanup"}]}],
)
def test_an_embed_that_would_change_the_call_is_refused(embed: dict[str, Any]) -> None:
    refusal = check_message(Message([[], {}, embed]))

    assert refusal is not None and refusal.task_id == TASK_ID
    assert "embed" in refusal.reason or "callbacks" in refusal.reason


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("timelimit", 5),
        ("timelimit", "x"),
        ("timelimit", [1, 2, 3]),
        ("timelimit", [-1, None]),
        ("timelimit", [float("inf"), None]),
        ("timelimit", [True, None]),
        ("retries", "many"),
        ("retries", -1),
        ("eta", 12),
        ("expires", []),
        ("shadow", {"a": 1}),
        ("argsrepr", 3),
        ("ignore_result", "yes"),
        ("ignore_result", True),
        ("task", 7),
    ],
)
def test_a_header_celery_cannot_take_is_refused(header: str, value: Any) -> None:
    message = Message(GOOD_BODY)
    message.headers[header] = value

    refusal = check_message(message)

    assert refusal is not None and refusal.task_id == TASK_ID
    assert repr(header) in refusal.reason
    assert repr(value) not in refusal.reason or header in ("task", "ignore_result")


@pytest.mark.parametrize("task_id", [None, "", 42, "x" * (MAX_TASK_ID_CHARS + 1), "a b", "a\nb"])
def test_a_message_without_a_usable_id_is_refused_without_one(task_id: Any) -> None:
    message = Message(GOOD_BODY)
    if task_id is None:
        del message.headers["id"]
    else:
        message.headers["id"] = task_id

    refusal = check_message(message)

    assert refusal is not None and refusal.task_id is None and "'id'" in refusal.reason


def test_headers_that_are_not_a_mapping_are_refused() -> None:
    refusal = check_message(Message(GOOD_BODY, headers=["id", TASK_ID]))

    assert refusal is not None and refusal.task_id is None


@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [
        ("application/x-python-serialize", "binary"),
        ("application/x-yaml", "utf-8"),
        ("application/text", "rot13"),
        ("application/text", "no-such-codec"),
    ],
)
def test_an_undecodable_body_is_refused_with_its_id(
    content_type: str, content_encoding: str
) -> None:
    refusal = check_message(Message(GOOD_BODY, None, content_type, content_encoding))

    assert refusal is not None and refusal.task_id == TASK_ID
    assert "could not be decoded" in refusal.reason or "body" in refusal.reason


def test_usable_task_id() -> None:
    assert usable_task_id(TASK_ID) == TASK_ID
    assert usable_task_id("x" * MAX_TASK_ID_CHARS) is not None
    assert usable_task_id(b"abc") is None
