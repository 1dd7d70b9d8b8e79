"""Every Redis connection of a worker and an orchestrator notices a dead link in seconds:
socket timeouts, TCP keepalive and health checks on the broker, the result backend and
toolfleet's own clients."""

from __future__ import annotations

import socket

from tool_workers.contract.broker import create_app
from tool_workers.contract.connections import async_redis_client, keepalive_options, redis_client
from tool_workers.contract.settings import Settings

SETTINGS = Settings(broker_url="redis://cache:6379/0", socket_timeout=4.0)


def test_keepalive_probes_start_after_the_socket_timeout_and_unacked_data_times_out() -> None:
    options = keepalive_options(SETTINGS)
    assert options[socket.TCP_KEEPIDLE] == 4
    assert options[socket.TCP_KEEPINTVL] == 1
    assert options[socket.TCP_KEEPCNT] == 3
    assert options[socket.TCP_USER_TIMEOUT] == 8000


def test_broker_connections_time_out_keep_alive_and_are_health_checked() -> None:
    app = create_app(SETTINGS)
    options = app.conf.broker_transport_options
    assert options["socket_timeout"] == 4.0
    assert options["socket_connect_timeout"] == 4.0
    assert options["socket_keepalive"] is True
    assert options["socket_keepalive_options"] == keepalive_options(SETTINGS)
    assert options["health_check_interval"] <= 4
    # A publish is not replayed on a timeout: it may have been queued already.
    assert options["retry_on_timeout"] is False
    with app.connection_for_write() as conn:
        assert conn.transport_options["socket_timeout"] == 4.0


def test_result_backend_connections_time_out_keep_alive_and_are_health_checked() -> None:
    params = create_app(SETTINGS).backend.connparams
    assert params["socket_timeout"] == 4.0
    assert params["socket_connect_timeout"] == 4.0
    assert params["socket_keepalive"] is True
    assert params["socket_keepalive_options"] == keepalive_options(SETTINGS)
    assert params["health_check_interval"] <= 4
    # The store script never overwrites a stored success: replaying it is safe.
    assert params["retry_on_timeout"] is True


def test_toolfleet_clients_time_out_keep_alive_and_are_health_checked() -> None:
    for client in (
        redis_client(SETTINGS.broker_url, SETTINGS),
        async_redis_client(SETTINGS.broker_url, SETTINGS),
    ):
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 4.0
        assert kwargs["socket_connect_timeout"] == 4.0
        assert kwargs["socket_keepalive"] is True
        assert kwargs["socket_keepalive_options"] == keepalive_options(SETTINGS)
        assert kwargs["health_check_interval"] == 4.0


def test_a_caller_may_override_a_client_timeout() -> None:
    client = redis_client(SETTINGS.broker_url, SETTINGS, socket_timeout=30)
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 30
