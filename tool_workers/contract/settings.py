"""Settings, read once where a process starts and passed down.

Environment variables use the prefix ``TOOLFLEET_`` (``TOOLFLEET_BROKER_URL``,
``TOOLFLEET_TOOL_MODULES``, ...). Per-tool policy (queue, time limits, retries,
idempotency) lives in a TOML file, ``config/toolfleet.toml`` unless
``TOOLFLEET_CONFIG`` names another::

    [defaults]
    time_limit = 300

    [tools.run_python]
    queue = "sandbox"
    time_limit = 30
    retries = 0
    idempotent = false
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tool_workers.contract.errors import ConfigError
from tool_workers.contract.names import DEFAULT_QUEUE

DEFAULT_CONFIG_PATH = Path("config/toolfleet.toml")


class ToolPolicy(BaseModel):
    """How one tool runs on the workers. Every field may be set under ``[defaults]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str = DEFAULT_QUEUE
    """Celery queue the tool's task is routed to by hand. Without one (of its own or under
    ``[defaults]``) a tool is routed by tool, to its own tool queue, which only workers
    serving it consume."""
    time_limit: float = Field(default=300.0, gt=0)
    """Hard limit in seconds: the pool process running the call is killed and replaced."""
    soft_time_limit: float | None = None
    """Soft limit in seconds: raised inside the tool. Defaults to ``time_limit - 1``."""
    retries: int = Field(default=0, ge=0)
    """How many times Celery retries a call that raised a transient exception."""
    retry_backoff: float = Field(default=1.0, ge=0)
    """First retry delay in seconds; doubled on each further retry."""
    retry_backoff_max: float = Field(default=60.0, ge=0)
    """Upper bound for a retry delay."""
    retry_on: tuple[str, ...] = ("ConnectionError", "TimeoutError")
    """Exception class names (or dotted paths) that count as transient."""
    idempotent: bool = True
    """False: a call redelivered after a crash is not run again (an error is returned)."""
    rate_limit: str | None = None
    """Celery rate limit per worker, e.g. ``"10/m"``."""
    max_arg_bytes: int | None = None
    """Refuse calls whose JSON arguments exceed this size (``None``: the global limit)."""
    max_result_bytes: int | None = None
    """Largest result: content is truncated to it, a larger artifact or Command update is
    refused (``None``: the global limit)."""
    max_read_bytes: int = Field(default=1_000_000, gt=0)
    """For file-reading tools (the built-in ``read_file``): most bytes of a file one call
    reads and returns."""
    idle_timeout: float | None = Field(default=None, gt=0)
    """Seconds a started call may report no progress (events or heartbeats) before it is
    treated as hung: revoked, and the model gets an error."""
    inject_messages: bool = False
    """Send the message history with the state a tool asks for as a whole (the history
    grows with every turn, so it is left out unless the tool names it or this is set)."""

    @property
    def longest_retry_delay(self) -> float:
        """The longest countdown a retried call of this tool waits (0 without retries).

        The n-th retry waits ``retry_backoff * 2**(n-1)``, capped at ``retry_backoff_max``.
        """
        if not self.retries:
            return 0.0
        return min(self.retry_backoff * (1 << (self.retries - 1)), self.retry_backoff_max)

    @model_validator(mode="after")
    def _check_limits(self) -> ToolPolicy:
        if self.soft_time_limit is not None and self.soft_time_limit >= self.time_limit:
            raise ValueError("soft_time_limit must be below time_limit")
        return self

    @property
    def effective_soft_limit(self) -> float:
        """The soft limit, defaulting to one second (or 10%) before the hard limit."""
        if self.soft_time_limit is not None:
            return self.soft_time_limit
        return max(self.time_limit - 1.0, self.time_limit * 0.9)


class ToolPolicies(BaseModel):
    """All per-tool policy: defaults plus overrides by tool name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: ToolPolicy = ToolPolicy()
    tools: dict[str, dict[str, Any]] = {}

    def for_tool(self, name: str) -> ToolPolicy:
        """Return the policy for ``name``: the defaults with its overrides applied."""
        overrides = self.tools.get(name)
        if not overrides:
            return self.defaults
        merged = {**self.defaults.model_dump(), **overrides}
        if "time_limit" in overrides and "soft_time_limit" not in overrides:
            # An inherited soft limit belongs to the inherited hard limit.
            merged["soft_time_limit"] = None
        return ToolPolicy.model_validate(merged)

    def explicit_queue(self, name: str) -> str | None:
        """The queue the policy file routes ``name`` to by hand (its own ``queue``, or one
        under ``[defaults]``), or ``None``: the tool is routed by tool (its tool queue)."""
        overrides = self.tools.get(name) or {}
        if "queue" in overrides:
            return str(overrides["queue"])
        if "queue" in self.defaults.model_fields_set:
            return self.defaults.queue
        return None

    def longest_time_limit(self) -> float:
        """The longest hard time limit any configured tool (or the defaults) has."""
        return max(
            [self.defaults.time_limit] + [self.for_tool(name).time_limit for name in self.tools]
        )

    def longest_hold(self) -> float:
        """The longest a worker may hold one fetched call: its tool's hard time limit plus
        the longest countdown of its retries (a retried call waits in the worker)."""
        policies = [self.defaults] + [self.for_tool(name) for name in self.tools]
        return max(p.time_limit + p.longest_retry_delay for p in policies)

    @classmethod
    def load(cls, path: Path) -> ToolPolicies:
        """Read a policy TOML file.

        Raises:
            ConfigError: the file does not parse or a value is invalid.
        """
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read tool policy {path}: {exc}") from exc
        try:
            policies = cls.model_validate(data)
            for name in policies.tools:  # validate every override now, not at first call
                policies.for_tool(name)
        except ValueError as exc:
            raise ConfigError(f"invalid tool policy in {path}: {exc}") from exc
        return policies


class Settings(BaseSettings):
    """Every toolfleet setting. Construct once at process start and pass it down."""

    # An empty variable (``TOOLFLEET_MODEL=``, as compose passes an unset ``${VAR:-}``)
    # means "use the default", not "the empty value".
    model_config = SettingsConfigDict(
        env_prefix="TOOLFLEET_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    broker_url: str = "redis://127.0.0.1:6379/0"
    """URL of the Celery broker: Redis (``redis://``, ``rediss://`` for TLS) or RabbitMQ
    (``amqp://``, ``amqps://`` for TLS)."""
    result_backend: str | None = None
    """Redis URL of the result backend; defaults to ``broker_url`` when that is Redis,
    else to ``redis_url``."""
    redis_url: str | None = None
    """Redis URL of toolfleet's own records (registry, send and run markers, reply
    channels, revocations, status, the HTTP service's records); defaults to the result
    backend, and is the result backend when that is not set and the broker is not Redis.
    Needed with a RabbitMQ broker unless ``result_backend`` is set; when both are set they
    must be the same (a call's markers are written with its result, in one round trip)."""
    sentinel_master: str | None = None
    """The name Redis Sentinel knows the primary by (``sentinel monitor <name> ...``):
    needed when a Redis URL is a Sentinel one, ``sentinel://host:26379;sentinel://host2:
    26379/0`` (Celery's form: each Sentinel, ``;``-separated, the database last; a
    password in the URL is the primary's). Every client then finds the primary through
    the Sentinels and follows a failover."""
    sentinel_password: str | None = Field(default=None, repr=False, exclude=True)
    """The Sentinels' own password, where they have one (``requirepass`` of the
    Sentinels; the primary's travels in the URL)."""
    sentinel_tls: bool = False
    """The Sentinels and the primary they name speak TLS (``sentinel://`` URLs have no TLS
    scheme of their own); verified with the ``redis_ssl_*`` settings, as ``rediss://``."""
    amqp_queue_type: Literal["classic", "quorum"] = "classic"
    """RabbitMQ only: the type of the task queues toolfleet declares. ``quorum`` queues
    are replicated across a RabbitMQ cluster; they have no global QoS and no priorities."""
    tool_modules: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated modules whose tools the worker serves; empty: the built-in toolset
    (unless ``mcp_servers`` is set: then only those servers' tools)."""
    mcp_servers: str | None = None
    """MCP servers whose tools the worker serves: a JSON file's path, or the JSON, in the
    ``mcpServers`` form (``command``/``args``/``env`` or ``url``/``headers`` per server)."""
    config: Path | None = None
    """Tool policy TOML; default ``config/toolfleet.toml`` when that file exists."""
    namespace: str = ""
    """Prefix for every Redis key and queue, so several deployments can share one Redis."""
    registry_refresh: float = Field(default=10.0, gt=0)
    """Seconds between a worker's re-publications of the tools it serves."""
    registry_shared_names: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated tool names that workers of different sources may all serve (a
    module's tool and an MCP server's, or two MCP servers'), as versions of one tool.
    Any other name is served by one source: a worker offering a built-in tool's name
    from an MCP server, or a name a live worker serves from another source, refuses to
    start."""
    result_expires: int = Field(default=86_400, gt=0)
    """Seconds a tool result is kept, so a restarted orchestrator can still collect it."""
    result_store_retry: float = Field(default=3_600.0, ge=30)
    """Seconds a worker keeps a finished call's result it cannot store (Redis unreachable)
    and retries the store, every second: the result waits in the worker's memory (at most
    ``max_result_bytes`` per call it was running), so after any cut the worker survives
    for less than this the real outcome is recorded, as the answer or as a late result."""
    unserved_wait: float = Field(default=10.0, ge=0)
    """Seconds a call waits for a worker serving its tool before it fails with an error."""
    workspace_root: Path = Path("workspace")
    """Root directory of the built-in workspace tools; paths outside it are refused."""
    max_arg_bytes: int = Field(default=1_000_000, gt=0)
    """Largest JSON size of one call's arguments."""
    sandbox_memory_limit: int = Field(default=512 * 1024 * 1024, gt=0)
    """Bytes of resident memory all the processes of one ``run_python`` call may use
    together (each process also gets it as its address-space limit)."""
    sandbox_max_processes: int = Field(default=32, gt=0)
    """Processes one ``run_python`` call may run at once."""
    sandbox_uids: str = "60000-60063"
    """Uids ``run_python`` calls run as when the worker runs as root: ``first-last`` or a
    comma-separated list of uids and ranges. Each running call takes one of its own (its
    group the same number, no supplementary groups), held across every worker of the
    host; give no other user a uid of the range."""
    sandbox_python: str | None = None
    """Interpreter ``run_python`` snippets run with (default: the worker's own). With
    namespaces, the folders of the interpreter's installation (and of the venv it belongs
    to) are made reachable in the call's mount namespace, even below a folder closed to
    the call's uid, such as ``/root``."""
    sandbox_min_isolation: Literal["namespaces", "uid", "none"] = "namespaces"
    """The weakest isolation between ``run_python`` calls a worker accepts; where the host
    gives less, every call is refused with one line naming what is missing. ``namespaces``:
    each call in pid, mount and IPC namespaces of its own (and a user namespace when the
    worker is not root) with a private ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/proc``,
    as a uid of its own when root. ``uid`` (root without namespaces): a uid of its own
    per call, the host's ``/tmp`` and ``/proc`` shared. ``none`` (not root, without user
    namespaces): every call as the worker's user."""
    max_result_bytes: int = Field(default=1_000_000, gt=0)
    """Largest size of one result: content and artifact together. Content over it is
    truncated with a note; an artifact (or a Command update) over it is refused."""
    prefetch_multiplier: int = Field(default=1, ge=0)
    """Messages a worker process reserves ahead (1 keeps long calls from queueing behind)."""
    redelivery_margin: float = Field(default=30.0, ge=0)
    """Seconds added to the longest time limit and retry delay to get the broker's
    visibility timeout: a call whose worker died is redelivered after that long."""
    socket_timeout: float = Field(default=5.0, gt=0)
    """Seconds a Redis connection may stay unanswered (a reply, a connect, data the server
    has not acknowledged) before it counts as lost and is reopened: a network cut is
    noticed this fast, and a healed link is used again as soon as a new connection opens."""
    lease_ttl: float = Field(default=10.0, gt=0)
    """Seconds a worker's lease lives after its last renewal: the calls of a worker that
    died or became unreachable go back to the queue this long after it went silent."""
    lease_refresh: float = Field(default=1.0, gt=0)
    """Seconds between a worker's lease renewals (and its sweeps for lapsed leases);
    shorter than ``lease_ttl``."""
    redis_ssl_cert_reqs: Literal["required", "optional", "none"] = "required"
    """For ``rediss://`` URLs: whether the server's certificate must verify."""
    redis_ssl_ca_certs: Path | None = None
    """For ``rediss://`` URLs: CA bundle to verify the server with (default: the system's)."""
    redis_ssl_certfile: Path | None = None
    """For ``rediss://`` URLs: client certificate, when the server asks for one (mTLS)."""
    redis_ssl_keyfile: Path | None = None
    """For ``rediss://`` URLs: the client certificate's private key."""
    metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    """Port a worker serves its Prometheus metrics on (``/metrics``); unset: no metrics."""
    metrics_host: str = "0.0.0.0"
    """Interface a worker's metrics port listens on."""
    metrics_dir: Path | None = None
    """Where a worker keeps its pool processes' metric files (a fresh directory per worker
    inside it; default: the system's temporary directory)."""
    log_json: bool = False
    """Log one JSON object per line."""
    log_level: str = "INFO"
    """Level of the orchestrator's log (workers take Celery's ``-l``)."""
    model: str | None = None
    """Chat model of the orchestrator's agent as ``provider:name``; scripted if unset."""
    database_url: str | None = None
    """Postgres URL of the LangGraph checkpointer; the SQLite file below when unset."""
    database_pool_size: int = Field(default=10, ge=1)
    """Postgres connections the checkpointer may hold (concurrent runs share them)."""
    checkpoint_path: Path = Path("toolfleet-checkpoints.sqlite")
    """SQLite file of the LangGraph checkpointer when no ``database_url`` is set."""
    store_url: str | None = None
    """PostgreSQL URL of the LangGraph store remote tools and the agent share (optional)."""
    api_tokens: Annotated[tuple[str, ...], NoDecode] = Field(default=(), repr=False, exclude=True)
    """Comma-separated bearer tokens the HTTP service (``toolfleet serve``) accepts, each
    bare (a tenant of its own) or as ``tenant:token`` (tokens sharing a named tenant)."""
    cors_origins: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated origins of the web pages that may call the HTTP service from a
    browser (``http://localhost:3000``; ``*``: any); none by default."""
    max_body_bytes: int = Field(default=4_194_304, gt=0)
    """Largest request body the HTTP service reads; larger ones are refused with 413."""
    redis_pool_size: int = Field(default=50, gt=0)
    """Redis connections each of the HTTP service's two shared clients opens at most;
    requests needing one more wait for a free one."""
    redis_pool_timeout: float = Field(default=20.0, gt=0)
    """Seconds a request of the HTTP service waits for a free Redis connection (then 503)."""
    signing_key: str | None = Field(default=None, min_length=16, repr=False, exclude=True)
    """Shared secret of signed envelopes: requests and results carry an HMAC-SHA256 and
    anything unsigned or mis-signed is refused (set it on the orchestrator and workers)."""
    max_runs: int = Field(default=64, gt=0)
    """Runs one orchestrator replica executes at once; more are refused with 429."""
    tenant_max_runs: int | None = Field(default=None, gt=0)
    """Runs of one tenant a replica executes at once (more wait, pending); default a
    quarter of ``max_runs``."""
    tenant_max_queued: int | None = Field(default=None, ge=0)
    """Runs of one tenant a replica keeps waiting beyond those (more are refused with
    429); default a quarter of ``max_runs``."""
    run_ttl: int = Field(default=604_800, gt=0)
    """Seconds a finished run's record and event log are kept in Redis."""
    drain_seconds: float = Field(default=30.0, ge=0)
    """Seconds a replica of the HTTP service told to stop (SIGTERM) lets its runs go on
    before it hands those still running on to the other replicas; keep it below the
    pod's ``terminationGracePeriodSeconds`` (or compose's ``stop_grace_period``)."""
    run_attempts: int = Field(default=3, ge=1)
    """Attempts of a run at most: the first, then takeovers by another replica when the
    one running it went away; a run lost once more ends ``error``."""
    thread_ttl: int = Field(default=2_592_000, gt=0)
    """Seconds a thread's record is kept in Redis after its last change (its checkpoints
    are the checkpointer's to keep)."""
    # -- fair shares and storage quotas between tenants (toolfleet serve) -----------------
    max_calls: int = Field(default=64, gt=0)
    """Tool calls the runs of one replica of the HTTP service have in flight at once;
    more wait their turn (tenant by tenant, round robin)."""
    tenant_max_calls: int | None = Field(default=None, gt=0)
    """Tool calls of one tenant's runs in flight at once on one replica; more wait their
    turn. Default 4 (at most ``max_calls``): keep it at or below the worker slots the
    tenants share, so another tenant's call waits for at most one call of this one's."""
    tenant_max_bytes: int = Field(default=33_554_432, gt=0)
    """Bytes one tenant may keep through the API: thread records (metadata, config),
    state values written with ``threads.update_state``, run requests, store items,
    assistants and their versions, crons; a write past it is refused with 413."""
    assistant_max_versions: int = Field(default=20, gt=0)
    """Versions kept per assistant: a new version past it drops the oldest."""
    tenant_max_crons: int = Field(default=100, gt=0)
    """Crons one tenant may keep; one more is refused with 413 (crons also count
    towards ``tenant_max_bytes``)."""
    cron_min_interval: int = Field(default=60, gt=0)
    """Fewest seconds between two ticks of a cron: a schedule whose ticks ever come
    closer (``* * * * * */10``, every ten seconds) is refused with 422."""
    # -- the HTTP service under abuse (toolfleet serve) ------------------------------------
    http_header_timeout: float = Field(default=10.0, gt=0)
    """Seconds a client of the HTTP service has to send a request's head (request line and
    headers), from connecting or from the request's first byte; then 408 and the
    connection is closed."""
    http_body_timeout: float = Field(default=30.0, gt=0)
    """Seconds a client of the HTTP service has to send a request's whole body, once its
    token is checked; then 408 and the connection is closed."""
    http_max_connections: int = Field(default=1000, gt=0)
    """Connections one replica of the HTTP service holds open (lowered to fit the
    process's open-file limit). At the cap a new connection closes the one waiting
    longest for its request head, or, with none waiting, is answered 503."""
    tenant_max_streams: int = Field(default=100, gt=0)
    """Event streams one tenant holds open on a replica at once (``GET`` of a thread's
    or a run's ``/stream``); more are refused with 429."""
    # -- webhooks of runs (toolfleet serve) ----------------------------------------------
    webhook_allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    """Comma-separated hosts a run's webhook may name although they resolve to loopback,
    private, link-local or other non-public addresses: host names, IP addresses or
    networks (``10.0.0.0/8``), each on ports 80 and 443 unless written ``host:port``
    (that port) or ``host:*`` (any). Others are refused (422 when the run is created)."""
    webhook_secret: str | None = Field(default=None, min_length=16, repr=False, exclude=True)
    """Key of the webhooks' ``X-Toolfleet-Signature`` (HMAC-SHA256 of the body); unset:
    webhooks are sent unsigned."""
    webhook_timeout: float = Field(default=10.0, gt=0)
    """Seconds one try of a webhook delivery may take in all: resolving, connecting,
    sending and reading the answer."""
    webhook_attempts: int = Field(default=5, ge=1, le=20)
    """Tries of a webhook delivery (retried on connection errors, timeouts, 429 and 5xx,
    with exponential backoff); then it is logged and counted as failed."""

    @model_validator(mode="after")
    def _check_signing_key(self) -> Settings:
        # Any other empty variable means the default; for the key that would be "nothing
        # is signed", silently (an unset ${VAR:-} in a compose file).
        named = os.environ.get("TOOLFLEET_SIGNING_KEY")
        if self.signing_key is None and named is not None and not named.strip():
            raise ValueError(
                "TOOLFLEET_SIGNING_KEY is set but empty: set a key of 16 or more characters "
                "(e.g. openssl rand -hex 32), or unset it to run unsigned"
            )
        return self

    @model_validator(mode="after")
    def _check_lease(self) -> Settings:
        if self.lease_refresh >= self.lease_ttl:
            raise ValueError("lease_refresh must be below lease_ttl")
        return self

    @field_validator(
        "tool_modules",
        "api_tokens",
        "webhook_allowed_hosts",
        "cors_origins",
        "registry_shared_names",
        mode="before",
    )
    @classmethod
    def _split_modules(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("broker_url", "result_backend", "redis_url")
    @classmethod
    def _known_scheme(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A typo (redsi://) is named as such, not taken for a broker that is not Redis.
        if value is None:
            return value
        scheme = value.partition("://")[0].lower() if "://" in value else ""
        allowed = REDIS_SCHEMES | (AMQP_SCHEMES if info.field_name == "broker_url" else set())
        if scheme not in allowed:
            shown = f"scheme {scheme!r}" if scheme else "no scheme"
            raise ValueError(
                f"{shown} is not one toolfleet speaks: use "
                + ", ".join(f"{s}://" for s in sorted(allowed))
            )
        # Said here, not as a traceback of the first connection. A Sentinel or cluster
        # URL names several hosts, ';'-separated.
        for part in value.split(";"):
            try:
                _ = urlsplit(part).port
            except ValueError as exc:
                raise ValueError(f"not a valid URL: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check_sentinel(self) -> Settings:
        named = [
            f"TOOLFLEET_{name.upper()}"
            for name in ("broker_url", "result_backend", "redis_url")
            if is_sentinel_url(getattr(self, name) or "")
        ]
        if named and not self.sentinel_master:
            raise ValueError(
                f"{' and '.join(named)} name Redis Sentinels: set TOOLFLEET_SENTINEL_MASTER "
                "to the name they know the primary by"
            )
        return self

    @model_validator(mode="after")
    def _check_redis(self) -> Settings:
        if not self.result_backend and not self.redis_url and not is_redis_url(self.broker_url):
            raise ValueError(
                "no Redis URL for results and toolfleet's records: the broker is not Redis, "
                "so set TOOLFLEET_REDIS_URL (or TOOLFLEET_RESULT_BACKEND) to a redis:// URL"
            )
        if self.result_backend and self.redis_url and self.result_backend != self.redis_url:
            raise ValueError(
                "TOOLFLEET_REDIS_URL and TOOLFLEET_RESULT_BACKEND name different servers; "
                "set one of them (a call's markers are written with its result)"
            )
        return self

    @property
    def backend_url(self) -> str:
        """The result backend URL: the broker's when it is Redis, else ``redis_url``'s."""
        if self.result_backend:
            return self.result_backend
        if is_redis_url(self.broker_url) or not self.redis_url:
            return self.broker_url
        return self.redis_url

    @property
    def own_redis_url(self) -> str:
        """The Redis toolfleet keeps its own records in: the result backend's (see
        ``redis_url``); never the broker URL as such, which may be RabbitMQ's."""
        return self.backend_url

    @property
    def broker_is_amqp(self) -> bool:
        """Whether the broker is RabbitMQ (an ``amqp://`` or ``amqps://`` URL)."""
        return is_amqp_url(self.broker_url)

    @property
    def key_prefix(self) -> str:
        """Prefix of toolfleet's own Redis keys."""
        return f"{self.namespace}:toolfleet:" if self.namespace else "toolfleet:"

    def policies(self) -> ToolPolicies:
        """Load the per-tool policy named by ``config`` (empty policy if none).

        Raises:
            ConfigError: ``TOOLFLEET_CONFIG`` names a missing or invalid file.
        """
        if self.config is not None:
            return ToolPolicies.load(self.config)
        if DEFAULT_CONFIG_PATH.is_file():
            return ToolPolicies.load(DEFAULT_CONFIG_PATH)
        return ToolPolicies()


REDIS_SCHEMES = {"redis", "rediss", "unix", "sentinel"}
"""URL schemes of a Redis server (``sentinel``: the primary the Sentinels name)."""

AMQP_SCHEMES = {"amqp", "amqps", "pyamqp"}
"""URL schemes of an AMQP broker (RabbitMQ)."""


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a Redis server (``redis://``, ``rediss://``, ``unix://``, or
    the primary of ``sentinel://`` Sentinels)."""
    return url.partition("://")[0].lower() in REDIS_SCHEMES


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names Redis Sentinels (``sentinel://``), not a server."""
    return url.partition("://")[0].lower() == "sentinel"


def is_amqp_url(url: str) -> bool:
    """Whether ``url`` names an AMQP broker (``amqp://``, ``amqps://``, ``pyamqp://``)."""
    return url.partition("://")[0].lower() in AMQP_SCHEMES


def settings_error(exc: ValidationError) -> str:
    """One line for settings that do not validate, naming each variable (not its value)."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        field = ".".join(str(part) for part in error["loc"])
        variable = f"TOOLFLEET_{field.upper()}" if field in Settings.model_fields else field
        if field:
            problems.append(f"{variable}: {error['msg'].removeprefix('Value error, ')}")
        else:  # a check of the settings together: its message names the variables
            problems.append(error["msg"].removeprefix("Value error, "))
    return "invalid settings: " + "; ".join(problems)
