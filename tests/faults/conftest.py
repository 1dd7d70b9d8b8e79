"""Helpers of the fault-injection suite: real workers, real Redis, injected failures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import FAULT_POLICY
from tests.support.net_fleet import NetFleet
from tests.support.netns import NetnsUnavailable, TestNet
from tool_workers.contract.settings import Settings


@pytest.fixture
def fault_settings(make_settings: Callable[..., Settings]) -> Callable[..., Settings]:
    """Settings with the fault policy: redelivery after ~11 s instead of minutes."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"config": FAULT_POLICY, "redelivery_margin": 2.0}
        values.update(overrides)
        return make_settings(**values)

    return make


@pytest.fixture
def net() -> Iterator[TestNet]:
    """A private test network (bridge, namespaces); everything on it is removed afterwards.

    Fails, naming the reason, where namespaces or nftables cannot be used: the
    network-fault tests are part of the suite and never skip.
    """
    try:
        network = TestNet().start()
    except NetnsUnavailable as exc:
        pytest.fail(f"the network-fault tests cannot run here: {exc}")
    try:
        yield network
    finally:
        network.close()


@pytest.fixture
def net_fleet(net: TestNet, tmp_path: Path) -> Iterator[Callable[..., NetFleet]]:
    """Start a fleet on the test network: Redis on a host of its own, workers on theirs."""
    fleets: list[NetFleet] = []

    def make(**overrides: Any) -> NetFleet:
        fleet = NetFleet(net, tmp_path, **overrides)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.close()
