"""Settings from the environment, per-tool policy from TOML, and the Celery config from both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tool_workers.contract.broker import (
    BACKEND_CLASS,
    celery_config,
    create_app,
    visibility_timeout,
)
from tool_workers.contract.errors import ConfigError
from tool_workers.contract.names import DEFAULT_QUEUE
from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy

POLICY_TOML = """
[defaults]
time_limit = 100
retries = 2

[tools.slow]
queue = "long"
time_limit = 900

[tools.quick]
soft_time_limit = 5
idempotent = false
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOLFLEET_* variable of the calling shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("TOOLFLEET_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "toolfleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def policies(tmp_path: Path) -> ToolPolicies:
    return ToolPolicies.load(write(tmp_path, POLICY_TOML))


# --- Settings from the environment ------------------------------------------------------


def test_given_prefixed_env_when_settings_built_then_values_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TOOLFLEET_BROKER_URL", "redis://broker:6380/3")
    monkeypatch.setenv("TOOLFLEET_UNSERVED_WAIT", "2.5")
    monkeypatch.setenv("TOOLFLEET_CONFIG", str(tmp_path / "p.toml"))
    monkeypatch.setenv("BROKER_URL", "redis://unprefixed:1/0")

    settings = Settings()

    assert settings.broker_url == "redis://broker:6380/3"
    assert settings.unserved_wait == 2.5
    assert settings.config == tmp_path / "p.toml"


def test_given_comma_separated_modules_in_env_then_split_and_stripped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLFLEET_TOOL_MODULES", " pkg.search , pkg.db,, other ")
    assert Settings().tool_modules == ("pkg.search", "pkg.db", "other")


@pytest.mark.parametrize("value", ["", " , "])
def test_given_empty_modules_in_env_then_no_modules(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TOOLFLEET_TOOL_MODULES", value)
    assert Settings().tool_modules == ()


def test_given_modules_as_string_argument_then_split_too() -> None:
    assert Settings(tool_modules="a,b").tool_modules == ("a", "b")  # type: ignore[arg-type]


def test_given_no_result_backend_then_broker_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLFLEET_BROKER_URL", "redis://broker:6379/1")
    assert Settings().backend_url == "redis://broker:6379/1"

    monkeypatch.setenv("TOOLFLEET_RESULT_BACKEND", "redis://results:6379/2")
    assert Settings().backend_url == "redis://results:6379/2"


def test_given_namespace_then_key_prefix_carries_it() -> None:
    assert Settings().key_prefix == "toolfleet:"
    assert Settings(namespace="blue").key_prefix == "blue:toolfleet:"


def test_given_missing_config_path_when_policies_loaded_then_config_error_names_it(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        Settings(config=missing).policies()


def test_given_config_path_when_policies_loaded_then_that_file_read(tmp_path: Path) -> None:
    settings = Settings(config=write(tmp_path, POLICY_TOML))
    assert settings.policies().for_tool("slow").queue == "long"


# --- ToolPolicies -----------------------------------------------------------------------


def test_given_defaults_and_overrides_when_tool_policy_asked_then_merged(
    policies: ToolPolicies,
) -> None:
    slow = policies.for_tool("slow")
    assert (slow.queue, slow.time_limit, slow.retries) == ("long", 900.0, 2)

    quick = policies.for_tool("quick")
    assert (quick.queue, quick.time_limit, quick.retries) == (DEFAULT_QUEUE, 100.0, 2)
    assert quick.soft_time_limit == 5.0 and quick.effective_soft_limit == 5.0
    assert quick.idempotent is False


def test_given_unconfigured_tool_when_policy_asked_then_defaults(policies: ToolPolicies) -> None:
    assert policies.for_tool("other") == policies.defaults
    assert policies.defaults.time_limit == 100.0
    assert policies.defaults.idempotent is True


def test_given_no_soft_limit_then_effective_soft_limit_just_below_hard_limit() -> None:
    assert ToolPolicy(time_limit=300).effective_soft_limit == 299.0
    assert ToolPolicy(time_limit=5).effective_soft_limit == 4.5


def test_given_policies_then_longest_time_limit_over_defaults_and_tools(
    policies: ToolPolicies,
) -> None:
    assert policies.longest_time_limit() == 900.0
    assert ToolPolicies().longest_time_limit() == ToolPolicy().time_limit


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("[tools.x]\ntime_limit = 5\nsoft_time_limit = 5\n", "soft_time_limit"),
        ("[defaults]\ntime_limit = 5\nsoft_time_limit = 6\n", "soft_time_limit"),
        ("[tools.x]\nbogus = 1\n", "bogus"),
        ("[defaults]\nbogus = 1\n", "bogus"),
        ("top_level = 1\n", "top_level"),
        ("[tools.x]\ntime_limit = -1\n", "time_limit"),
        ("[tools.x]\nretries = 'many'\n", "retries"),
        ("[defaults\n", "cannot read"),
    ],
    ids=[
        "soft_equals_hard",
        "soft_over_hard_in_defaults",
        "unknown_tool_key",
        "unknown_default_key",
        "unknown_section",
        "negative_limit",
        "wrong_type",
        "not_toml",
    ],
)
def test_given_invalid_policy_file_when_loaded_then_config_error_names_file_and_problem(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = write(tmp_path, text, name="broken-policy.toml")
    with pytest.raises(ConfigError) as caught:
        ToolPolicies.load(path)
    assert str(path) in str(caught.value)
    assert complaint in str(caught.value)


# --- the Celery config ------------------------------------------------------------------


def test_given_policies_then_visibility_timeout_exceeds_longest_time_limit(
    policies: ToolPolicies,
) -> None:
    assert visibility_timeout(policies) > policies.longest_time_limit()
    assert visibility_timeout(ToolPolicies()) > ToolPolicies().longest_time_limit()


def test_given_settings_when_config_built_then_json_only_and_late_acks(
    policies: ToolPolicies,
) -> None:
    config = celery_config(Settings(broker_url="redis://b:6379/0"), policies)

    assert config["accept_content"] == ["json"]
    assert config["result_accept_content"] == ["json"]
    assert config["task_serializer"] == config["result_serializer"] == "json"
    assert config["task_acks_late"] is True
    assert config["task_reject_on_worker_lost"] is True
    assert config["broker_url"] == "redis://b:6379/0"
    assert config["result_backend"] == f"{BACKEND_CLASS}+redis://b:6379/0"
    assert config["broker_transport_options"]["visibility_timeout"] == visibility_timeout(policies)


def test_given_configured_tools_when_config_built_then_each_routed_to_its_queue(
    policies: ToolPolicies,
) -> None:
    config = celery_config(Settings(), policies)
    assert config["task_routes"] == {
        "tools.slow": {"queue": "long"},
        "tools.quick": {"queue": DEFAULT_QUEUE},
    }
    assert config["task_default_queue"] == DEFAULT_QUEUE


def test_given_no_namespace_when_config_built_then_no_global_keyprefix(
    policies: ToolPolicies,
) -> None:
    config = celery_config(Settings(), policies)
    assert "global_keyprefix" not in config["broker_transport_options"]
    assert "global_keyprefix" not in config["result_backend_transport_options"]


def test_given_namespace_when_config_built_then_broker_and_backend_keys_prefixed(
    policies: ToolPolicies,
) -> None:
    config = celery_config(Settings(namespace="blue"), policies)
    assert config["broker_transport_options"]["global_keyprefix"] == "blue:"
    assert config["result_backend_transport_options"]["global_keyprefix"] == "blue:"


def test_given_settings_when_app_created_then_configured_from_them(
    policies: ToolPolicies,
) -> None:
    app = create_app(Settings(), policies, main="toolfleet-test")
    assert app.main == "toolfleet-test"
    assert app.conf.accept_content == ["json"]
    assert app.conf.task_routes["tools.slow"] == {"queue": "long"}


def test_given_default_soft_limit_and_shorter_tool_limit_then_soft_limit_not_inherited(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        "[defaults]\ntime_limit = 300\nsoft_time_limit = 290\n[tools.x]\ntime_limit = 30\n"
    )

    policy = ToolPolicies.load(path).for_tool("x")

    assert policy.time_limit == 30
    assert policy.effective_soft_limit == 29


def test_given_default_queue_when_config_built_then_celery_default_queue_follows() -> None:
    policies = ToolPolicies(defaults=ToolPolicy(queue="bulk"))

    config = celery_config(Settings(), policies)

    assert config["task_default_queue"] == "bulk"


def test_visibility_timeout_counts_no_retry_delay_for_tools_without_retries() -> None:
    """The default policy (300 s, no retries): 300 s + the 30 s margin, nothing for the
    60 s ``retry_backoff_max`` a call without retries never waits."""
    assert visibility_timeout(ToolPolicies()) == 330.0


def test_visibility_timeout_counts_the_longest_delay_a_retried_call_really_waits() -> None:
    """A tool retried twice with backoff 1 s waits at most 2 s (1, then 2), not its cap;
    each tool's own limit and delay add up, not the longest of each across tools."""
    policies = ToolPolicies.model_validate(
        {
            "defaults": {"time_limit": 100},
            "tools": {
                "slow": {"time_limit": 200},
                "retried": {"time_limit": 50, "retries": 2, "retry_backoff": 1.0},
                "capped": {
                    "time_limit": 10,
                    "retries": 8,
                    "retry_backoff": 2.0,
                    "retry_backoff_max": 30.0,
                },
            },
        }
    )
    assert policies.for_tool("retried").longest_retry_delay == 2.0
    assert policies.for_tool("capped").longest_retry_delay == 30.0
    assert policies.for_tool("slow").longest_retry_delay == 0.0
    assert visibility_timeout(policies, margin=5) == 205.0


def test_given_no_lease_settings_then_a_lost_worker_is_noticed_within_seconds() -> None:
    """The lease defaults: 10 s to lapse, renewed every second."""
    settings = Settings()
    assert (settings.lease_ttl, settings.lease_refresh) == (10.0, 1.0)


def test_given_a_lease_refresh_not_below_its_ttl_then_settings_refused() -> None:
    """A lease renewed as rarely as it lapses would lapse between renewals."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="lease_refresh must be below lease_ttl"):
        Settings(lease_ttl=5.0, lease_refresh=5.0)
