"""Per-tool policy (config/toolfleet.toml) becomes Celery routes and task options."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fleet import REPO, TEST_POLICY
from tool_workers.contract.broker import create_app
from tool_workers.contract.settings import Settings, ToolPolicies
from tool_workers.runtime.loader import load_tools
from tool_workers.runtime.tasks import register_tools


@pytest.fixture
def registered() -> tuple[object, dict[str, object]]:
    settings = Settings(tool_modules=("tests.fleet_tools",), config=TEST_POLICY)
    policies = settings.policies()
    app = create_app(settings, policies)
    specs = register_tools(app, load_tools(settings), settings, policies)
    return app, specs


def test_time_limits_retries_and_queue_become_task_options(registered: tuple) -> None:  # type: ignore[type-arg]
    app, _ = registered
    hang, flaky, add = app.tasks["tools.hang"], app.tasks["tools.flaky"], app.tasks["tools.add"]

    assert (hang.time_limit, hang.soft_time_limit, hang.queue) == (4, 2, "prefork")
    assert flaky.max_retries == 3
    assert (add.time_limit, add.queue, add.max_retries) == (60, "tools", 0)
    assert all(app.tasks[f"tools.{n}"].acks_late for n in ("hang", "flaky", "add"))
    assert hang.Request == "tool_workers.celery_ext.redaction:ToolCallRequest"


def test_routes_send_each_tool_to_its_queue(registered: tuple) -> None:  # type: ignore[type-arg]
    app, _ = registered

    assert app.amqp.router.route({}, "tools.hang")["queue"].name == "prefork"
    assert app.amqp.router.route({}, "tools.add")["queue"].name == "tools"


def test_rate_limit_and_idempotency_reach_task_and_registry(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[tools.add]\nrate_limit = "10/m"\nidempotent = false\n')
    settings = Settings(tool_modules=("tests.fleet_tools",), config=policy)
    app = create_app(settings)

    specs = register_tools(app, load_tools(settings), settings, settings.policies())

    assert app.tasks["tools.add"].rate_limit == "10/m"
    assert specs["add"].options["rate_limit"] == "10/m"
    assert specs["add"].options["idempotent"] is False
    assert specs["whoami"].options["idempotent"] is True


def test_shipped_policy_routes_run_python_to_the_sandbox_pool() -> None:
    policies = ToolPolicies.load(REPO / "config" / "toolfleet.toml")
    settings = Settings(config=REPO / "config" / "toolfleet.toml")
    app = create_app(settings, policies)
    register_tools(app, load_tools(settings), settings, policies)

    run_python = app.tasks["tools.run_python"]
    assert run_python.queue == "sandbox" and run_python.time_limit == 30
    assert app.amqp.router.route({}, "tools.run_python")["queue"].name == "sandbox"
    assert app.amqp.router.route({}, "tools.read_file")["queue"].name == "tools"
