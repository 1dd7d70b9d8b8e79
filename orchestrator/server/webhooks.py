"""Webhooks: a finished run, POSTed as JSON to the URL its request named, once.

As LangGraph's server does, a run created with ``"webhook": "https://..."`` has its
outcome POSTed there when it ends: the run (as ``GET .../runs/{id}`` answers it) with its
final ``status``, ``run_started_at``, ``run_ended_at``, ``webhook_sent_at``, the thread's
final ``values`` and, for a failed run, its ``error``.

What toolfleet adds:

- **Where a webhook may go.** The URL is checked when the run is created (a 422 naming
  ``webhook``) and again before each delivery: its host is resolved and *every* address
  must be a public one; a loopback, private, link-local or otherwise reserved address is
  refused unless ``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS`` lists the host name, the address, or
  a network holding it. The POST goes to the address that was checked (the host name
  stays in ``Host`` and in TLS), so a name that resolves elsewhere the second time
  cannot lead it to an internal address. Redirects are not followed.
- **Signed.** With ``TOOLFLEET_WEBHOOK_SECRET`` set, ``X-Toolfleet-Signature`` is
  ``sha256=`` and the hex HMAC-SHA256 of the body under that secret
  (:func:`signature`); ``X-Toolfleet-Delivery`` is the run id, the same on each attempt.
- **Retried, never in the run's way.** Delivery starts once the run has ended (its
  status and event log are written first) in a task of its own: a connection error, a
  timeout (``TOOLFLEET_WEBHOOK_TIMEOUT`` a try), a 429 or a 5xx is retried with
  exponential backoff and jitter, up to ``TOOLFLEET_WEBHOOK_ATTEMPTS`` tries. A delivery
  that still fails is logged and counted (``toolfleet_server_webhook_deliveries_total
  {outcome="failed"}`` on ``/metrics``), never retried later and never reflected on the
  run.
- **Once per run.** The replica that executes a run finishes it, and it claims the
  run's delivery in Redis (``SET NX``) before the first try, so no second path (a second
  finishing, a restart) delivers it again. A receiver that answers after the try's
  timeout may see the same delivery twice: the delivery id tells it so.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
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
from orchestrator.server.errors import Unsupported
from orchestrator.server.keys import Keys
from orchestrator.server.records import RunRecord, now_iso
from orchestrator.server.runconfig import thread_config
from tool_workers.contract.settings import Settings

if TYPE_CHECKING:
    from orchestrator.server.graphs import Graphs

log = logging.getLogger("toolfleet.server")

SIGNATURE_HEADER = "X-Toolfleet-Signature"
DELIVERY_HEADER = "X-Toolfleet-Delivery"

URL_MAX_CHARS = 4096
"""Longest webhook URL accepted (LangGraph's server's default bound)."""

RESOLVE_SECONDS = 5.0
"""Longest wait for a webhook host's addresses."""

BACKOFF_MAX = 30.0
"""Longest wait between two tries of a delivery, in seconds."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebhookRefused(Unsupported):
    """Raised when a run's webhook URL may not be called (its host, or an address of
    it, is not allowed); a 422 naming the field."""


def signature(secret: str | bytes, body: bytes) -> str:
    """The ``X-Toolfleet-Signature`` of ``body``: ``sha256=`` and its hex HMAC-SHA256
    under ``secret``. A receiver recomputes it over the raw body it got and compares the
    two with ``hmac.compare_digest``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Allowlist:
    """Hosts a webhook may name although they resolve to non-public addresses.

    Args:
        names: Host names, lower-cased.
        networks: Addresses and networks (an address is a network of one).
    """

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """From ``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS``'s entries: a host name, an IP
        address, or a network in CIDR form (``10.0.0.0/8``)."""
        names: set[str] = set()
        networks: list[Network] = []
        for entry in entries:
            text = entry.strip().strip("[]").lower()
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                names.add(text.rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        """Whether ``address`` (an address of ``host``) may be called."""
        if host.lower().rstrip(".") in self.names:
            return True
        if address.is_global and not address.is_multicast:
            return True
        return any(address in network for network in self.networks)


def _address(text: str) -> Address:
    address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # judged as the IPv4 address it reaches
    return address


@dataclass(frozen=True)
class Target:
    """A checked webhook URL and the address it is called at."""

    url: str
    host: str
    address: Address

    def pinned(self) -> tuple[str, dict[str, str], dict[str, Any]]:
        """The URL with its host replaced by the checked address, the ``Host`` header,
        and the request extensions that keep TLS checking the host name."""
        parts = urlsplit(self.url)
        shown = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        netloc = shown if parts.port is None else f"{shown}:{parts.port}"
        url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        host_header = parts.netloc.rpartition("@")[2]
        extensions: dict[str, Any] = {}
        if parts.scheme == "https":
            extensions["sni_hostname"] = self.host
        return url, {"Host": host_header}, extensions


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
            WebhookRefused: not an http(s) URL with a host, the host does not resolve,
                or one of its addresses is not public and not allowed.
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise WebhookRefused(f"webhook: not a URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebhookRefused("webhook: an http:// or https:// URL with a host is needed")
        if len(url) > URL_MAX_CHARS:
            raise WebhookRefused(f"webhook: longer than {URL_MAX_CHARS} characters")
        host = parts.hostname
        port = port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
                RESOLVE_SECONDS,
            )
        except (OSError, UnicodeError, TimeoutError) as exc:
            raise WebhookRefused(f"webhook: host {host!r} does not resolve ({exc})") from None
        addresses = [_address(str(info[4][0])) for info in infos]
        if not addresses:
            raise WebhookRefused(f"webhook: host {host!r} has no address")
        for address in addresses:
            if not self.allowed.allows(host, address):
                raise WebhookRefused(
                    f"webhook: host {host!r} resolves to {address}, which is not a public "
                    "address; list the host in TOOLFLEET_WEBHOOK_ALLOWED_HOSTS to allow it"
                )
        return Target(url, host, addresses[0])


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


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):  # timeouts and connection errors
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return False


class WebhookSender:
    """Delivers the webhooks of this replica's runs.

    Args:
        client: ``redis.asyncio`` client (string responses): the delivery claims.
        keys: Key names of the deployment.
        settings: ``webhook_*`` settings (allowed hosts, secret, timeout, tries) and the
            run record's expiry (the claims expire with it).
        transport: An httpx transport (tests); default: httpx's own.
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
        self.policy = WebhookPolicy(Allowlist.parse(settings.webhook_allowed_hosts))
        self._secret = settings.webhook_secret
        self.timeout = settings.webhook_timeout
        self.attempts = settings.webhook_attempts
        self.backoff = 1.0
        """Seconds of the first wait between tries (doubled each time, with jitter)."""
        self._http = httpx.AsyncClient(
            timeout=self.timeout, follow_redirects=False, trust_env=False, transport=transport
        )
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

    def send(self, url: str, body: dict[str, Any]) -> None:
        """Deliver ``body`` (a run's :func:`payload`) to ``url`` in a task of its own."""
        task = asyncio.get_running_loop().create_task(
            self._deliver(url, body), name=f"toolfleet-webhook-{body.get('run_id')}"
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
        await self._http.aclose()

    async def _claim(self, run_id: str) -> bool:
        key = f"{self._prefix}{run_id}"
        return bool(await self._r.set(key, now_iso(), nx=True, ex=self._claim_ttl))

    async def _deliver(self, url: str, body: dict[str, Any]) -> None:
        run_id = str(body.get("run_id"))
        try:
            if not await self._claim(run_id):
                log.info("webhook of run %s already delivered or under way", run_id)
                return
            await self._post(url, body, run_id)
        except asyncio.CancelledError:
            self.deliveries.labels("failed").inc()
            log.warning("webhook of run %s to %s stopped at shutdown", run_id, _shown(url))
            raise
        except (httpx.HTTPError, WebhookRefused, RedisError, OSError) as exc:
            self.deliveries.labels("failed").inc()
            log.warning(
                "webhook of run %s to %s failed after its tries: %s", run_id, _shown(url), exc
            )
        else:
            self.deliveries.labels("delivered").inc()
            log.info("webhook of run %s delivered to %s", run_id, _shown(url))

    async def _post(self, url: str, body: dict[str, Any], run_id: str) -> None:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(initial=self.backoff, max=BACKOFF_MAX),
            retry=retry_if_exception(_retriable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                # Checked again on each try: the host may resolve elsewhere by now.
                target = await self.policy.check(url)
                address, headers, extensions = target.pinned()
                content = dumps({**body, "webhook_sent_at": now_iso()})
                headers["Content-Type"] = "application/json"
                headers[DELIVERY_HEADER] = run_id
                if self._secret:
                    headers[SIGNATURE_HEADER] = signature(self._secret, content)
                response = await self._http.post(
                    address, content=content, headers=headers, extensions=extensions
                )
                if response.is_redirect:
                    raise httpx.HTTPStatusError(
                        f"webhook answered {response.status_code}: redirects are not followed",
                        request=response.request,
                        response=response,
                    )
                response.raise_for_status()


def _shown(url: str) -> str:
    """The URL as logged: scheme, host and path (no credentials or query)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
