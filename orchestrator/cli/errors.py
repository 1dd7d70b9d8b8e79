"""How the ``toolfleet`` commands fail: a line or two on stderr and a non-zero exit.

A missing broker or a model spec that leads nowhere is the user's setup, not a bug: it
gets the reason and what it concerned (the broker URL with its password masked), never a
traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis
import typer
from kombu.exceptions import OperationalError

from tool_workers.contract.errors import ToolfleetError
from tool_workers.contract.masking import mask_text

_BROKER_ERRORS = (redis.RedisError, OperationalError, ConnectionError)

# Exit code of a command that could not do its work because of its setup.
SETUP_ERROR = 2


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` (secrets masked) on stderr; the exit to raise."""
    # One line, whatever the message held (a library's error can run to paragraphs).
    typer.echo(f"error: {' '.join(mask_text(message).split())}", err=True)
    return typer.Exit(SETUP_ERROR)


@contextlib.contextmanager
def setup_errors(broker_url: str) -> Iterator[None]:
    """Turn the errors of a setup that does not work into :func:`fail`'s line.

    Args:
        broker_url: The broker the command talks to, named when it cannot be reached.
    """
    try:
        yield
    except ToolfleetError as exc:
        if isinstance(exc.__cause__, _BROKER_ERRORS):  # e.g. the registry could not be read
            raise fail(f"{exc} (broker {broker_url})") from None
        raise fail(str(exc)) from None
    except _BROKER_ERRORS as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise fail(f"cannot reach the broker at {broker_url}: {reason}") from None


def probe_database(url: str) -> None:
    """Connect once to the checkpointer's PostgreSQL database at ``url``.

    Raises:
        typer.Exit: it cannot be reached (:func:`fail`'s line, the URL's password masked).
    """
    try:
        import psycopg
    except ImportError:
        extra = "pip install 'toolfleet[postgres]'"
        raise fail(f"TOOLFLEET_DATABASE_URL needs the postgres extra: {extra}") from None
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise fail(f"cannot reach the database at {url}: {reason}") from None
