"""The LangGraph store remote tools reach (``InjectedStore``, ``ToolRuntime.store``).

Tools on the workers and the orchestrator's graph must see the same store, so both
open the one ``TOOLFLEET_STORE_URL`` names: a PostgreSQL database
(``langgraph.store.postgres.PostgresStore``, the ``postgres`` extra), with the same
namespaces. One store per process, opened on first use (after a prefork worker forked).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from langgraph.store.base import BaseStore

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import Settings

_lock = threading.Lock()
_stores: dict[tuple[int, str], Any] = {}


def open_store(url: str) -> BaseStore:
    """A store for ``url``, set up (tables created) and kept open for the process.

    Raises:
        ConfigError: the URL is not a PostgreSQL URL.
    """
    key = (os.getpid(), url)
    with _lock:
        store = _stores.get(key)
        if store is not None:
            return store  # type: ignore[no-any-return]
        if not url.startswith(("postgres://", "postgresql://")):
            raise ConfigError(f"TOOLFLEET_STORE_URL must be a PostgreSQL URL, not {url!r}")
        from langgraph.store.postgres import PostgresStore
        from psycopg import Connection
        from psycopg.rows import DictRow, dict_row
        from psycopg_pool import ConnectionPool

        pool: ConnectionPool[Connection[DictRow]] = ConnectionPool(
            conninfo=url,
            max_size=4,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=True,
        )
        store = PostgresStore(pool)
        store.setup()
        _stores[key] = store
        return store


def store_for(settings: Settings) -> BaseStore | None:
    """The store the settings name, or ``None`` when none is configured."""
    return open_store(settings.store_url) if settings.store_url else None
