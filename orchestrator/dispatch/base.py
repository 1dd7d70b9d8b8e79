"""The seam at the network boundary: everything the agent side asks of a transport.

:class:`Dispatcher` lists every method its callers use, sync and async alike; the Celery
dispatcher (:mod:`.dispatcher`) and the in-process one (:mod:`.in_process`) implement all of
it, so callers never probe for a method and mypy checks every call. Both are transports
under one shared dispatcher (:mod:`.transport`), which makes every decision of a wait and
a cancellation.

Every ``async def`` here must not block the event loop: an implementation awaits async
I/O or hands the blocking call to a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from orchestrator.call import PreparedCall
from orchestrator.dispatch.timings import CallTimings
from orchestrator.dispatch.watch import StateCallback
from tool_workers.contract.models import ToolResult, ToolSpec
from tool_workers.contract.settings import Settings, ToolPolicies

PlacementTable = Mapping[str, Mapping[str, str]]
"""``{tool: {"placement": "local" | "remote", "reason": ...}}`` of one agent's tools."""


class Dispatcher(Protocol):
    """Publishes calls and hands back their results."""

    @property
    def settings(self) -> Settings:
        """The settings of the fleet this dispatcher talks to."""
        ...

    @property
    def policies(self) -> ToolPolicies:
        """The tool policy, read once when the dispatcher was made (never on a loop)."""
        ...

    @property
    def timings(self) -> CallTimings | None:
        """The timings its calls report to (``toolfleet serve``'s ``/metrics``), if any."""
        ...

    # -- the registry ----------------------------------------------------------------------

    def served_tools(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """Tools some live worker serves now, by name (``fresh``: read again, no cache)."""
        ...

    async def served_tools_async(self, *, fresh: bool = False) -> Mapping[str, ToolSpec]:
        """:meth:`served_tools` without blocking the event loop."""
        ...

    def served_versions(self, name: str) -> Mapping[str, ToolSpec]:
        """Every version of ``name`` live workers serve, by schema version, the one shown to
        models first, as last read by :meth:`served_tools` (no I/O; empty: none)."""
        ...

    def note_placement(self, table: PlacementTable) -> None:
        """Publish an agent's tool placement for operators (best effort, never raises)."""
        ...

    async def note_placement_async(self, table: PlacementTable) -> None:
        """:meth:`note_placement` without blocking the event loop."""
        ...

    # -- publishing ------------------------------------------------------------------------

    def submit(self, calls: Sequence[PreparedCall], on_state: StateCallback | None = None) -> None:
        """Publish every call not yet published; returns once they are on the broker.

        Raises:
            DispatchError: the broker refused the calls.
        """
        ...

    async def submit_async(self, call: PreparedCall, on_state: StateCallback | None = None) -> None:
        """Publish ``call``, batched with the calls submitted in the same loop turns.

        Raises:
            DispatchError: the broker refused the calls.
        """
        ...

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Block until ``call``'s result is in (submitting it first if needed).

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout`` seconds.
        """
        ...

    async def wait_async(self, call: PreparedCall, timeout: float | None = None) -> ToolResult:
        """Await ``call``'s result without blocking the event loop.

        Raises:
            ResultTimeout: no result by the call's deadline or within ``timeout`` seconds.
        """
        ...

    # -- stopping --------------------------------------------------------------------------

    def cancel(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """Revoke calls that are still queued or running and stop waiting for them."""
        ...

    async def cancel_async(self, calls: Sequence[PreparedCall], terminate: bool = True) -> None:
        """:meth:`cancel` without blocking the event loop."""
        ...

    def in_flight(self) -> int:
        """Calls this process is waiting on."""
        ...

    def data_losses(self) -> int:
        """Losses of toolfleet's records in Redis this process noticed (0 in process)."""
        ...

    def close(self) -> None:
        """Release the dispatcher's threads and connections."""
        ...
