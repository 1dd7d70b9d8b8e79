"""TLS and credentials: one set of Redis options for Celery and toolfleet's own clients."""

from __future__ import annotations

import re
import ssl
import time
from pathlib import Path

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tool_workers.contract.broker import celery_config, create_app
from tool_workers.contract.connections import (
    celery_tls_config,
    mask_secrets,
    redis_client,
    redis_connection_kwargs,
)
from tool_workers.contract.settings import Settings, ToolPolicies

TLS = Settings(
    broker_url="rediss://app:pw@cache:6380/0",
    redis_ssl_ca_certs=Path("/etc/ssl/ca.pem"),
    redis_ssl_certfile=Path("/etc/ssl/client.pem"),
    redis_ssl_keyfile=Path("/etc/ssl/client.key"),
)


def test_plain_url_gets_no_tls_options() -> None:
    settings = Settings(broker_url="redis://:pw@redis:6379/0")

    assert redis_connection_kwargs(settings.broker_url, settings) == {}
    assert celery_tls_config(settings) == {}
    assert "broker_use_ssl" not in celery_config(settings, ToolPolicies())


def test_tls_url_gets_the_configured_certificate_checks() -> None:
    assert redis_connection_kwargs(TLS.broker_url, TLS) == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "ssl_ca_certs": "/etc/ssl/ca.pem",
        "ssl_certfile": "/etc/ssl/client.pem",
        "ssl_keyfile": "/etc/ssl/client.key",
    }


def test_celery_gets_the_same_options_for_broker_and_backend() -> None:
    config = celery_config(TLS, ToolPolicies())

    assert config["broker_use_ssl"] == redis_connection_kwargs(TLS.broker_url, TLS)
    assert config["redis_backend_use_ssl"] == config["broker_use_ssl"]


def test_tls_only_where_the_url_asks_for_it() -> None:
    settings = Settings(
        broker_url="rediss://cache:6380/0",
        result_backend="redis://results:6379/0",
        redis_ssl_cert_reqs="none",
    )

    config = celery_tls_config(settings)

    assert config == {"broker_use_ssl": {"ssl_cert_reqs": ssl.CERT_NONE}}


def test_celery_backend_accepts_a_rediss_url_without_query_options() -> None:
    """Celery refuses a rediss:// backend without ssl_cert_reqs; the settings supply it."""
    app = create_app(Settings(broker_url="rediss://:pw@cache:6380/0"), ToolPolicies())

    params = app.backend.connparams

    assert params["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert params["password"] == "pw"


def test_redis_client_uses_tls_and_credentials_from_the_url() -> None:
    client = redis_client(TLS.broker_url, TLS)
    kwargs = client.connection_pool.connection_kwargs

    assert client.connection_pool.connection_class is redis.SSLConnection
    assert kwargs["username"] == "app" and kwargs["password"] == "pw"
    assert kwargs["ssl_ca_certs"] == "/etc/ssl/ca.pem"
    client.close()


def test_url_query_options_win_over_settings() -> None:
    url = "rediss://cache:6380/0?ssl_cert_reqs=none"

    client = redis_client(url, Settings(broker_url=url))

    assert client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"
    client.close()


def test_passwords_are_masked_users_kept() -> None:
    text = "broker redis://:s3cret@r:6379/0 and rediss://user:p%40ss@h/1 and redis://h:6379"

    assert mask_secrets(text) == (
        "broker redis://:***@r:6379/0 and rediss://user:***@h/1 and redis://h:6379"
    )


# The one-regex form mask_secrets replaced; same output, quadratic on a long word.
_REFERENCE = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@\s]*):(?P<secret>[^@\s]+)@")


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet="ab1_é+.-:/@ \t", max_size=40))
def test_masking_matches_the_reference_pattern(text: str) -> None:
    """Given any text over the characters that matter, when masked, then the result is
    what the reference regex substitution gives."""
    assert mask_secrets(text) == _REFERENCE.sub(r"\g<scheme>\g<user>:***@", text)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("a" * 200_000, id="one-long-word"),
        pytest.param("a://b:" * 40_000, id="many-schemes-no-at"),
        pytest.param("ab1://" * 40_000, id="many-schemes"),
        pytest.param("x://" + "u" * 200_000 + ":" + "p" * 1000, id="long-user-no-at"),
    ],
)
def test_masking_a_long_line_is_fast(line: str) -> None:
    """Given a 200,000-character line built to be slow for a backtracking pattern, when
    masked, then it takes well under a second (the one-regex form took seconds)."""
    started = time.perf_counter()
    masked = mask_secrets(line)
    elapsed = time.perf_counter() - started

    assert elapsed < 1.0, f"{elapsed:.2f} s"
    assert masked == line


def test_a_password_after_a_long_word_is_still_masked() -> None:
    line = "a" * 200_000 + " redis://user:pw@h:6379/0"

    assert mask_secrets(line) == "a" * 200_000 + " redis://user:***@h:6379/0"


def test_a_worker_reconnects_to_the_broker_however_long_the_cut() -> None:
    """Given the Celery config of a worker, then its consumer's reconnect attempts have
    no limit: Celery's default (100) ended the consumer after a 400 s network cut."""
    config = celery_config(Settings(broker_url="redis://127.0.0.1:6379/0"), ToolPolicies())
    assert config["broker_connection_max_retries"] is None
    app = create_app(Settings(broker_url="redis://127.0.0.1:6379/0"))
    try:
        assert app.conf.broker_connection_max_retries is None
    finally:
        app.close()
