"""What the routes of one replica share, and helpers they all use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import Depends, Request, Response
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore

from orchestrator.dispatch.dispatcher import CeleryDispatcher
from orchestrator.server.assistant_store import AssistantStore
from orchestrator.server.encoding import dumps
from orchestrator.server.graphs import Graphs
from orchestrator.server.runner import RunManager
from orchestrator.server.store import Store
from tool_workers.contract.settings import Settings


@dataclass
class Services:
    """One replica's parts, built in the app's lifespan."""

    settings: Settings
    redis: aioredis.Redis
    """String-response client of the shared Redis."""
    store: Store
    runs: RunManager
    graphs: Graphs
    """The graphs the replica serves, as assistants."""
    checkpointer: BaseCheckpointSaver[Any]
    dispatcher: CeleryDispatcher
    graph_store: BaseStore
    """The store the project's graphs get, behind the store API (``/store/...``)."""
    assistants: AssistantStore
    """The server's assistants and the tenants'."""


def services(request: Request) -> Services:
    """FastAPI dependency: the replica's services."""
    found: Services = request.app.state.services
    return found


def json_response(
    value: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``value`` as JSON, with messages and interrupts encoded as clients read them."""
    return Response(dumps(value), status_code, headers, media_type="application/json")


Svc = Annotated[Services, Depends(services)]
"""A route parameter of this type receives the replica's services."""


def tenant(request: Request) -> str:
    """FastAPI dependency: the tenant making the request (set by the guard)."""
    found: str = request.state.tenant
    return found


Tenant = Annotated[str, Depends(tenant)]
"""A route parameter of this type receives the requesting tenant's id."""
