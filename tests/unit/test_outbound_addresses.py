"""Which addresses the outbound client may call, and the allow list's ports."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

import orchestrator
from orchestrator.server.guards.outbound import Allowlist, is_public


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a00:1",  # local-use NAT64 (RFC 8215)
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::a00:1",  # IPv4-compatible 10.0.0.1
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "192.88.99.1",  # 6to4 relay anycast
        "ff02::1",  # multicast
        "224.0.0.1",
        "2001::1",  # Teredo
        "100.64.0.1",
        "0.0.0.0",
        "::",
        "::1",
        "fe80::1",
        "fd00::1",
        "198.18.0.1",
        "240.0.0.1",
    ],
)
def test_internal_addresses_and_ipv6_forms_embedding_them_are_refused(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))
    assert not Allowlist.parse([]).allows("host.example", 443, ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1"]
)
def test_public_addresses_pass_on_any_port(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))
    assert Allowlist.parse([]).allows("host.example", 8443, ipaddress.ip_address(address))


def test_a_bare_allow_list_entry_allows_ports_80_and_443_only() -> None:
    allow = Allowlist.parse(["127.0.0.2", "hooks.internal", "10.20.0.0/16", "[::1]"])
    loop2 = ipaddress.ip_address("127.0.0.2")
    assert allow.allows("x", 80, loop2) and allow.allows("x", 443, loop2)
    assert not allow.allows("x", 6379, loop2) and not allow.allows("x", 5432, loop2)
    assert allow.allows("hooks.internal", 443, ipaddress.ip_address("10.9.9.9"))
    assert not allow.allows("hooks.internal", 8080, ipaddress.ip_address("10.9.9.9"))
    assert allow.allows("x", 443, ipaddress.ip_address("10.20.3.4"))
    assert not allow.allows("x", 443, ipaddress.ip_address("10.21.0.1"))
    assert allow.allows("x", 80, ipaddress.ip_address("::1"))
    assert not allow.allows("x", 80, ipaddress.ip_address("127.0.0.1"))


def test_an_entry_with_a_port_allows_that_port_and_star_any() -> None:
    allow = Allowlist.parse(
        ["127.0.0.2:8080", "Hooks.Internal.:9000", "[::1]:7000", "10.0.0.0/8:*"]
    )
    loop2 = ipaddress.ip_address("127.0.0.2")
    assert allow.allows("x", 8080, loop2)
    assert not allow.allows("x", 80, loop2) and not allow.allows("x", 6379, loop2)
    assert allow.allows("hooks.internal", 9000, ipaddress.ip_address("10.1.1.1"))
    assert allow.allows("x", 7000, ipaddress.ip_address("::1"))
    assert not allow.allows("x", 7001, ipaddress.ip_address("::1"))
    assert allow.allows("x", 6379, ipaddress.ip_address("10.3.3.3"))


def test_an_allowed_address_is_also_matched_in_its_ipv6_embedding() -> None:
    allow = Allowlist.parse(["127.0.0.2:8080"])
    assert allow.allows("x", 8080, ipaddress.ip_address("::ffff:127.0.0.2"))
    assert not allow.allows("x", 8080, ipaddress.ip_address("64:ff9b::7f00:3"))


def test_a_malformed_entry_is_refused_at_start() -> None:
    for entry in ("127.0.0.1:http", "host:70000"):
        with pytest.raises(ValueError):
            Allowlist.parse([entry])


def test_only_the_outbound_guard_makes_an_http_client_for_the_network() -> None:
    """The service's one client for user-named addresses is the guard's: no other
    module of the orchestrator builds an httpx client (the in-process MCP surface calls
    the service's own routes over an ASGI transport)."""
    root = Path(orchestrator.__file__).parent
    makers = re.compile(r"httpx\.(Async)?Client\(")
    found = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if makers.search(path.read_text(encoding="utf-8"))
    }
    assert found == {"server/guards/outbound.py", "server/mcp.py"}
    assert "ASGITransport(app=self._app)" in (root / "server/mcp.py").read_text()
