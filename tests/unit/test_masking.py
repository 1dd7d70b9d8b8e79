"""One masking for every printed or logged setting (tool_workers.contract.masking)."""

from __future__ import annotations

import io
import json
import logging

from tool_workers.celery_ext.redaction import args_summary
from tool_workers.contract.logs import JsonFormatter, KeyValueFormatter, settings_fields
from tool_workers.contract.masking import MASK, mask_text, mask_value, masked_settings
from tool_workers.contract.settings import Settings

SECRETS = ("sk-bearer-7731", "env-secret-5519", "url-pass-8842", "hook-secret-0000000001")

SERVERS = {
    "mcpServers": {
        "remote": {
            "url": "https://user:url-pass-8842@mcp.example/mcp",
            "headers": {"Authorization": "Bearer sk-bearer-7731", "X-Trace": "plain"},
        },
        "local": {
            "command": "python",
            "args": ["-m", "server"],
            "env": {"GITHUB_PAT": "env-secret-5519", "LEVEL": "debug"},
        },
    }
}


def _settings() -> Settings:
    return Settings(
        mcp_servers=json.dumps(SERVERS),
        broker_url="redis://:url-pass-8842@redis:6379/0",
        webhook_secret="hook-secret-0000000001",
    )


def test_inline_mcp_servers_lose_their_headers_env_and_url_passwords() -> None:
    """Given inline MCP servers with an Authorization header, a stdio env and a URL
    password, when the settings are made loggable, then none of the values shows while
    the servers' shape (names, commands, URLs' hosts) stays readable."""
    fields = masked_settings(_settings())

    text = json.dumps(fields)
    assert not [s for s in SECRETS if s in text], text
    servers = json.loads(fields["mcp_servers"])["mcpServers"]
    assert servers["remote"]["headers"] == {"Authorization": MASK, "X-Trace": MASK}
    assert servers["remote"]["url"] == "https://user:***@mcp.example/mcp"
    assert servers["local"]["env"] == {"GITHUB_PAT": MASK, "LEVEL": MASK}
    assert servers["local"]["command"] == "python"


def test_settings_fields_is_the_one_masking() -> None:
    assert settings_fields(_settings()) == masked_settings(_settings())


def test_a_path_of_mcp_servers_is_shown_as_it_is() -> None:
    assert masked_settings(Settings(mcp_servers="/etc/mcp.json"))["mcp_servers"] == (
        "/etc/mcp.json"
    )


def test_mask_value_masks_secret_names_at_any_depth_and_whole_header_and_env_maps() -> None:
    value = {"a": [{"api_key": "k1", "headers": {"accept": "json"}, "env": {"X": "y"}}]}

    assert mask_value(value) == {
        "a": [{"api_key": MASK, "headers": {"accept": MASK}, "env": {"X": MASK}}]
    }
    assert mask_value({"token": ""}) == {"token": ""}  # an unset secret says so


def test_mask_text_masks_url_passwords_and_bearer_tokens() -> None:
    line = 'connect redis://u:pw1@h/0 with {"Authorization": "Bearer abc.def-1"}'

    assert mask_text(line) == 'connect redis://u:***@h/0 with {"Authorization": "Bearer ***"}'


def test_both_log_formats_mask_a_settings_dump_and_a_bearer_in_the_message() -> None:
    fields = settings_fields(_settings())
    for formatter in (JsonFormatter(), KeyValueFormatter()):
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        logger = logging.getLogger(f"toolfleet.test-masking.{type(formatter).__name__}")
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
        logger.info("toolfleet settings", extra={"toolfleet": fields})
        logger.info("header was Authorization: Bearer sk-bearer-7731")
        logger.removeHandler(handler)

        out = stream.getvalue()
        assert "toolfleet settings" in out and not [s for s in SECRETS if s in out], out


def test_tool_arguments_shown_by_flower_use_the_same_masking() -> None:
    shown = args_summary({"env": {"LEVEL": "debug"}})

    assert "debug" not in shown and MASK in shown
