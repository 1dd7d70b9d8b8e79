"""``run_call``: one call on a LangChain tool, its outcome as a ToolResult (ToolNode semantics)."""

from __future__ import annotations

from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.types import Command, Send

from tool_workers import current_call
from tool_workers.contract.models import ToolRequest
from tool_workers.runtime.context import CallContext
from tool_workers.runtime.execute import TRUNCATION_NOTE, Limits, run_call


def request(tool: BaseTool, **args: Any) -> ToolRequest:
    return ToolRequest(
        tool=tool.name, call_id="call_1", args=args, idempotency_key="key-1", thread_id="t1"
    )


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def describe(name: str) -> dict[str, Any]:
    """Describe a thing."""
    return {"name": name, "tags": ["x", "é"]}


@tool
def blocks() -> list[dict[str, str]]:
    """Return content blocks."""
    return [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]


@tool(response_format="content_and_artifact")
def query(n: int) -> tuple[str, dict[str, Any]]:
    """Return a summary and the rows."""
    return f"{n} rows", {"rows": list(range(n))}


@tool(response_format="content_and_artifact")
def opaque() -> tuple[str, object]:
    """Return an artifact that is not JSON."""
    return "done", object()


@tool
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@tool
def refuse() -> str:
    """Raises a ToolException the tool handles itself."""
    raise ToolException("the service said no")


refuse.handle_tool_error = True


@tool
def overrun() -> str:
    """Behaves as if the worker's soft time limit fired during the call."""
    raise SoftTimeLimitExceeded()


@tool
def big(size: int) -> str:
    """Return ``size`` bytes."""
    return "y" * size


@tool(response_format="content_and_artifact")
def big_with_rows(size: int) -> tuple[str, dict[str, Any]]:
    """Return ``size`` bytes of content and a 20-byte artifact."""
    return "y" * size, {"rows": [0, 1, 2, 3, 4]}


# --- success ----------------------------------------------------------------------------


def test_given_string_returning_tool_when_run_then_success_with_its_text() -> None:
    result = run_call(add, request(add, a=2, b=3), worker="w1@host")
    assert (result.status, result.error_kind, result.content) == ("success", None, "5")
    assert result.worker == "w1@host"
    assert result.pid > 0 and result.started_at > 0 and result.duration >= 0


def test_given_dict_returning_tool_when_run_then_content_is_its_json_string() -> None:
    result = run_call(describe, request(describe, name="box"))
    assert result.status == "success"
    assert result.content == '{"name": "box", "tags": ["x", "é"]}'


def test_given_content_blocks_when_run_then_content_stays_a_list() -> None:
    result = run_call(blocks, request(blocks))
    assert result.content == [
        {"type": "text", "text": "hello"},
        {"type": "text", "text": "world"},
    ]


def test_given_content_and_artifact_tool_when_run_then_artifact_kept() -> None:
    result = run_call(query, request(query, n=3))
    assert result.status == "success"
    assert result.content == "3 rows"
    assert result.artifact == {"rows": [0, 1, 2]}


# --- tool failures become values --------------------------------------------------------


def test_given_tool_raising_when_run_then_tool_error_in_toolnode_words() -> None:
    result = run_call(fail, request(fail, reason="disk is full"))
    assert result.status == "error"
    assert result.error_kind == "tool_error"
    assert result.content == "Error: ValueError('disk is full')\n Please fix your mistakes."


def test_given_wrong_arg_type_when_run_then_invalid_args_like_toolnode() -> None:
    result = run_call(add, request(add, a="two", b=3))
    assert result.status == "error"
    assert result.error_kind == "invalid_args"
    assert isinstance(result.content, str)
    assert result.content.startswith("Error invoking tool 'add' with kwargs {'a': 'two', 'b': 3}")
    assert "\n a: " in result.content
    assert result.content.endswith("Please fix the error and try again.")


def test_given_missing_arg_when_run_then_invalid_args_naming_it() -> None:
    result = run_call(add, request(add, a=1))
    assert result.error_kind == "invalid_args"
    assert isinstance(result.content, str)
    assert result.content.startswith("Error invoking tool 'add' with kwargs {'a': 1}")
    assert "b: Field required" in result.content


def test_given_artifact_that_is_not_json_when_run_then_bad_result() -> None:
    result = run_call(opaque, request(opaque))
    assert result.status == "error"
    assert result.error_kind == "bad_result"
    assert "artifact" in str(result.content) and "opaque" in str(result.content)


def test_given_tool_handling_its_own_error_when_run_then_error_with_its_message() -> None:
    result = run_call(refuse, request(refuse))
    assert result.status == "error"
    assert result.error_kind == "tool_error"
    assert result.content == "the service said no"


def test_given_soft_time_limit_fires_in_tool_when_run_then_timeout_naming_limit() -> None:
    result = run_call(overrun, request(overrun), limits=Limits(soft_time_limit=2.5))
    assert result.status == "error"
    assert result.error_kind == "timeout"
    assert "2.5 s" in str(result.content)
    assert "'overrun'" in str(result.content)


# --- byte limits ------------------------------------------------------------------------


def test_given_arguments_over_limit_when_run_then_too_large_and_tool_not_called() -> None:
    calls: list[str] = []

    @tool
    def record(text: str) -> str:
        """Record the text."""
        calls.append(text)
        return "ok"

    result = run_call(record, request(record, text="x" * 200), limits=Limits(max_arg_bytes=100))

    assert result.status == "error"
    assert result.error_kind == "too_large"
    assert "100 bytes" in str(result.content)
    assert calls == []


def test_given_string_result_over_limit_when_run_then_truncated_with_note() -> None:
    result = run_call(big, request(big, size=100), limits=Limits(max_result_bytes=10))
    assert result.status == "success"
    assert result.error_kind is None
    assert result.content == "y" * 10 + TRUNCATION_NOTE.format(size=100, limit=10)


def test_given_string_result_at_limit_when_run_then_untouched() -> None:
    result = run_call(big, request(big, size=10), limits=Limits(max_result_bytes=10))
    assert result.content == "y" * 10


def test_given_artifact_over_result_limit_when_run_then_too_large_and_nothing_of_it_sent() -> None:
    """A 5 MB artifact under a 100 kB limit is refused whole (it used to cross)."""
    result = run_call(query, request(query, n=700_000), limits=Limits(max_result_bytes=100_000))

    assert result.status == "error" and result.error_kind == "too_large"
    assert "artifact" in str(result.content) and "100000 bytes" in str(result.content)
    assert result.artifact is None
    assert len(result.model_dump_json()) < 1_000


def test_given_artifact_within_limit_when_run_then_content_gets_what_it_leaves() -> None:
    limits = Limits(max_result_bytes=60)
    # {"rows":[0,1,2,3,4]} is 20 bytes: the content keeps 40 of "n rows" padded.
    result = run_call(query, request(query, n=5), limits=limits)

    assert result.status == "success" and result.artifact == {"rows": [0, 1, 2, 3, 4]}
    assert result.content == "5 rows"
    padded = run_call(big_with_rows, request(big_with_rows, size=100), limits=limits)
    assert padded.content == "y" * 40 + TRUNCATION_NOTE.format(size=100, limit=40)


# --- the call context -------------------------------------------------------------------


def test_given_running_tool_when_it_asks_for_current_call_then_gets_its_identity() -> None:
    seen: list[CallContext | None] = []

    @tool
    def introspect() -> str:
        """Report the call it serves."""
        seen.append(current_call())
        return "ok"

    assert current_call() is None
    result = run_call(introspect, request(introspect), attempt=3)

    assert result.status == "success"
    [ctx] = seen
    assert ctx is not None
    assert (ctx.call_id, ctx.idempotency_key, ctx.attempt) == ("call_1", "key-1", 3)
    assert ctx.thread_id == "t1"
    assert current_call() is None


def test_given_failing_tool_when_run_then_current_call_reset_afterwards() -> None:
    run_call(fail, request(fail, reason="x"))
    assert current_call() is None


@tool
async def double(x: int) -> int:
    """An async tool."""
    return x * 2


def test_given_async_tool_when_run_then_it_runs_on_its_own_loop() -> None:
    result = run_call(double, request(double, x=21))

    assert result.status == "success"
    assert result.content == "42"


def test_given_command_with_send_goto_when_run_then_bad_result() -> None:
    @tool
    def fan() -> Command:  # type: ignore[type-arg]
        """Returns a Command that sends elsewhere (a remote tool cannot)."""
        return Command(goto=Send("model", {}))

    result = run_call(fan, request(fan))

    assert result.status == "error" and result.error_kind == "bad_result"
    assert "goto is not node names" in result.content
