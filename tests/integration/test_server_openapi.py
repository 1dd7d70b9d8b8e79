"""``toolfleet serve`` against its own OpenAPI document, with a schema-driven fuzzer.

schemathesis reads ``/openapi.json`` from a running server (the real CLI over a prefork
fleet of its own) and sends every operation generated requests, valid and invalid, with
a token: no answer may be a server error, and every answer (status, headers, body) must
be one the document describes. Bounded: a few examples per operation, well under two
minutes in all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

from tests.support.serving import ServerProcess, prefork_fleet, start_server
from tool_workers.contract.settings import Settings

__all__ = ["prefork_fleet"]  # the fixture, imported so pytest finds it here

EXAMPLES = 8
"""Generated requests per operation."""

STATE_REFUSALS = {
    ("POST /threads", 400): "supersteps need the graph that applies them",
}
"""Valid-by-schema requests the server refuses for what the document cannot state: a
thread's ``supersteps`` need ``metadata.graph_id`` to name a graph this server serves
(LangGraph's server answers the same 400). Each is allowed only with its own reason; any
other refusal of valid data still fails."""


def unknown_query_parameters_only(case: Any) -> bool:
    """Whether the one thing invalid in a generated request is a query parameter the
    operation does not name: ignored, as LangGraph's server ignores it (unknown *body*
    fields are refused, and that is checked)."""
    data = case.meta.phase.data
    location = getattr(data, "parameter_location", None)
    return location == ParameterLocation.QUERY and "additionalProperties" in str(
        getattr(data, "description", "") or ""
    )


@pytest.fixture(scope="module")
def server(
    prefork_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    process = start_server(
        prefork_fleet,
        tmp_path_factory.mktemp("openapi"),
        "openapi",
        # Fuzzed runs may wait a day (after_seconds): room enough that none is refused.
        max_runs=2_000,
        tenant_max_runs=1_000,
        tenant_max_queued=1_000,
    )
    yield process
    process.stop()


def fuzz(operation: Any, mode: Any, base_url: str, token: str) -> list[str]:
    """Send ``EXAMPLES`` generated requests of ``mode`` to ``operation``; the failures."""
    failures: list[str] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
        phases=[Phase.generate],  # no shrinking: a failure is reported as found
    )
    def check(case: Any) -> None:
        try:
            response = case.call(
                base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=20
            )
            reason = STATE_REFUSALS.get((operation.label, response.status_code))
            if reason is not None and reason in response.text:
                case.validate_response(response, excluded_checks=[positive_data_acceptance])
            elif unknown_query_parameters_only(case):
                case.validate_response(response, excluded_checks=[negative_data_rejection])
            else:
                case.validate_response(response)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis's (grouped) failures
            failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")

    try:
        check()
    except Unsatisfiable:  # nothing of the operation can be made invalid (GET /ok)
        assert mode == GenerationMode.NEGATIVE, operation.label
    return failures


@pytest.mark.timeout(300)  # about 40 operations, each fuzzed both ways
def test_every_operation_answers_as_documented(server: ServerProcess) -> None:
    """Given the server's own document, when every operation gets generated valid and
    invalid requests with a token, then none is a server error or breaks the document."""
    api = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    token = server.settings.api_tokens[0]
    failures: list[str] = []
    operations = 0
    for result in api.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failures += fuzz(operation, mode, server.url, token)
    assert operations >= 25
    assert not failures, "\n\n".join(failures)


def test_the_document_states_the_refusals(server: ServerProcess) -> None:
    """The 422's ``detail`` is a string, refusals are documented (an unknown body field
    among them), threads' prune and storage are there, and a 405 names every method its
    path allows."""
    document = httpx.get(f"{server.url}/openapi.json").json()
    invalid = document["components"]["schemas"]["HTTPValidationError"]
    assert invalid["properties"]["detail"]["type"] == "string"
    runs = document["paths"]["/threads/{thread_id}/runs"]["post"]["responses"]
    assert {"200", "401", "404", "409", "413", "422", "429"} <= set(runs)
    cancel = document["paths"]["/threads/{thread_id}/runs/{run_id}/cancel"]["post"]
    assert "202" in cancel["responses"]
    storage = document["paths"]["/threads/{thread_id}/storage"]["get"]["responses"]
    assert {"200", "404"} <= set(storage)
    assert "422" in document["paths"]["/threads/prune"]["post"]["responses"]
    # A body takes only its own fields: the document says so, and a fuzzed extra is a 422.
    for name in ("ThreadCreate", "RunCreate", "AssistantCreate", "ItemPut", "ThreadPrune"):
        assert document["components"]["schemas"][name]["additionalProperties"] is False, name
    token = server.settings.api_tokens[0]
    refused = httpx.put(
        f"{server.url}/threads/some-thread", headers={"Authorization": f"Bearer {token}"}
    )
    assert refused.status_code == 405
    assert set(refused.headers["allow"].split(", ")) >= {"GET", "DELETE", "PATCH"}
