"""A Sentinel failover to a replica that had fallen behind: a data loss the epoch
handles, through the Sentinels (tests.support.sentinel).

Apart from tests/faults/test_sentinel.py so that the two run side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.sentinel import failover_mid_fan_out
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failover_to_a_replica_behind_loses_no_call_and_doubles_no_effect(
    mode: str,
    broker: str,
    make_settings: Callable[..., Settings],
    start_worker: Callable[..., Any],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Given calls running as the primary dies, when the Sentinels promote a replica whose
    replication was cut before the run (the run's records never reached it), then every
    call is answered (a non-idempotent one "may have partially run"), no non-idempotent
    call runs twice, the run ends within 40 s of the death, and the next run succeeds."""
    failover_mid_fan_out(mode, "behind", broker, make_settings, start_worker, tmp_path, request)
