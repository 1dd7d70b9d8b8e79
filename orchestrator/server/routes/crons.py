"""Crons: runs on a schedule, stateless or on a thread (``client.crons``).

The seven operations of LangGraph's server: create (``POST /runs/crons``, each tick a
run on a new thread, deleted after it unless ``on_run_completed`` is ``keep``), create on
a thread (``POST /threads/{id}/runs/crons``, each tick a run on that thread), get,
update (``PATCH``), delete, search and count (``/runs/crons/{id}``, ``/search``,
``/count``). A tenant sees, changes and deletes only its own crons (another tenant's
answer 404, as an id nobody has). Fields this server does not carry out are refused
with a 422 naming them, and so is a schedule ticking more often than
``TOOLFLEET_CRON_MIN_INTERVAL``; a cron past the tenant's account (bytes or count) is a
413 (:mod:`orchestrator.server.guards.account`). Enabling a cron the service stopped
clears why it did. When ticks fire: :mod:`orchestrator.server.cronbeat`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from zoneinfo import available_timezones

from croniter import croniter
from fastapi import APIRouter, Depends, Request, Response
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from orchestrator.server.cronbeat import CronBeat
from orchestrator.server.cronstore import (
    RUN_FIELDS,
    STOPPED_AT,
    STOPPED_REASON,
    run_request,
    to_api,
)
from orchestrator.server.errors import NotFound, Unsupported
from orchestrator.server.openapi import NOT_FOUND
from orchestrator.server.routes.threads import existing_thread
from orchestrator.server.schemas import (
    ID_MAX_CHARS,
    Id,
    JsonObject,
    MultitaskStrategy,
    PageLimit,
    PageOffset,
    RequestBody,
    RunConfig,
    SortOrder,
    StreamMode,
    ThreadId,
    WebhookUrl,
)
from orchestrator.server.services import Services, Svc, Tenant, json_response

router = APIRouter(tags=["crons"])

CronId = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX_CHARS)]


def _field(value: str) -> str:
    """A field of a cron expression whose values match ``value``: ``*``, a value or a
    range of two, each with an optional step; several of them, comma-separated."""
    term = rf"(\*|({value})(-({value}))?)(/[1-9][0-9]?)?"
    return rf"{term}(,{term})*"


SCHEDULE_PATTERN = (
    "^"
    + " ".join(
        _field(v)
        for v in (
            "[0-5]?[0-9]",  # minute
            "[01]?[0-9]|2[0-3]",  # hour
            "0?[1-9]|[12][0-9]|3[01]",  # day of the month
            "0?[1-9]|1[0-2]",  # month
            "[0-7]",  # day of the week (0 and 7: Sunday)
        )
    )
    + f"( {_field('[0-5]?[0-9]')})?$"  # seconds
)
"""The cron expressions accepted: five numeric fields, or six with seconds last."""

Schedule = Annotated[str, StringConstraints(min_length=9, max_length=256, pattern=SCHEDULE_PATTERN)]

ZONES = frozenset(available_timezones())


def _zone(value: str) -> str:
    if value not in ZONES:
        raise ValueError(f"unknown timezone {value[:64]!r} (an IANA name, e.g. Europe/Paris)")
    return value


Timezone = Annotated[
    str,
    AfterValidator(_zone),
    WithJsonSchema({"type": "string", "enum": sorted(ZONES)}),
]
CronSortBy = Literal[
    "cron_id", "assistant_id", "thread_id", "next_run_date", "end_time", "created_at", "updated_at"
]
CronField = Literal[
    "cron_id",
    "assistant_id",
    "thread_id",
    "on_run_completed",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "user_id",
    "payload",
    "next_run_date",
    "metadata",
    "enabled",
]


class Cron(BaseModel):
    """A cron: its schedule, and the run request each tick makes (``payload``)."""

    cron_id: str
    assistant_id: str
    thread_id: str | None
    """The thread each tick runs on; ``None``: a new thread per tick."""
    on_run_completed: Literal["delete", "keep"] | None
    end_time: str | None
    schedule: str
    timezone: str | None
    created_at: str
    updated_at: str
    user_id: str | None
    payload: dict[str, Any]
    next_run_date: str | None
    metadata: dict[str, Any]
    enabled: bool


class _Strict(RequestBody):
    model_config = ConfigDict(extra="forbid")  # a field not carried out is a 422 naming it


class _CronFields(_Strict):
    """What a cron's runs are, and when it runs: fields of every cron request."""

    input: JsonObject | None = None
    config: RunConfig | None = None
    context: JsonObject | None = None
    metadata: JsonObject | None = None
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    webhook: WebhookUrl | None = None
    stream_mode: list[StreamMode] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    end_time: datetime | None = Field(default=None, strict=False)  # JSON spells it a string
    """No tick after this time."""
    enabled: bool | None = None
    timezone: Timezone | None = None
    """IANA name the schedule is read in (default UTC)."""

    @field_validator("stream_mode", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("end_time", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        # The one field parsed from a string: a number is not read as a timestamp.
        if value is not None and not isinstance(value, str):
            raise ValueError("end_time is an ISO 8601 date-time string")
        return value

    @field_validator("end_time")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC) if value is not None else None


def _check_schedule(value: str | None) -> str | None:
    if value is not None and not croniter.is_valid(value):
        raise ValueError(
            f"invalid cron schedule {value[:64]!r}: five fields (minute hour day month "
            "weekday), or six with seconds last, e.g. '*/5 * * * *'"
        )
    return value


class ThreadCronCreate(_CronFields):
    """Body of ``POST /threads/{thread_id}/runs/crons``."""

    assistant_id: Id
    schedule: Schedule
    multitask_strategy: MultitaskStrategy | None = None

    _schedule = field_validator("schedule")(_check_schedule)


class CronCreate(ThreadCronCreate):
    """Body of ``POST /runs/crons``."""

    on_run_completed: Literal["delete", "keep"] | None = None
    """What becomes of each run's thread: deleted after the run (default) or kept."""


class CronPatch(_CronFields):
    """Body of ``PATCH /runs/crons/{cron_id}``: what changes (``metadata`` is merged)."""

    schedule: Schedule | None = None
    on_run_completed: Literal["delete", "keep"] | None = None

    _schedule = field_validator("schedule")(_check_schedule)


class CronCount(_Strict):
    """Body of ``POST /runs/crons/count``."""

    assistant_id: Id | None = None
    thread_id: Id | None = None
    metadata: JsonObject | None = None


class CronSearch(CronCount):
    """Body of ``POST /runs/crons/search``."""

    enabled: bool | None = None
    limit: PageLimit = 10
    offset: PageOffset = 0
    sort_by: CronSortBy | None = None
    """Default: ``created_at``, newest first."""
    sort_order: SortOrder | None = None
    select: list[CronField] | None = None
    """The fields each cron is answered with (default: all)."""


def cron_beat(request: Request) -> CronBeat:
    """FastAPI dependency: the replica's beat and the crons' records."""
    found: CronBeat = request.app.state.cron_beat
    return found


Beat = Annotated[CronBeat, Depends(cron_beat)]

STOP_FIELDS = (STOPPED_REASON, STOPPED_AT)


@router.post("/runs/crons", response_model=Cron, responses=NOT_FOUND)
async def create_cron(svc: Svc, tenant: Tenant, beat: Beat, body: CronCreate) -> Response:
    """A cron whose every tick is a run on a new thread."""
    return await _create(svc, beat, tenant, None, body, body.on_run_completed or "delete")


@router.post("/threads/{thread_id}/runs/crons", response_model=Cron, responses=NOT_FOUND)
async def create_thread_cron(
    svc: Svc, tenant: Tenant, beat: Beat, thread_id: ThreadId, body: ThreadCronCreate
) -> Response:
    """A cron whose every tick is a run on the thread."""
    await existing_thread(svc, tenant, thread_id)
    return await _create(svc, beat, tenant, thread_id, body, None)


@router.get("/runs/crons/{cron_id}", response_model=Cron, responses=NOT_FOUND)
async def get_cron(tenant: Tenant, beat: Beat, cron_id: CronId) -> Response:
    """The cron."""
    return json_response(to_api(await _existing(beat, tenant, cron_id)))


@router.patch("/runs/crons/{cron_id}", response_model=Cron, responses=NOT_FOUND)
async def update_cron(
    svc: Svc, tenant: Tenant, beat: Beat, cron_id: CronId, body: CronPatch
) -> Response:
    """Change the cron: its schedule, its runs' request, whether it is enabled."""
    doc = await _existing(beat, tenant, cron_id)
    given = body.model_dump(mode="json", exclude_unset=True)
    if not given:
        raise Unsupported("nothing to update: the body names no field")
    if body.webhook is not None:
        await _check_webhook(svc, body.webhook)
    for name in ("schedule", "timezone", "on_run_completed", "enabled"):
        if given.get(name) is not None:
            doc[name] = given[name]
    if given.get("enabled"):  # enabled again: why it was stopped no longer holds
        doc["metadata"] = {
            k: v for k, v in (doc.get("metadata") or {}).items() if k not in STOP_FIELDS
        }
    if "end_time" in given:  # null clears it
        doc["end_time"] = given["end_time"]
    if given.get("metadata") is not None:
        doc["metadata"] = {**(doc.get("metadata") or {}), **given["metadata"]}
    payload = dict(doc["payload"])
    for name in RUN_FIELDS:
        if name in given and name not in ("assistant_id", "multitask_strategy"):
            payload[name] = given[name]
    configurable = dict((payload.get("config") or {}).get("configurable") or {})
    payload["config"] = {**(payload.get("config") or {}), "configurable": configurable}
    configurable["cron_id"] = doc["cron_id"]
    doc["payload"] = payload
    _valid_run(doc)
    await beat.crons.put(tenant, doc)
    await beat.schedule(tenant, doc)
    return json_response(to_api(doc))


@router.delete("/runs/crons/{cron_id}", status_code=204, responses=NOT_FOUND)
async def delete_cron(tenant: Tenant, beat: Beat, cron_id: CronId) -> Response:
    """Delete the cron: no more ticks (runs already started go on)."""
    if not await beat.crons.delete(tenant, cron_id):
        raise NotFound(f"cron {cron_id} not found")
    await beat.unschedule(tenant, cron_id)
    return Response(status_code=204)


@router.post("/runs/crons/search", response_model=list[dict[str, Any]])
async def search_crons(svc: Svc, tenant: Tenant, beat: Beat, body: CronSearch) -> Response:
    """The tenant's crons that match, newest first unless ``sort_by`` says otherwise."""
    found = [to_api(d) for d in await _matching(svc, beat, tenant, body, body.enabled)]
    key = body.sort_by or "created_at"
    descending = (body.sort_order or "desc") == "desc"
    found.sort(key=lambda c: str(c.get(key) or ""), reverse=descending)
    page = found[body.offset : body.offset + body.limit]
    if body.select:
        page = [{k: v for k, v in c.items() if k in body.select} for c in page]
    return json_response(page)


@router.post("/runs/crons/count", response_model=int)
async def count_crons(svc: Svc, tenant: Tenant, beat: Beat, body: CronCount) -> Response:
    """How many of the tenant's crons match."""
    return json_response(len(await _matching(svc, beat, tenant, body, None)))


# -- helpers ----------------------------------------------------------------------------


async def _create(
    svc: Services,
    beat: CronBeat,
    tenant: str,
    thread_id: str | None,
    body: ThreadCronCreate,
    on_run_completed: str | None,
) -> Response:
    _, assistant = await svc.assistants.resolve(tenant, body.assistant_id)  # 404 first
    if body.webhook is not None:
        await _check_webhook(svc, body.webhook)
    fields = body.model_dump(mode="json", exclude_none=True)
    payload = {k: v for k, v in fields.items() if k in RUN_FIELDS}
    doc = {
        "cron_id": "",
        "thread_id": thread_id,
        "payload": {**payload, "assistant_id": str(assistant["assistant_id"])},
        "metadata": body.metadata or {},
        "on_run_completed": on_run_completed,
    }
    _valid_run(doc)  # a request no tick could start is refused now
    created = await beat.crons.create(
        tenant,
        assistant_id=str(assistant["assistant_id"]),
        thread_id=thread_id,
        schedule=body.schedule,
        timezone=body.timezone,
        end_time=fields.get("end_time"),
        enabled=True if body.enabled is None else body.enabled,
        on_run_completed=on_run_completed,
        payload=payload,
        metadata=body.metadata or {},
    )
    await beat.schedule(tenant, created)
    return json_response(to_api(created))


def _valid_run(doc: dict[str, Any]) -> None:
    try:
        run_request(doc)
    except ValidationError as exc:
        raise Unsupported(f"the cron's run request is not valid: {exc}") from None


async def _check_webhook(svc: Services, url: str) -> None:
    if svc.runs.webhooks is None:
        raise Unsupported("webhook: this server sends no webhooks")
    await svc.runs.webhooks.check(url)


async def _existing(beat: CronBeat, tenant: str, cron_id: str) -> dict[str, Any]:
    doc = await beat.crons.get(tenant, cron_id)
    if doc is None:
        raise NotFound(f"cron {cron_id} not found")
    return doc


async def _matching(
    svc: Services, beat: CronBeat, tenant: str, body: CronCount, enabled: bool | None
) -> list[dict[str, Any]]:
    assistant_id = body.assistant_id
    if assistant_id is not None:
        try:  # a graph id names its assistant, as when the cron was made
            _, assistant = await svc.assistants.resolve(tenant, assistant_id)
            assistant_id = str(assistant["assistant_id"])
        except NotFound:
            return []
    metadata = body.metadata or {}
    return [
        doc
        for doc in await beat.crons.all(tenant)
        if (assistant_id is None or doc["assistant_id"] == assistant_id)
        and (body.thread_id is None or doc.get("thread_id") == body.thread_id)
        and (enabled is None or bool(doc.get("enabled")) == enabled)
        and all((doc.get("metadata") or {}).get(k) == v for k, v in metadata.items())
    ]
