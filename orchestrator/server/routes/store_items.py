"""The store API: items in namespaces, in the server's LangGraph store (``/store/...``).

The store is the one the project's graphs get (``TOOLFLEET_STORE_URL``'s, else one in
memory). Each tenant has a namespace of its own: every namespace a client names is kept
under a first label for its tenant, added on the way in and taken off on the way out, so
a tenant never reads, lists or deletes another's items. Requests and answers are LangGraph's
server's: labels are non-empty and without ``.`` (a namespace travels as ``a.b`` in a
query string), a missing item is ``null``, writes answer 204; but a ``GET`` without a
``key`` is a 422 like every missing field here (400 there).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from langgraph.store.base import Item
from pydantic import Field, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from orchestrator.server.encoding import dumps
from orchestrator.server.errors import Unsupported
from orchestrator.server.guards.account import item_field, size_of
from orchestrator.server.schemas import ID_MAX_CHARS, JsonObject, PageLimit, PageOffset, RequestBody
from orchestrator.server.services import Svc, Tenant, json_response

router = APIRouter(prefix="/store", tags=["store"])

_LABEL = r"[^.\x00-\x1f\x7f]+"

Label = Annotated[
    str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS, pattern=f"^{_LABEL}$")
]
"""One label of a namespace: not empty, no ``.``, no control characters."""

Namespace = Annotated[list[Label], Field(min_length=1, max_length=32)]
Key = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS)]


class ItemPut(RequestBody):
    """Body of ``PUT /store/items``.

    ``ttl`` (minutes the item lives) is taken only by a store that expires items, and
    refused with 422 by one that does not (the in-memory one): not in the document,
    whose schema is the same whatever the store.
    """

    namespace: Namespace
    key: Key
    value: JsonObject
    index: Literal[False] | Annotated[list[Key], Field(max_length=100)] | None = None
    """Fields to index for search (``false``: none); only with a store that has an index."""
    ttl: SkipJsonSchema[float | None] = Field(default=None, gt=0)


_Int = Annotated[int, Field(ge=-(2**63), lt=2**63)]
_Number = _Int | Annotated[float, Field(allow_inf_nan=False, ge=-(2**63), le=2**63)]
_Scalar = Annotated[str, StringConstraints(max_length=10_000)] | bool | _Number | None

FilterValue = (
    _Scalar
    | dict[Literal["$eq", "$ne"], _Scalar]
    | dict[Literal["$gt", "$gte", "$lt", "$lte"], _Number]
)
"""What a search filter compares a field with: a value (equal), or operators on it."""


class ItemRef(RequestBody):
    """Body of ``DELETE /store/items``."""

    namespace: Namespace
    key: Key


class ItemSearch(RequestBody):
    """Body of ``POST /store/items/search``."""

    namespace_prefix: Annotated[list[Label], Field(max_length=32)] = Field(default_factory=list)
    filter: Annotated[dict[str, FilterValue], Field(max_length=100)] | None = None
    """Items whose value has these fields (``a.b`` for nested ones), equal or compared."""
    limit: PageLimit = 10
    offset: PageOffset = 0
    query: Annotated[str, StringConstraints(max_length=10_000)] | None = None
    """Natural-language query: ranks items by meaning with a store that has an index."""
    refresh_ttl: bool | None = None


class NamespaceSearch(RequestBody):
    """Body of ``POST /store/namespaces``."""

    prefix: Annotated[list[Label], Field(max_length=32)] | None = None
    suffix: Annotated[list[Label], Field(max_length=32)] | None = None
    max_depth: int | None = Field(default=None, ge=1, le=32)
    limit: PageLimit = 100
    offset: PageOffset = 0


def tenant_label(tenant: str) -> str:
    """The first label of every namespace of ``tenant``'s. Tenant names may hold ``.``,
    which a label may not (a store may join labels with it); ``:`` they never hold."""
    return "tenant:" + tenant.replace(".", ":")


@router.put("/items", status_code=204)
async def put_item(svc: Svc, tenant: Tenant, body: ItemPut) -> Response:
    """Store the item (replacing one of the same namespace and key)."""
    if body.ttl is not None and not svc.graph_store.supports_ttl:
        raise Unsupported("this server's store does not expire items: leave out ttl")
    namespace = (tenant_label(tenant), *body.namespace)
    if svc.store.quota is not None:  # counted before it is written (413 past the quota)
        size = size_of(dumps(body.value), body.key, *body.namespace, *(body.index or ()))
        await svc.store.quota.charge(tenant, item_field(namespace, body.key), size)
    await svc.graph_store.aput(namespace, body.key, body.value, index=body.index, ttl=body.ttl)
    return Response(status_code=204)


@router.get("/items")
async def get_item(
    svc: Svc,
    tenant: Tenant,
    namespace: Annotated[
        str, Query(max_length=8 * ID_MAX_CHARS, pattern=rf"^{_LABEL}(\.{_LABEL})*$")
    ],
    key: Annotated[str, Query(min_length=1, max_length=ID_MAX_CHARS)],
    refresh_ttl: bool = False,
) -> Response:
    """The item, or ``null``; ``namespace`` is its labels joined by ``.``."""
    found = await svc.graph_store.aget(
        (tenant_label(tenant), *namespace.split(".")), key, refresh_ttl=refresh_ttl
    )
    return json_response(None if found is None else _item(found))


@router.delete("/items", status_code=204)
async def delete_item(svc: Svc, tenant: Tenant, body: ItemRef) -> Response:
    """Delete the item (nothing to delete is fine)."""
    namespace = (tenant_label(tenant), *body.namespace)
    await svc.graph_store.adelete(namespace, body.key)
    if svc.store.quota is not None:
        await svc.store.quota.release(tenant, item_field(namespace, body.key))
    return Response(status_code=204)


@router.post("/items/search")
async def search_items(svc: Svc, tenant: Tenant, body: ItemSearch) -> Response:
    """Items under the namespace prefix matching the filter (ranked by ``query`` with a
    store that has an index), in pages."""
    try:
        found = await svc.graph_store.asearch(
            (tenant_label(tenant), *body.namespace_prefix),
            query=body.query,
            filter=body.filter,
            limit=body.limit,
            offset=body.offset,
            refresh_ttl=body.refresh_ttl,
        )
    except (ValueError, TypeError) as exc:  # a comparison the store cannot make
        raise Unsupported(f"the store cannot apply this filter: {exc}") from None
    return json_response({"items": [_item(item) for item in found]})


@router.post("/namespaces")
async def list_namespaces(svc: Svc, tenant: Tenant, body: NamespaceSearch) -> Response:
    """The tenant's namespaces, by prefix and suffix, cut at ``max_depth`` labels."""
    found = await svc.graph_store.alist_namespaces(
        prefix=(tenant_label(tenant), *(body.prefix or ())),
        suffix=tuple(body.suffix) if body.suffix else None,
        max_depth=None if body.max_depth is None else body.max_depth + 1,
        limit=body.limit,
        offset=body.offset,
    )
    return json_response({"namespaces": [list(ns[1:]) for ns in found]})


def _item(item: Item) -> dict[str, Any]:
    shown = item.dict()
    shown["namespace"] = shown["namespace"][1:]  # the tenant's label is the server's
    return shown
