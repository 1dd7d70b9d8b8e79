"""Refusals of the HTTP service, each with the status code it answers with.

::

    ToolfleetError                       (tool_workers.contract.errors)
     +-- RequestRefused                  a request the service does not carry out
          +-- NotFound           404     no such thread, run or assistant
          +-- Conflict           409     the thread is busy, or the run already finished
          +-- Unsupported        422     a valid request for something not implemented
          +-- QuotaExceeded      413     a write past the tenant's storage quota
                                         (orchestrator.server.guards.account)
          +-- AtCapacity         429     this replica runs its maximum of runs
"""

from __future__ import annotations

from tool_workers.contract.errors import ToolfleetError


class RequestRefused(ToolfleetError):
    """Raised when the service refuses a request; ``status_code`` says how."""

    status_code = 400


class NotFound(RequestRefused):
    """Raised when a thread, run or assistant does not exist."""

    status_code = 404


class Conflict(RequestRefused):
    """Raised when the thread is busy (multitask strategy ``reject``) or a run is done."""

    status_code = 409


class Unsupported(RequestRefused):
    """Raised for a well-formed request asking for something this server does not do."""

    status_code = 422


class AtCapacity(RequestRefused):
    """Raised when this replica already executes ``TOOLFLEET_MAX_RUNS`` runs."""

    status_code = 429
