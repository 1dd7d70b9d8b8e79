"""The network-fault harness itself: hosts reach each other, cuts drop what they say, a
killed host runs nothing, the delay proxy delays, and nothing outlives the test."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from orchestrator.bench.delay_proxy import DelayProxy
from tests.support.netns import Host, NetnsUnavailable, TestNet, require_netns, run

pytestmark = pytest.mark.timeout(90)

ECHO_PORT = 7007

# A one-connection-at-a-time TCP echo server, bounded to 120 s of life.
ECHO_SERVER = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], {ECHO_PORT})); s.listen(8); s.settimeout(1)
end = time.monotonic() + 120
while time.monotonic() < end:
    try:
        c, _ = s.accept()
    except TimeoutError:
        continue
    c.settimeout(5)
    try:
        while data := c.recv(65536):
            c.sendall(data)
    except OSError:
        pass
    c.close()
"""

# Send one UDP datagram to argv[1]:argv[2].
UDP_SEND = "import socket, sys; socket.socket(2, 2).sendto(b'hi', (sys.argv[1], int(sys.argv[2])))"


def start_echo(host: Host) -> None:
    host.popen([sys.executable, "-c", ECHO_SERVER, host.address])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if echo(host.address, timeout=0.5):
            return
        time.sleep(0.1)
    raise AssertionError(f"echo server on {host.name} did not start")


def echo(address: str, port: int = ECHO_PORT, timeout: float = 2.0) -> bool:
    """Whether a round trip to the echo server at ``address`` works within ``timeout``."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as conn:
            conn.sendall(b"ping")
            return conn.recv(16) == b"ping"
    except OSError:
        return False


def udp_reaches_root(net: TestNet, host: Host) -> bool:
    """Whether a datagram ``host`` sends reaches the test process."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((net.gateway, 0))
        sock.settimeout(1.0)
        port = sock.getsockname()[1]
        subprocess.run([*host.prefix(), sys.executable, "-c", UDP_SEND, net.gateway, str(port)],
                       check=True, timeout=15)  # fmt: skip
        try:
            return sock.recv(16) == b"hi"
        except TimeoutError:
            return False


def test_a_cut_drops_the_directions_it_names_and_heal_restores_them(net: TestNet) -> None:
    """Given a host serving TCP, when its link is cut one way or both, then traffic in the
    cut direction is dropped (the other still flows), and a heal restores both."""
    host = net.add_host("a")
    start_echo(host)
    assert udp_reaches_root(net, host)

    net.cut(host, "in")
    assert not echo(host.address, timeout=1.0)
    assert udp_reaches_root(net, host)  # host -> root still flows
    net.heal()
    assert echo(host.address)

    net.cut(host, "out")
    assert not echo(host.address, timeout=1.0)
    assert not udp_reaches_root(net, host)
    net.heal()
    assert echo(host.address)

    net.cut(host, "both")
    assert not echo(host.address, timeout=1.0)
    assert not udp_reaches_root(net, host)
    net.heal()
    assert echo(host.address)
    assert udp_reaches_root(net, host)


def test_hosts_reach_each_other_and_a_cut_isolates_only_its_host(net: TestNet) -> None:
    """Given two hosts, when one is cut off, then the other still reaches the test process."""
    a, b = net.add_host("a"), net.add_host("b")
    start_echo(a)
    start_echo(b)
    net.cut(a)
    assert not echo(a.address, timeout=1.0)
    assert echo(b.address)


def test_killing_a_host_stops_every_process_on_it(net: TestNet) -> None:
    """Given processes on a host (one of them forked in the background), when the host is
    killed, then none of them runs any more."""
    host = net.add_host("a")
    host.popen(["sh", "-c", "sleep 60 & sleep 60"])
    host.popen(["sleep", "60"])
    deadline = time.monotonic() + 10
    while len(host.pids()) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(host.pids()) >= 3

    host.kill()

    assert host.pids() == []
    assert all(p.poll() is not None for p in host.processes)


def test_close_removes_every_namespace_even_when_the_test_fails() -> None:
    """Given a network with hosts, when the block using it raises, then its namespaces, its
    bridge and the root namespace's veth are gone."""
    net = TestNet()
    with pytest.raises(RuntimeError, match="boom"), net:
        net.add_host("a").popen(["sleep", "60"])
        net.add_host("b")
        assert len(net.leftovers()) == 3
        raise RuntimeError("boom")
    assert net.leftovers() == []
    assert f"tf{net.id}r" not in run("ip", "-o", "link", "show")


def test_the_delay_proxy_adds_its_delay_to_each_round_trip(net: TestNet) -> None:
    """Given an echo server behind a 50 ms delay proxy, then a round trip takes at least
    100 ms through the proxy (and far less without it)."""
    host = net.add_host("a")
    start_echo(host)
    trips = []
    with DelayProxy(host.address, ECHO_PORT, delay=0.05, listen_host=net.gateway) as proxy:
        conn = socket.create_connection((net.gateway, proxy.port), timeout=5)
        with conn:
            for _ in range(5):
                t0 = time.perf_counter()
                conn.sendall(b"ping")
                assert conn.recv(16) == b"ping"
                trips.append(time.perf_counter() - t0)
    assert min(trips) >= 0.1, trips
    with socket.create_connection((host.address, ECHO_PORT), timeout=5) as conn:
        t0 = time.perf_counter()
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
        assert time.perf_counter() - t0 < 0.1


def test_without_root_the_harness_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where namespaces cannot be created, the harness fails with the reason (never skips)."""
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable, match="need root"):
        require_netns()
