"""What of the service's internal names a client may see: none.

A thread runs under its thread key ``<tenant>/<thread id>`` (the LangGraph ``thread_id``
of its checkpoints, :mod:`orchestrator.server.tenancy`), and a run's config carries its
tenant under :data:`orchestrator.fairshare.TENANT_KEY` for the fair shares. LangGraph
puts both in what it streams (``checkpoints`` and ``debug`` configs, ``events``
metadata, task payloads). Every stream event of a run is encoded here once, as it is
recorded, before any reader (a run's stream, its join, the thread's streams, A2A, a
thread command) can send it: the tenant's config key is dropped wherever it is, and
the thread key is written as the client's thread id, in any string (a repr included),
and a hashed tenant id (``tk-...``) is cut out of any text left holding it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.fairshare import TENANT_KEY
from orchestrator.server.auth import HASHED_PREFIX
from orchestrator.server.encoding import dumps, loads
from orchestrator.server.tenancy import split_thread_key

__all__ = ["ClientView"]


class ClientView:
    """The encoding of one run's events for its clients.

    Args:
        thread_key: The thread key the run's graph runs with (``<tenant>/<thread id>``).
        thread_id: The thread id the client knows.
    """

    def __init__(self, thread_key: str, thread_id: str) -> None:
        self._key = thread_key
        self._id = thread_id
        # As they are written inside a JSON string (the quotes cut off).
        self._key_bytes = dumps(thread_key)[1:-1]
        self._id_bytes = dumps(thread_id)[1:-1]
        self._tenant_item = dumps(TENANT_KEY)[1:-1]
        tenant = split_thread_key(thread_key)[0]
        # A hashed tenant id is the service's own name (a named one is the operator's).
        self._tenant_bytes = dumps(tenant)[1:-1] if tenant.startswith(HASHED_PREFIX) else b""

    def encode(self, value: Any) -> bytes:
        """``value`` as JSON for a client: without the tenant's config key, the thread
        key written as the thread id (also where an object is encoded as its text)."""
        data = dumps(self._cleaned(value))
        if self._key_bytes and self._key_bytes != self._id_bytes:
            data = data.replace(self._key_bytes, self._id_bytes)
        if self._tenant_item in data:  # in an object encoded as a dict: drop it there
            data = dumps(self._cleaned(loads(data)))
        if self._tenant_item in data:  # in some object's text
            data = data.replace(self._tenant_item, b"")
        if self._tenant_bytes and self._tenant_bytes in data:
            data = data.replace(self._tenant_bytes, b"")
        return data

    def text(self, value: str) -> str:
        """A text for a client (an error's message): as :meth:`encode` writes it."""
        cleaned: str = loads(self.encode(value))
        return cleaned

    def _cleaned(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                key: self._cleaned(item)
                for key, item in value.items()
                if not (isinstance(key, str) and key == TENANT_KEY)
            }
        if isinstance(value, list | tuple):
            return [self._cleaned(item) for item in value]
        if isinstance(value, str):
            return value.replace(self._key, self._id) if self._key in value else value
        return value
