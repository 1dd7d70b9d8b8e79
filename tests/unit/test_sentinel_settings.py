"""Redis Sentinel settings: the URL form, the primary's name, what Celery and kombu get."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tool_workers.contract.broker import SENTINEL_BACKEND_CLASS, celery_config
from tool_workers.contract.connections import sentinel_addresses
from tool_workers.contract.settings import Settings, ToolPolicies, is_redis_url

URL = "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2;sentinel://10.0.0.3:26380/2"


def test_given_a_sentinel_url_then_each_sentinel_and_the_primarys_options_are_read() -> None:
    hosts, options = sentinel_addresses(URL)

    assert hosts == [("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380)]
    assert options == {"password": "s3cret", "db": 2}


def test_given_a_sentinel_url_without_the_primarys_name_then_the_settings_say_which() -> None:
    with pytest.raises(ValidationError, match="TOOLFLEET_SENTINEL_MASTER"):
        Settings(broker_url=URL)


def test_given_sentinels_for_records_behind_rabbitmq_then_they_are_the_redis_of_the_fleet() -> None:
    settings = Settings(
        broker_url="amqp://guest:guest@127.0.0.1:5672//", redis_url=URL, sentinel_master="m"
    )

    assert is_redis_url(URL)
    assert settings.own_redis_url == URL == settings.backend_url


def test_given_sentinels_then_celery_and_kombu_get_the_primarys_name_and_their_password() -> None:
    settings = Settings(broker_url=URL, sentinel_master="tfprimary", sentinel_password="pw-of-s")

    config = celery_config(settings, ToolPolicies())

    for options in (
        config["broker_transport_options"],
        config["result_backend_transport_options"],
    ):
        assert options["master_name"] == "tfprimary"
        assert options["sentinel_kwargs"]["password"] == "pw-of-s"
    assert config["result_backend"] == f"{SENTINEL_BACKEND_CLASS}+{URL}"
    assert "pw-of-s" not in repr(settings)


def test_given_a_sentinel_url_when_logged_then_every_password_in_it_is_masked() -> None:
    from tool_workers.contract.masking import mask_secrets

    assert "s3cret" not in mask_secrets(URL)


def test_given_sentinel_tls_then_the_sentinels_and_the_primary_are_reached_over_tls() -> None:
    from redis.sentinel import SentinelManagedSSLConnection

    from tool_workers.contract.connections import redis_client

    settings = Settings(
        broker_url=URL, sentinel_master="m", sentinel_tls=True, redis_ssl_cert_reqs="none"
    )
    client = redis_client(URL, settings)
    try:
        pool = client.connection_pool
        assert pool.connection_class is SentinelManagedSSLConnection
        sentinel = pool.sentinel_manager.sentinels[0].connection_pool
        assert sentinel.connection_class.__name__ == "SSLConnection"
    finally:
        client.close()
    config = celery_config(settings, ToolPolicies())
    assert config["broker_use_ssl"] == config["redis_backend_use_ssl"]
    assert config["broker_transport_options"]["sentinel_kwargs"]["ssl"] is True
