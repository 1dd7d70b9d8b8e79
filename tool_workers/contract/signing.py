"""Signed envelopes: an HMAC-SHA256 over each request and result, with a shared key.

With ``TOOLFLEET_SIGNING_KEY`` set, the orchestrator signs every request it publishes
and the worker every result it returns; each side refuses what arrives unsigned or
mis-signed (see the trust model in docs/guarantees.md). Without the key nothing is signed
or checked.

What is signed is the canonical JSON (sorted keys, no spaces, ASCII) of a small
envelope: what the signature is for (``request`` or ``result``), the call's task id,
for a request the task name it was sent to and the epoch of toolfleet's records it was
published under (:data:`~tool_workers.contract.epoch.EPOCH_HEADER`, when it names one),
and the body without its ``signature``. A signature therefore holds for one call only:
moved to another task id or another tool's task, turned from a request into a result,
or with its epoch header dropped, added or changed, it no longer verifies.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Literal

SIGNATURE_FIELD = "signature"
"""The body field holding the hex HMAC-SHA256 (requests and results alike)."""

Problem = Literal["unsigned", "mismatch"]
"""Why a body was refused: it carries no signature, or one that does not verify."""


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON bytes: sorted keys, compact, ASCII only.

    Raises:
        TypeError, ValueError: ``value`` is not JSON.
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(key: str, envelope: dict[str, Any]) -> str:
    return hmac.new(key.encode(), canonical(envelope), hashlib.sha256).hexdigest()


def _unsigned(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != SIGNATURE_FIELD}


def _request_envelope(task_id: str, task: str, body: dict[str, Any], epoch: str) -> dict[str, Any]:
    envelope = {"for": "request", "task_id": task_id, "task": task, "body": _unsigned(body)}
    # The epoch decides whether a call whose marker is gone may run (contract/epoch.py):
    # left unsigned, dropping it would turn a lost call into one that runs again.
    if epoch:
        envelope["epoch"] = epoch
    return envelope


def _result_envelope(task_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"for": "result", "task_id": task_id, "body": _unsigned(body)}


def sign_request(
    key: str, task_id: str, task: str, body: dict[str, Any], epoch: str = ""
) -> dict[str, Any]:
    """``body`` (a request as JSON) with its signature for task ``task`` under ``task_id``,
    published under ``epoch`` (``""``: the message names none)."""
    return {**body, SIGNATURE_FIELD: _digest(key, _request_envelope(task_id, task, body, epoch))}


def sign_result(key: str, task_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (a result as JSON) with its signature for the call ``task_id``."""
    return {**body, SIGNATURE_FIELD: _digest(key, _result_envelope(task_id, body))}


def _check(key: str, body: Any, envelope: Any) -> Problem | None:
    signature = body.get(SIGNATURE_FIELD) if isinstance(body, dict) else None
    if not isinstance(signature, str) or not signature:
        return "unsigned"
    try:
        expected = _digest(key, envelope(body))
    except (TypeError, ValueError):  # not JSON: nobody signed this
        return "mismatch"
    return None if hmac.compare_digest(expected, signature) else "mismatch"


def request_problem(
    key: str, task_id: str, task: str, body: Any, epoch: str = ""
) -> Problem | None:
    """Why the request ``body`` received as ``task``/``task_id``, its message naming
    ``epoch``, must be refused, if it must."""
    return _check(key, body, lambda b: _request_envelope(task_id, task, b, epoch))


def result_problem(key: str, task_id: str, body: Any) -> Problem | None:
    """Why the result ``body`` stored for ``task_id`` must be refused, if it must."""
    return _check(key, body, lambda b: _result_envelope(task_id, b))


def refused_request_text(tool: str, problem: Problem) -> str:
    """What the model reads when a worker refused a call's request."""
    what = "is not signed" if problem == "unsigned" else "has a signature that does not match"
    return (
        f"Error: the call to '{tool}' was refused by the worker: its request {what}, and "
        "this worker only runs requests signed with TOOLFLEET_SIGNING_KEY. The tool did "
        "not run."
    )
