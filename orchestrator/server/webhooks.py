"""Webhooks: a finished run, POSTed as JSON to the URL its request named, once.

As LangGraph's server does, a run created with ``"webhook": "https://..."`` has its
outcome POSTed there when it ends: the run (as ``GET .../runs/{id}`` answers it) with its
final ``status``, ``run_started_at``, ``run_ended_at``, ``webhook_sent_at``, the thread's
final ``values`` and, for a failed run, its ``error``.

What toolfleet adds:

- **Where a webhook may go, and what a receiver may cost.** Every try goes through the
  one outbound client (:mod:`orchestrator.server.guards.outbound`): the URL is checked
  when the run is created (a 422 naming ``webhook``) and again on each try (every
  address of the host public, or its host or address listed in
  ``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS`` for that port), the POST goes to the address that
  was checked, ``TOOLFLEET_WEBHOOK_TIMEOUT`` is the deadline of the whole try, the answer
  is read up to a few KiB, and a tenant's tries hold at most its share of the pool.
- **Signed.** With ``TOOLFLEET_WEBHOOK_SECRET`` set, ``X-Toolfleet-Signature`` is
  ``sha256=`` and the hex HMAC-SHA256 of the body under that secret
  (:func:`signature`); ``X-Toolfleet-Delivery`` is the run id, the same on each attempt.
- **Retried, never in the run's way.** Delivery starts once the run has ended (its
  status and event log are written first) in a task of its own: a connection error, a
  try that missed its deadline, a 429 or a 5xx is retried with
  exponential backoff and jitter, up to ``TOOLFLEET_WEBHOOK_ATTEMPTS`` tries. A delivery
  that still fails is logged and counted (``toolfleet_server_webhook_deliveries_total
  {outcome="failed"}`` on ``/metrics``), never retried later and never reflected on the
  run.
- **A cancelled run says so.** As LangGraph's server, the webhook of a cancelled run
  carries ``error: {"error": "UserInterrupt", "message": "User interrupted the run"}``
  (``UserRollback`` and "User requested rollback of the run" for a rollback).
- **Once per run.** The replica that executes a run finishes it, and it claims the
  run's delivery in Redis (``SET NX``) before the first try, so no second path (a second
  finishing, a restart) delivers it again. A receiver that answers after the try's
  timeout may see the same delivery twice: the delivery id tells it so.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import redis.asyncio as aioredis
from prometheus_client import Counter
from redis.exceptions import RedisError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from orchestrator.server.encoding import dumps
from orchestrator.server.guards.outbound import (
    URL_MAX_CHARS,
    AddressRefused,
    Allowlist,
    Answer,
    Outbound,
    Target,
    check_url,
)
from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord, now_iso
from orchestrator.server.runconfig import thread_config
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.settings import Settings

if TYPE_CHECKING:
    from orchestrator.server.graphs import Graphs

log = logging.getLogger("toolfleet.server")

SIGNATURE_HEADER = "X-Toolfleet-Signature"
DELIVERY_HEADER = "X-Toolfleet-Delivery"

BACKOFF_MAX = 30.0
"""Longest wait between two tries of a delivery, in seconds."""

WebhookRefused = AddressRefused
"""Raised when a run's webhook URL may not be called; a 422 naming the field."""

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "URL_MAX_CHARS",
    "Allowlist",
    "ReceiverError",
    "Target",
    "WebhookPolicy",
    "WebhookRefused",
    "WebhookSender",
    "cancelled_error",
    "final_values",
    "payload",
    "signature",
]


class ReceiverError(Exception):
    """Raised when a receiver answered a try with a redirect or an error status."""

    def __init__(self, answer: Answer) -> None:
        what = "redirects are not followed" if answer.is_redirect else "not a success"
        super().__init__(f"webhook answered {answer.status_code}: {what}")
        self.status_code = answer.status_code


def signature(secret: str | bytes, body: bytes) -> str:
    """The ``X-Toolfleet-Signature`` of ``body``: ``sha256=`` and its hex HMAC-SHA256
    under ``secret``. A receiver recomputes it over the raw body it got and compares the
    two with ``hmac.compare_digest``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


class WebhookPolicy:
    """Which webhook URLs may be called.

    Args:
        allowed: Hosts allowed although not public (``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS``).
    """

    def __init__(self, allowed: Allowlist) -> None:
        self.allowed = allowed

    async def check(self, url: str) -> Target:
        """Resolve ``url``'s host and check each of its addresses.

        Raises:
            WebhookRefused: see :func:`orchestrator.server.guards.outbound.check_url`.
        """
        return await check_url(url, self.allowed, "webhook")


async def final_values(graphs: Graphs, run: RunRecord) -> Any:
    """The values of the run's thread as the run left them (``None`` if unreadable)."""
    try:
        source = graphs.find(str(run.metadata.get("graph_id", ""))) or graphs.default
        graph = await source.for_thread(run.thread_key)
        snapshot = await graph.aget_state(thread_config(run.thread_key))
    except Exception as exc:  # the webhook still goes, without values
        log.warning("run %s: no final values for its webhook (%r)", run.run_id, exc)
        return None
    return snapshot.values


def payload(
    run: RunRecord,
    status: str,
    error: dict[str, Any] | None,
    started_at: str,
    ended_at: str,
    values: Any,
) -> dict[str, Any]:
    """What a run's webhook receives: the run, as LangGraph's server sends it."""
    body: dict[str, Any] = {
        **run.to_api(),
        "status": status,
        "updated_at": ended_at,
        "run_started_at": started_at,
        "run_ended_at": ended_at,
        "webhook_sent_at": now_iso(),
        "values": values,
    }
    if error is not None:
        body["error"] = error
    return body


def cancelled_error(rolled_back: bool = False, reason: str | None = None) -> dict[str, str]:
    """The ``error`` of a cancelled run's webhook, as LangGraph's server sends it: its
    cancellation, ``UserInterrupt`` (or ``UserRollback``), with the cancel request's
    reason as the message (or the exception's own text)."""
    if rolled_back:
        return {"error": "UserRollback", "message": reason or "User requested rollback of the run"}
    return {"error": "UserInterrupt", "message": reason or "User interrupted the run"}


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # timeouts and connection errors
        return True
    if isinstance(exc, ReceiverError):
        return exc.status_code >= 500 or exc.status_code == 429
    return False


class WebhookSender:
    """Delivers the webhooks of this replica's runs.

    Args:
        client: ``redis.asyncio`` client (string responses): the delivery claims.
        keys: Key names of the deployment.
        settings: ``webhook_*`` settings (allowed hosts, secret, timeout, tries) and the
            run record's expiry (the claims expire with it).
        transport: An httpx transport (tests); default: httpx's own.

    Raises:
        ConfigError: an entry of ``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS`` is malformed.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._r: Any = client
        self._prefix = f"{keys.base}webhook-sent:"
        self._claim_ttl = settings.run_ttl
        try:
            allowed = Allowlist.parse(settings.webhook_allowed_hosts)
        except ValueError as exc:
            raise ConfigError(f"TOOLFLEET_WEBHOOK_ALLOWED_HOSTS: {exc}") from None
        self.policy = WebhookPolicy(allowed)
        self._secret = settings.webhook_secret
        self.timeout = settings.webhook_timeout
        self.attempts = settings.webhook_attempts
        self.backoff = 1.0
        """Seconds of the first wait between tries (doubled each time, with jitter)."""
        self.outbound = Outbound(allowed, "webhook", transport)
        self._tasks: set[asyncio.Task[None]] = set()
        self.deliveries = Counter(
            "toolfleet_server_webhook_deliveries",
            "Webhook deliveries this replica ended, by outcome (delivered, failed).",
            ["outcome"],
            registry=None,
        )

    async def check(self, url: str) -> None:
        """Refuse a URL no delivery could go to (at run creation).

        Raises:
            WebhookRefused: see :meth:`WebhookPolicy.check`.
        """
        await self.policy.check(url)

    def send(self, url: str, body: dict[str, Any], tenant: str = "") -> None:
        """Deliver ``body`` (a run's :func:`payload`) to ``url`` in a task of its own,
        on ``tenant``'s share of the outbound pool."""
        task = asyncio.get_running_loop().create_task(
            self._deliver(url, body, tenant), name=f"toolfleet-webhook-{body.get('run_id')}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, grace: float = 5.0) -> None:
        """Let deliveries under way finish for up to ``grace`` seconds, then stop them."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.outbound.aclose()

    async def _claim(self, run_id: str) -> bool:
        key = f"{self._prefix}{run_id}"
        return bool(await self._r.set(key, now_iso(), nx=True, ex=self._claim_ttl))

    async def _deliver(self, url: str, body: dict[str, Any], tenant: str) -> None:
        run_id = str(body.get("run_id"))
        try:
            if not await self._claim(run_id):
                log.info("webhook of run %s already delivered or under way", run_id)
                return
            await self._post(url, body, run_id, tenant)
        except asyncio.CancelledError:
            self.deliveries.labels("failed").inc()
            log.warning("webhook of run %s to %s stopped at shutdown", run_id, _shown(url))
            raise
        except (httpx.HTTPError, ReceiverError, WebhookRefused, RedisError, OSError) as exc:
            self.deliveries.labels("failed").inc()
            log.warning(
                "webhook of run %s to %s failed after its tries: %s", run_id, _shown(url), exc
            )
        else:
            self.deliveries.labels("delivered").inc()
            log.info("webhook of run %s delivered to %s", run_id, _shown(url))

    async def _post(self, url: str, body: dict[str, Any], run_id: str, tenant: str) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(initial=self.backoff, max=BACKOFF_MAX),
            retry=retry_if_exception(_retriable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                content = dumps({**body, "webhook_sent_at": now_iso()})
                headers = {"Content-Type": "application/json", DELIVERY_HEADER: run_id}
                if self._secret:
                    headers[SIGNATURE_HEADER] = signature(self._secret, content)
                # Checked again on each try (inside it): the host may resolve elsewhere.
                answer = await self.outbound.post(
                    url, tenant=tenant, deadline=self.timeout, content=content, headers=headers
                )
                if answer.is_redirect or answer.status_code >= 400:
                    raise ReceiverError(answer)


def _shown(url: str) -> str:
    """The URL as logged: scheme, host and path (no credentials or query)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
