"""Log lines: the per-call fields as JSON or key=value, and no password in any of them."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tool_workers.contract.logs import (
    JsonFormatter,
    KeyValueFormatter,
    configure_logging,
    formatter_for,
    install_formatters,
    render_key_values,
    settings_fields,
)
from tool_workers.contract.settings import Settings

CALL = {
    "side": "worker",
    "tool": "grep",
    "tool_call_id": "call_1",
    "thread_id": "thread 7",
    "run_id": None,
    "worker": "tool-worker@abc",
    "duration_ms": 12.5,
    "outcome": "success",
}


def record(message: str = "tool call finished", **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("toolfleet.test")
    return logger.makeRecord(logger.name, logging.INFO, __file__, 1, message, (), None, extra=extra)


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    toolfleet_level = logging.getLogger("toolfleet").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("toolfleet").setLevel(toolfleet_level)


def test_json_line_carries_the_call_fields_at_top_level() -> None:
    line = JsonFormatter().format(record(toolfleet=CALL))

    entry = json.loads(line)
    assert entry["message"] == "tool call finished"
    assert entry["level"] == "INFO" and entry["logger"] == "toolfleet.test"
    assert {k: entry[k] for k in CALL} == CALL
    assert entry["ts"].endswith("Z")


def test_json_line_keeps_celery_task_fields_and_the_traceback() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        logger = logging.getLogger("celery.task")
        rec = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    rec.task_name, rec.task_id = "tools.grep", "abc"

    entry = json.loads(JsonFormatter().format(rec))

    assert entry["task_name"] == "tools.grep" and entry["task_id"] == "abc"
    assert "ValueError: bad" in entry["exc"]


def test_key_value_line_appends_the_fields_before_any_traceback() -> None:
    formatter = KeyValueFormatter("%(levelname)s %(message)s")
    rec = record(toolfleet=CALL)
    rec.exc_text = "Traceback (most recent call last):\nValueError: x"

    first, *rest = formatter.format(rec).splitlines()

    assert first == (
        'INFO tool call finished side=worker tool=grep tool_call_id=call_1 thread_id="thread 7"'
        " run_id=- worker=tool-worker@abc duration_ms=12.5 outcome=success"
    )
    assert rest[0].startswith("Traceback")


def test_key_value_formatter_keeps_the_base_formatters_line() -> None:
    base = logging.Formatter("[celery] %(message)s")
    formatter = KeyValueFormatter(base=base)

    assert formatter.format(record(toolfleet={"tool": "x"})) == "[celery] tool call finished tool=x"
    assert formatter.format(record("plain")) == "[celery] plain"


def test_values_needing_quotes_are_json_quoted() -> None:
    assert (
        render_key_values({"a": "x y", "b": 'q"', "c": "", "d": 3}) == 'a="x y" b="q\\"" c="" d=3'
    )


@pytest.mark.parametrize("log_json", [True, False])
def test_passwords_in_urls_are_masked_in_every_line(log_json: bool) -> None:
    formatter = formatter_for(Settings(log_json=log_json))
    rec = record(
        "cannot reach redis://:hunter2@redis:6379/0",
        toolfleet={"url": "rediss://app:hunter2@cache:6380/0"},
    )

    line = formatter.format(rec)

    assert "hunter2" not in line
    assert "redis://:***@redis:6379/0" in line
    assert "rediss://app:***@cache:6380/0" in line


def test_installing_formatters_twice_does_not_nest_them() -> None:
    logger = logging.getLogger("toolfleet.test.install")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("[base] %(message)s"))
    logger.addHandler(handler)
    try:
        install_formatters(logger, Settings())
        install_formatters(logger, Settings())

        assert isinstance(handler.formatter, KeyValueFormatter)
        assert handler.formatter.format(record("m", toolfleet={"k": 1})) == "[base] m k=1"

        install_formatters(logger, Settings(log_json=True))
        assert isinstance(handler.formatter, JsonFormatter)
    finally:
        logger.removeHandler(handler)


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_logs_toolfleet_at_its_level_and_libraries_at_warning() -> None:
    stream = io.StringIO()
    configure_logging(Settings(log_json=True, log_level="info"), stream)
    configure_logging(Settings(log_json=True, log_level="info"), stream)  # replaces, no double

    logging.getLogger("toolfleet.orchestrator.calls").info("finished", extra={"toolfleet": CALL})
    logging.getLogger("some.library").info("chatter")

    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["tool_call_id"] == "call_1"


def test_settings_fields_mask_urls_and_leave_out_tokens() -> None:
    settings = Settings(
        broker_url="redis://:hunter2@redis:6379/0",
        database_url="postgresql://app:hunter3@db/toolfleet",
        api_tokens=("token-abc",),
    )

    fields = settings_fields(settings)

    text = json.dumps(fields)
    assert "hunter2" not in text and "hunter3" not in text and "token-abc" not in text
    assert fields["broker_url"] == "redis://:***@redis:6379/0"
