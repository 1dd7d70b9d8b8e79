"""The one HTTP client of ``toolfleet serve`` for addresses its users name.

A webhook URL (and whatever user-named address comes next) is called through
:class:`Outbound` alone, which bounds what a receiver can cost the service:

- **Where.** The host is resolved and *every* address checked (:func:`is_public`): a
  loopback, private, link-local, multicast or otherwise special-purpose address is
  refused, also when an IPv6 address embeds it (IPv4-mapped and IPv4-compatible forms,
  NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``; the local-use NAT64 ``64:ff9b:1::/48`` and
  Teredo always), unless :class:`Allowlist` (``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS``) lets
  that host or address in on that port. The request goes to the address that was
  checked (no second resolution between check and connect); the host name stays in
  ``Host`` and is what TLS verifies. Redirects are not followed.
- **How long.** One deadline covers a whole try: resolution, the wait for a
  connection, connect, send and reading the answer. A receiver that trickles its answer
  a byte at a time is cut at the deadline, as one that never answers.
- **How much.** The answer is streamed and only its first :data:`ANSWER_BYTES` kept;
  the rest is not read (the connection is closed instead).
- **How many.** The pool has :data:`POOL_CONNECTIONS` connections; a tenant's tries
  hold at most :data:`TENANT_SHARE` of them at once (the others wait their turn, within
  their deadline), so one tenant's hung receivers cannot take the others' connections.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from orchestrator.server.errors import Unsupported

__all__ = [
    "ANSWER_BYTES",
    "POOL_CONNECTIONS",
    "RESOLVE_SECONDS",
    "TENANT_SHARE",
    "URL_MAX_CHARS",
    "AddressRefused",
    "Allowlist",
    "Answer",
    "DeadlineExceeded",
    "Outbound",
    "Target",
    "check_url",
    "embedded_ipv4",
    "is_public",
]

URL_MAX_CHARS = 4096
"""Longest URL accepted (LangGraph's server's default bound for webhooks)."""

RESOLVE_SECONDS = 5.0
"""Longest wait for a host's addresses (within the try's deadline)."""

ANSWER_BYTES = 4096
"""Bytes of an answer's body kept; the rest is never read."""

POOL_CONNECTIONS = 100
"""Connections the client holds at most, all tenants together."""

TENANT_SHARE = 0.25
"""Share of :data:`POOL_CONNECTIONS` one tenant's tries may hold at once."""

DEFAULT_PORTS = frozenset({80, 443})
"""Ports an allow-list entry written without a port allows."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_REFUSED: tuple[Network, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated, RFC 7526): any relay's hosts
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): a network's own translation
        "2001::/32",  # Teredo: the client address is hidden in it
        "::/96",  # IPv4-compatible, judged by the embedded address when it has one
    )
)


class AddressRefused(Unsupported):
    """Raised when a user-named URL may not be called (not an http(s) URL, its host
    does not resolve, or an address of it is not allowed); a 422 naming the field."""


class DeadlineExceeded(httpx.TimeoutException):
    """Raised when a try did not end within its deadline."""


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches (IPv4-mapped, IPv4-compatible, NAT64
    ``64:ff9b::/96``, 6to4), or ``None``."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    value = int(address)
    if address in _NAT64 or (value >> 32 == 0 and value > 1):
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


def is_public(address: Address) -> bool:
    """Whether ``address`` is a public unicast address, judged by the IPv4 address it
    embeds when it embeds one, and never one of the special-purpose ranges Python's
    ``is_global`` lets through (``192.88.99.0/24``, ``64:ff9b:1::/48``, multicast)."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return is_public(inner)
    if any(address in network for network in _REFUSED if network.version == address.version):
        return False
    return address.is_global and not address.is_multicast and not address.is_reserved


@dataclass(frozen=True)
class _Entry:
    name: str | None
    network: Network | None
    port: int | None  # None: 80 and 443; 0: any

    def matches(self, host: str, port: int, addresses: Iterable[Address]) -> bool:
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.port and port != self.port:
            return False
        if self.name is not None:
            return host == self.name
        return any(a in self.network for a in addresses if a.version == self.network.version)  # type: ignore[operator,union-attr]


def _split_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; ``*`` is port 0 (any)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, None  # a bare IPv6 address or network
    if port_text is None:
        return host, None
    if port_text == "*":
        return host, 0
    port = int(port_text)  # ValueError for a name
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    return host, port


@dataclass(frozen=True)
class Allowlist:
    """Hosts and addresses that may be called although not public, each on its ports.

    Entries (``TOOLFLEET_WEBHOOK_ALLOWED_HOSTS``) are a host name, an IP address or a
    network in CIDR form, each bare (ports 80 and 443 only), with ``:port`` (that port)
    or with ``:*`` (any port); an IPv6 address with a port is written ``[::1]:8080``.
    """

    entries: tuple[_Entry, ...] = field(default=())

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """From the setting's entries.

        Raises:
            ValueError: an entry's port is not a number from 1 to 65535 or ``*``.
        """
        parsed: list[_Entry] = []
        for entry in entries:
            text = entry.strip().lower()
            if not text:
                continue
            try:
                host, port = _split_port(text)
            except ValueError as exc:
                raise ValueError(f"allowed host {entry!r}: {exc}") from None
            try:
                parsed.append(_Entry(None, ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                parsed.append(_Entry(host.rstrip("."), None, port))
        return cls(tuple(parsed))

    def allows(self, host: str, port: int, address: Address) -> bool:
        """Whether ``address`` (an address of ``host``) may be called on ``port``."""
        if is_public(address):
            return True
        forms = [address, *([inner] if (inner := embedded_ipv4(address)) else [])]
        name = host.lower().rstrip(".")
        # An address embedded by translation (NAT64, 6to4) is reached through a gateway
        # the entry does not name: only the mapped form counts as the address itself.
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
            forms = [address]
        return any(entry.matches(name, port, forms) for entry in self.entries)


@dataclass(frozen=True)
class Target:
    """A checked URL and the address it is called at."""

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


@dataclass(frozen=True)
class Answer:
    """What a receiver answered: its status, headers and at most :data:`ANSWER_BYTES`
    of its body."""

    status_code: int
    headers: Mapping[str, str]
    body: bytes
    cut: bool
    """Whether the body went on past what was kept (it was not read)."""

    @property
    def is_redirect(self) -> bool:
        return 300 <= self.status_code < 400 and "location" in self.headers


def _address(text: str) -> Address:
    return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone


async def check_url(url: str, allowed: Allowlist, what: str = "webhook") -> Target:
    """Resolve ``url``'s host and check each of its addresses on its port.

    Args:
        url: The URL a user named.
        allowed: Hosts allowed although not public.
        what: The request field it came from, named in refusals.

    Raises:
        AddressRefused: not an http(s) URL with a host, the host does not resolve, or
            one of its addresses is not allowed.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AddressRefused(f"{what}: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AddressRefused(f"{what}: an http:// or https:// URL with a host is needed")
    if len(url) > URL_MAX_CHARS:
        raise AddressRefused(f"{what}: longer than {URL_MAX_CHARS} characters")
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.wait_for(
            asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM),
            RESOLVE_SECONDS,
        )
    except (OSError, UnicodeError, TimeoutError) as exc:
        raise AddressRefused(f"{what}: host {host!r} does not resolve ({exc})") from None
    addresses = [_address(str(info[4][0])) for info in infos]
    if not addresses:
        raise AddressRefused(f"{what}: host {host!r} has no address")
    for address in addresses:
        if not allowed.allows(host, port, address):
            raise AddressRefused(
                f"{what}: host {host!r} resolves to {address} (port {port}), which is "
                "not a public address; list the host (with its port unless 80 or 443) "
                "in TOOLFLEET_WEBHOOK_ALLOWED_HOSTS to allow it"
            )
    return Target(url, host, addresses[0])


class Outbound:
    """The HTTP client for user-named addresses.

    Args:
        allowed: Hosts allowed although not public, each on its ports.
        field: The request field the URLs come from, named in refusals.
        transport: An httpx transport (tests); default: httpx's own.
    """

    def __init__(
        self,
        allowed: Allowlist,
        field: str = "webhook",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.allowed = allowed
        self.field = field
        self.tenant_slots = max(1, int(POOL_CONNECTIONS * TENANT_SHARE))
        limits = httpx.Limits(max_connections=POOL_CONNECTIONS, max_keepalive_connections=20)
        self._http = httpx.AsyncClient(
            limits=limits,
            timeout=None,  # the try's deadline bounds it all
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    async def check(self, url: str) -> Target:
        """Resolve ``url``'s host and check each of its addresses on its port.

        Raises:
            AddressRefused: see :func:`check_url`.
        """
        return await check_url(url, self.allowed, self.field)

    async def post(
        self,
        url: str,
        *,
        tenant: str,
        deadline: float,
        content: bytes,
        headers: Mapping[str, str],
    ) -> Answer:
        """One try: POST ``content`` to ``url``, checked and pinned, within ``deadline``
        seconds in all, on one of ``tenant``'s share of the pool.

        Raises:
            AddressRefused: see :meth:`check`.
            DeadlineExceeded: the try did not end within ``deadline``.
            httpx.TransportError: the connection failed.
        """
        try:
            async with asyncio.timeout(deadline):
                async with self._share(tenant):
                    target = await self.check(url)
                    return await self._send(target, content, headers)
        except TimeoutError:
            raise DeadlineExceeded(f"no answer within the {deadline:g} s deadline") from None

    async def _send(self, target: Target, content: bytes, headers: Mapping[str, str]) -> Answer:
        address, sent, extensions = target.pinned()
        request = self._http.build_request(
            "POST", address, content=content, headers={**sent, **headers}, extensions=extensions
        )
        response = await self._http.send(request, stream=True)
        try:
            body = bytearray()
            cut = False
            async for chunk in response.aiter_raw():
                room = ANSWER_BYTES - len(body)
                body += chunk[:room]
                if len(chunk) > room:
                    cut = True
                    break  # the rest is never read: closing drops the connection
            return Answer(response.status_code, dict(response.headers), bytes(body), cut)
        finally:
            await response.aclose()

    @asynccontextmanager
    async def _share(self, tenant: str) -> AsyncIterator[None]:
        """Holds one of ``tenant``'s slots; the tenant's semaphore goes when no try of
        it holds or waits for one (a tenant seen once costs nothing after)."""
        slots = self._slots.setdefault(tenant, asyncio.Semaphore(self.tenant_slots))
        self._users[tenant] = self._users.get(tenant, 0) + 1
        try:
            async with slots:
                yield
        finally:
            self._users[tenant] -= 1
            if not self._users[tenant]:
                del self._users[tenant], self._slots[tenant]

    async def aclose(self) -> None:
        """Close the pool's connections."""
        await self._http.aclose()
