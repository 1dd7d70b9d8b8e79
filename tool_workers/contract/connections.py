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
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

from tool_workers.contract.masking import mask_secrets
from tool_workers.contract.settings import Settings

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
    "socket_options",
    "ssl_options",
    "uses_tls",
]

_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def uses_tls(url: str) -> bool:
    """Whether ``url`` is a TLS Redis URL (``rediss://``)."""
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
    if uses_tls(settings.broker_url):
        config["broker_use_ssl"] = ssl_options(settings)
    if uses_tls(settings.backend_url):
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
        url: A ``redis://`` or ``rediss://`` URL (credentials in it).
        settings: Supplies the TLS options and ``socket_timeout``.
        **kwargs: More ``redis.Redis`` options; they win over the defaults.
    """
    return redis.Redis.from_url(url, **_client_kwargs(url, settings, kwargs))


def async_redis_client(url: str, settings: Settings, **kwargs: Any) -> aioredis.Redis:
    """The ``redis.asyncio`` counterpart of :func:`redis_client`."""
    return aioredis.from_url(url, **_client_kwargs(url, settings, kwargs))
