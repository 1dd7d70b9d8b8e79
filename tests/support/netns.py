r"""Hosts on a private test network: network namespaces joined by a bridge, with link faults.

A :class:`TestNet` is one switch and the hosts plugged into it, all created for one test
and all removed when it ends::

    root namespace (the test process)      switch namespace            host namespaces
      tf<id>r 10.A.B.1 ---- veth ---- p0 \                          /---- eth0 10.A.B.2  (redis)
                                          br0 (nftables bridge filter) ---- eth0 10.A.B.3  (w1)
                                                                     \---- eth0 10.A.B.4  (w2)

The bridge and its drop rules live in the switch namespace, so no rule ever touches the
machine's own network stack; the only thing in the root namespace is one veth end with an
address on the test subnet (the test process talks to its hosts through it, as an
orchestrator would). A fault is a drop rule on a host's bridge port: ``cut(host, "in")``
drops what reaches the host, ``"out"`` what it sends, ``"both"`` both; :meth:`heal`
removes them. :meth:`Host.kill` SIGKILLs every process in a host's namespace, as a
reclaimed machine would stop.

Needs root (``CAP_NET_ADMIN``), ``ip`` (iproute2) and ``nft`` (nftables, which ``.ci/run``
installs): where they are missing, :func:`require_netns` fails the test with the reason.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

Direction = Literal["in", "out", "both"]

COMMAND_TIMEOUT = 15.0
"""Seconds any one ``ip``/``nft`` command may take."""

MAX_HOSTS = 200
"""Hosts per test network (the subnet is a /24; .1 is the root namespace's end)."""


class NetnsUnavailable(RuntimeError):
    """Raised when this machine cannot create network namespaces, bridges or drop rules."""


def run(*cmd: str, check: bool = True, input: str | None = None) -> str:
    """Run one network command (bounded in time); its stdout.

    Raises:
        NetnsUnavailable: the command failed (``check``) or did not finish in time.
    """
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, input=input
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsUnavailable(f"{' '.join(cmd)}: {exc!r}") from exc
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def require_netns() -> None:
    """Check that network namespaces, bridges and nftables can be used here.

    Raises:
        NetnsUnavailable: naming what is missing (not root, no ``ip``, no ``nft``).
    """
    if os.geteuid() != 0:
        raise NetnsUnavailable("the network-fault tests need root (CAP_NET_ADMIN)")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(
                f"'{tool}' is not installed (apt-get install {package}; .ci/run does this)"
            )


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 no interface of the root namespace uses."""
    used = run("ip", "-4", "-o", "addr", "show")
    for _ in range(64):
        net = ipaddress.IPv4Network(f"10.{random.randint(200, 207)}.{random.randint(0, 255)}.0/24")
        if f" {str(net.network_address)[:-1]}" not in used:  # " 10.A.B." of any address
            return net
    raise NetnsUnavailable("no free 10.200.0.0/13 subnet for the test network")


@dataclass
class Host:
    """One host of a :class:`TestNet`: a network namespace with one address."""

    name: str
    netns: str
    address: str
    port: str
    """Its port on the bridge (an interface of the switch namespace)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.netns]

    def popen(self, cmd: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``cmd`` on this host (its own session); stopped by :meth:`kill`."""
        process: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            [*self.prefix(), *cmd], start_new_session=True, **kwargs
        )
        self.processes.append(process)
        return process

    def pids(self) -> list[int]:
        """Pids of every process in this host's namespace."""
        out = run("ip", "netns", "pids", self.netns, check=False)
        return [int(p) for p in out.split()]

    def kill(self) -> None:
        """SIGKILL every process on this host, as a machine that is switched off stops."""
        for _ in range(10):  # a process may fork while we kill; a few passes settle it
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)


class TestNet:
    """A private subnet: a bridge in a namespace of its own and the hosts plugged into it.

    Every name carries a random id, so concurrent test runs never collide; :meth:`close`
    (also on ``__exit__``) kills every process on every host and deletes every namespace,
    which removes the bridge, its rules and every veth with them.
    """

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        require_netns()
        self.id = uuid.uuid4().hex[:6]
        self.switch = f"tf{self.id}-sw"
        self.subnet = _free_subnet()
        self.hosts: dict[str, Host] = {}
        self._root_if = f"tf{self.id}r"
        self._created: list[str] = []

    @property
    def gateway(self) -> str:
        """The root namespace's address on the test subnet (where the test process is)."""
        return str(self.subnet.network_address + 1)

    def start(self) -> TestNet:
        """Create the switch and plug the root namespace into it."""
        try:
            self._add_netns(self.switch)
            self._in_switch("ip", "link", "add", "br0", "type", "bridge")
            self._in_switch("ip", "link", "set", "br0", "up")
            run("ip", "link", "add", self._root_if, "type", "veth", "peer", "name", "p0",
                "netns", self.switch)  # fmt: skip
            self._in_switch("ip", "link", "set", "p0", "master", "br0", "up")
            run("ip", "addr", "add", f"{self.gateway}/24", "dev", self._root_if)
            run("ip", "link", "set", self._root_if, "up")
            # One table for every fault of this network, flushed by heal().
            self._nft("add table bridge faults")
            self._nft(
                "add chain bridge faults forward "
                "{ type filter hook forward priority 0 ; policy accept ; }"
            )
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, name: str) -> Host:
        """Create host ``name`` with the next free address and plug it into the switch."""
        index = len(self.hosts) + 1
        if index > MAX_HOSTS:
            raise NetnsUnavailable(f"a test network holds at most {MAX_HOSTS} hosts")
        netns = f"tf{self.id}-{name}"
        port = f"h{index}"
        address = str(self.subnet.network_address + 1 + index)
        self._add_netns(netns)
        run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name",
            "eth0", "netns", netns)  # fmt: skip
        self._in_switch("ip", "link", "set", port, "master", "br0", "up")
        run("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        run("ip", "-n", netns, "link", "set", "eth0", "up")
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", netns, "route", "add", "default", "via", self.gateway)
        host = Host(name=name, netns=netns, address=address, port=port)
        self.hosts[name] = host
        return host

    def cut(self, host: Host, direction: Direction = "both") -> None:
        """Drop ``host``'s traffic: what reaches it (``in``), what it sends (``out``), or both.

        Packets are dropped silently, as on a partitioned network: no reset, no ICMP, so
        the endpoints only notice by their own timeouts.
        """
        if direction in ("out", "both"):
            self._nft(f'add rule bridge faults forward iifname "{host.port}" drop')
        if direction in ("in", "both"):
            self._nft(f'add rule bridge faults forward oifname "{host.port}" drop')

    def cut_root(self, direction: Direction = "both") -> None:
        """Cut the test process (the root namespace) off from every host."""
        self.cut(Host(name="root", netns="", address=self.gateway, port="p0"), direction)

    def heal(self) -> None:
        """Remove every drop rule: all links carry traffic again."""
        self._nft("flush chain bridge faults forward")

    def close(self) -> None:
        """Kill every host's processes and delete every namespace of this network."""
        for host in self.hosts.values():
            with contextlib.suppress(NetnsUnavailable):
                host.kill()
        for netns in reversed(self._created):
            with contextlib.suppress(NetnsUnavailable):
                run("ip", "netns", "del", netns)
        self._created.clear()
        # Deleting the switch removes the root's veth peer; make sure, then check.
        with contextlib.suppress(NetnsUnavailable):
            run("ip", "link", "del", self._root_if, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces of this network that still exist (empty after :meth:`close`)."""
        names = run("ip", "netns", "list", check=False)
        return [line.split()[0] for line in names.splitlines() if f"tf{self.id}-" in line]

    def _add_netns(self, netns: str) -> None:
        run("ip", "netns", "add", netns)
        self._created.append(netns)

    def _in_switch(self, *cmd: str) -> str:
        return run("ip", "netns", "exec", self.switch, *cmd)

    def _nft(self, command: str) -> str:
        return self._in_switch("nft", command)

    def __enter__(self) -> TestNet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def test_net() -> Iterator[TestNet]:
    """A started :class:`TestNet`, closed however the block ends."""
    net = TestNet()
    with net:
        yield net


test_net.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
