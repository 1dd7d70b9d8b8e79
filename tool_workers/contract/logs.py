"""Log lines for operators: one structured line per tool call, as JSON or key=value.

Both sides log a finished call as ``log.info("tool call finished", extra={"toolfleet":
{...}})`` with the thread id, run id, tool call id, tool, worker, duration and outcome.
:class:`JsonFormatter` (``TOOLFLEET_LOG_JSON=1``) renders those fields as top-level keys
of one JSON object per line; :class:`KeyValueFormatter` appends them as ``key=value`` to
the usual line. Both mask the password of any ``scheme://user:password@`` they print.

The worker keeps Celery's own logging setup (``-l``, ``-f``, colours) and only swaps the
formatters (:func:`install_formatters`, from Celery's ``after_setup_logger`` signal);
the orchestrator calls :func:`configure_logging` where it starts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from tool_workers.contract.masking import mask_text, masked_settings
from tool_workers.contract.settings import Settings

FIELDS_ATTR = "toolfleet"
"""Name of the ``extra`` key whose mapping the formatters render."""

_RECORD_EXTRAS = ("task_name", "task_id")
"""Attributes Celery's task logger sets on a record, kept in JSON lines when present."""


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, FIELDS_ATTR, None)
    return fields if isinstance(fields, Mapping) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the call's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "message": record.getMessage(),
        }
        for name in _RECORD_EXTRAS:
            value = getattr(record, name, None)
            if value not in (None, "???"):  # Celery's placeholder outside a task
                entry[name] = value
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return mask_text(json.dumps(entry, default=str))


class KeyValueFormatter(logging.Formatter):
    """The usual line (its own format, or another formatter's) plus ``key=value`` fields.

    Args:
        fmt: Format of the line when no ``base`` is given.
        datefmt: Date format when no ``base`` is given.
        base: Format the line with this formatter (Celery's, keeping its colours).
    """

    def __init__(
        self,
        fmt: str | None = None,
        datefmt: str | None = None,
        *,
        base: logging.Formatter | None = None,
    ) -> None:
        super().__init__(fmt, datefmt)
        self._base = base

    def format(self, record: logging.LogRecord) -> str:
        line = self._base.format(record) if self._base is not None else super().format(record)
        fields = _fields(record)
        if fields:
            # Before a traceback, not after it: the fields belong to the message line.
            head, newline, rest = line.partition("\n")
            line = f"{head} {render_key_values(fields)}{newline}{rest}"
        return mask_text(line)


def render_key_values(fields: Mapping[str, Any]) -> str:
    """``k=v k2=v2``; values with spaces, quotes or ``=`` are JSON-quoted, ``None`` is ``-``."""
    parts = []
    for key, value in fields.items():
        text = "-" if value is None else str(value)
        if not text or any(c in text for c in ' "=\n\t'):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def formatter_for(settings: Settings, base: logging.Formatter | None = None) -> logging.Formatter:
    """The formatter ``settings`` ask for; ``base`` formats the line of key=value output."""
    if settings.log_json:
        return JsonFormatter()
    return KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", base=_unwrap(base))


def _unwrap(formatter: logging.Formatter | None) -> logging.Formatter | None:
    # Installing twice (two Celery signals, a re-run setup) must not nest formatters.
    while isinstance(formatter, KeyValueFormatter):
        formatter = formatter._base
    return None if isinstance(formatter, JsonFormatter) else formatter


def install_formatters(logger: logging.Logger, settings: Settings) -> None:
    """Give every handler of ``logger`` the formatter ``settings`` ask for.

    Called from Celery's ``after_setup_logger``/``after_setup_task_logger`` signals, so
    the worker keeps Celery's handlers, levels and line format (plus the fields).
    """
    for handler in logger.handlers:
        handler.setFormatter(formatter_for(settings, handler.formatter))


def configure_logging(settings: Settings, stream: IO[str] | None = None) -> logging.Handler:
    """Log to ``stream`` (stderr) the way ``settings`` ask: JSON or key=value lines.

    toolfleet's own loggers (``toolfleet.*``) log at ``TOOLFLEET_LOG_LEVEL``; everything
    else at WARNING, so libraries do not drown the per-call lines. Calling it again
    replaces the handler it installed before.

    Returns:
        The handler installed on the root logger.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_toolfleet", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._toolfleet = True  # type: ignore[attr-defined]
    handler.setFormatter(formatter_for(settings))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("toolfleet").setLevel(settings.log_level.upper())
    return handler


def settings_fields(settings: Settings) -> dict[str, Any]:
    """The settings as loggable fields (:func:`tool_workers.contract.masking.masked_settings`)."""
    return masked_settings(settings)
