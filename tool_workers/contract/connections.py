"""Redis connections toolfleet opens itself, with the same TLS options as Celery's.

Celery and kombu open the broker and result-backend connections from ``broker_url``,
``result_backend``, ``broker_use_ssl`` and ``redis_backend_use_ssl``
(:func:`tool_workers.contract.broker.celery_config`). toolfleet also opens a few plain redis-py
clients of its own: the registry publisher and reader, the dispatcher's send markers,
the result listener's pub/sub. They all come from here, so a ``rediss://`` deployment
verifies certificates the same way everywhere.

Credentials travel in the URL (``redis://user:password@host:6379/0``; a password alone
is ``redis://:password@host``); :func:`mask_secrets` (kept here, owned by
:mod:`tool_workers.contract.masking`) hides them before a URL is logged.
Options in a URL's query string (``?ssl_cert_reqs=none``) win over these settings.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel
import redis.sentinel

from tool_workers.contract.masking import mask_secrets
from tool_workers.contract.settings import Settings, is_sentinel_url

try:  # redis-py 7.2 and later: the client's name and version sent on connect (CLIENT SETINFO)
    from redis.driver_info import DriverInfo
except ImportError:  # earlier releases read their version once, at import
    _IDENTITY: dict[str, Any] = {}
else:
    # Read once, here: a client made without it reads the package's metadata (a file) for
    # every connection it opens, on whatever thread or event loop opens it.
    _IDENTITY = {"driver_info": DriverInfo()}

__all__ = [
    "async_redis_client",
    "celery_tls_config",
    "keepalive_options",
    "mask_secrets",
    "redis_client",
    "redis_connection_kwargs",
    "run_script",
    "run_script_async",
    "socket_options",
    "ssl_options",
    "uses_tls",
]

_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def uses_tls(url: str, settings: Settings | None = None) -> bool:
    """Whether ``url`` is a TLS Redis URL: ``rediss://``, or ``sentinel://`` with
    ``settings.sentinel_tls``."""
    if is_sentinel_url(url):
        return settings is not None and settings.sentinel_tls
    return urlsplit(url).scheme == "rediss"


def ssl_options(settings: Settings) -> dict[str, Any]:
    """TLS options in the form Celery's ``broker_use_ssl``/``redis_backend_use_ssl`` take."""
    options: dict[str, Any] = {"ssl_cert_reqs": _CERT_REQS[settings.redis_ssl_cert_reqs]}
    if settings.redis_ssl_ca_certs is not None:
        options["ssl_ca_certs"] = str(settings.redis_ssl_ca_certs)
    if settings.redis_ssl_certfile is not None:
        options["ssl_certfile"] = str(settings.redis_ssl_certfile)
    if settings.redis_ssl_keyfile is not None:
        options["ssl_keyfile"] = str(settings.redis_ssl_keyfile)
    return options


def celery_tls_config(settings: Settings) -> dict[str, Any]:
    """Celery's ``broker_use_ssl``/``redis_backend_use_ssl`` for the ``rediss://`` URLs.

    Without them Celery refuses a ``rediss://`` result backend whose URL lacks
    ``ssl_cert_reqs``; with them every connection verifies the same way.
    """
    config: dict[str, Any] = {}
    if uses_tls(settings.broker_url, settings):
        config["broker_use_ssl"] = ssl_options(settings)
    if uses_tls(settings.backend_url, settings):
        config["redis_backend_use_ssl"] = ssl_options(settings)
    return config


def keepalive_options(settings: Settings) -> dict[int, int]:
    """TCP options (``setsockopt`` level ``IPPROTO_TCP``) that find a dead peer in seconds.

    Keepalive probes start after ``socket_timeout`` seconds of silence, one a second; and
    data the peer has not acknowledged for twice ``socket_timeout`` closes the connection
    (``TCP_USER_TIMEOUT``). Without them a connection on a cut link lives for minutes
    (keepalive starts after two hours; retransmissions go on for about 15 minutes), and
    even after the link heals it waits out its retransmission backoff. Options this
    platform lacks are left out.
    """
    timeout = settings.socket_timeout
    wanted = {
        "TCP_KEEPIDLE": max(1, round(timeout)),
        "TCP_KEEPINTVL": 1,
        "TCP_KEEPCNT": 3,
        "TCP_USER_TIMEOUT": max(1000, round(2 * timeout * 1000)),
    }
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def socket_options(settings: Settings) -> dict[str, Any]:
    """redis-py timeouts and keepalive for every Redis connection toolfleet opens.

    A command waits at most ``socket_timeout`` for its reply, a connect at most as long;
    then the connection is dropped and the next command opens a new one, so a network cut
    is noticed in seconds and a healed link serves again at once. Commands are not
    replayed on a timeout (``retry_on_timeout`` stays off): a write whose reply was lost
    may have happened.
    """
    return {
        "socket_timeout": settings.socket_timeout,
        "socket_connect_timeout": settings.socket_timeout,
        "socket_keepalive_options": keepalive_options(settings),
    }


def redis_connection_kwargs(url: str, settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``redis.Redis.from_url(url, ...)``: TLS options for ``rediss://``.

    A plain ``redis://`` URL gets none (redis-py refuses TLS options on a plain
    connection). Timeouts and keepalive are :func:`socket_options`.
    """
    return ssl_options(settings) if uses_tls(url) else {}


def _client_kwargs(url: str, settings: Settings, kwargs: dict[str, Any]) -> dict[str, Any]:
    # Health checks PING a connection idle for this long before using it again, so a
    # connection that died while idle is replaced before a command waits on it.
    defaults = {
        "socket_keepalive": True,
        "health_check_interval": settings.socket_timeout,
        **_IDENTITY,
    }
    return {
        **defaults,
        **socket_options(settings),
        **redis_connection_kwargs(url, settings),
        **kwargs,
    }


def redis_client(url: str, settings: Settings, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``url`` with the deployment's TLS options, socket timeouts,
    TCP keepalive and health checks.

    Args:
        url: A ``redis://`` or ``rediss://`` URL (credentials in it), or Celery's
            ``sentinel://`` form: the client then talks to the primary the Sentinels
            name ``TOOLFLEET_SENTINEL_MASTER``, found again after a failover.
        settings: Supplies the TLS options and ``socket_timeout``.
        **kwargs: More ``redis.Redis`` options; they win over the defaults.
    """
    if is_sentinel_url(url):
        manager = _sentinel(redis.sentinel.Sentinel, url, settings, kwargs)
        client: redis.Redis = manager.master_for(_master(settings), redis_class=_SentinelRedis)
        return client
    return redis.Redis.from_url(url, **_client_kwargs(url, settings, kwargs))


def async_redis_client(
    url: str, settings: Settings, *, pool_size: int | None = None, **kwargs: Any
) -> aioredis.Redis:
    """The ``redis.asyncio`` counterpart of :func:`redis_client`.

    Args:
        pool_size: At most this many connections; a caller that finds them all busy
            waits (up to ``TOOLFLEET_REDIS_POOL_TIMEOUT``) instead of failing.
    """
    blocking = (
        {"max_connections": pool_size, "timeout": settings.redis_pool_timeout}
        if pool_size is not None
        else {}
    )
    if is_sentinel_url(url):
        manager = _sentinel(aioredis.sentinel.Sentinel, url, settings, kwargs)
        pool_class: Any = aioredis.sentinel.SentinelConnectionPool
        if pool_size is not None:
            pool_class = _BlockingSentinelPool
        primary: aioredis.Redis = manager.master_for(
            _master(settings),
            redis_class=_AsyncSentinelRedis,
            connection_pool_class=pool_class,
            **blocking,
        )
        return primary
    if pool_size is None:
        return aioredis.from_url(url, **_client_kwargs(url, settings, kwargs))
    pool = aioredis.BlockingConnectionPool.from_url(
        url, **blocking, **redis_connection_kwargs(url, settings), **kwargs
    )
    return aioredis.Redis.from_pool(pool)


# -- Sentinel: the primary found through the Sentinels ----------------------------------


def sentinel_addresses(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The Sentinels of a ``sentinel://`` URL and the primary's connection options in it
    (database, user name, password), in Celery's form: ``sentinel://[:password@]host:port``
    parts joined by ``;``, the database after the last."""
    hosts: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for part in url.split(";"):
        parts = urlsplit(part.strip())
        if parts.hostname:
            hosts.append((parts.hostname, parts.port or SENTINEL_PORT))
        if parts.password and "password" not in options:
            options["password"] = unquote(parts.password)
        if parts.username and "username" not in options:
            options["username"] = unquote(parts.username)
        if parts.path.strip("/"):
            options["db"] = int(parts.path.strip("/"))
    return hosts, options


SENTINEL_PORT = 26379


def _master(settings: Settings) -> str:
    if not settings.sentinel_master:  # the settings refuse this already
        raise ValueError("a sentinel:// URL needs TOOLFLEET_SENTINEL_MASTER")
    return settings.sentinel_master


def _sentinel(manager_class: Any, url: str, settings: Settings, kwargs: dict[str, Any]) -> Any:
    """A Sentinel manager (sync or asyncio ``Sentinel``) for ``url``: the Sentinels with
    their own password and timeouts; the primary's connections with the URL's database
    and credentials, the deployment's timeouts, keepalive and health checks, and
    ``kwargs``."""
    hosts, options = sentinel_addresses(url)
    tls = {"ssl": True, **ssl_options(settings)} if settings.sentinel_tls else {}
    own: dict[str, Any] = {**socket_options(settings), **tls}
    if settings.sentinel_password:
        own["password"] = settings.sentinel_password
    primary = {
        "socket_keepalive": True,
        "health_check_interval": settings.socket_timeout,
        **socket_options(settings),
        **tls,
        **options,
        **kwargs,
    }
    return manager_class(hosts, sentinel_kwargs=own, **primary)


class _SentinelRedis(redis.Redis):
    """The primary's client; closing it closes its Sentinels' connections too."""

    def close(self) -> None:
        super().close()
        pool: Any = self.connection_pool
        for sentinel in pool.sentinel_manager.sentinels:
            sentinel.close()


class _AsyncSentinelRedis(aioredis.Redis):
    """The asyncio primary's client; closing it closes its Sentinels' connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool: Any = self.connection_pool
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()


class _BlockingSentinelPool(
    aioredis.sentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool
):
    """The primary's connections, at most ``max_connections``; a caller that finds them
    all busy waits up to ``timeout`` (``BlockingConnectionPool``'s behaviour)."""


def run_script(client: redis.Redis, script: Any, keys: list[Any], args: list[Any]) -> Any:
    """Run registered script ``script`` (``client.register_script``) by its digest,
    loaded first when the server does not know it (restarted, flushed). redis-py's own
    call of a script checks what kind of client it has, with imports, on every call."""
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        client.script_load(script.script)
        return client.evalsha(script.sha, len(keys), *keys, *args)


async def run_script_async(
    client: aioredis.Redis, script: Any, keys: list[Any], args: list[Any]
) -> Any:
    """:func:`run_script` through an async client."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        await client.script_load(script.script)
        return await client.evalsha(script.sha, len(keys), *keys, *args)
