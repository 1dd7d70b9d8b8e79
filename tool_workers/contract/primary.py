"""Which Redis primary the fleet uses, and the last failover it saw.

With Redis behind Sentinels (``sentinel://`` URLs) the primary can move. Each worker's
registry refresh notes the address its client's Sentinels name now in one hash,
``<prefix>primary`` (``address``, ``since``, and after a change ``previous`` and
``changed_at``), in the round trip that refreshes its registry entry; ``toolfleet status``
shows it. A direct URL's primary is its host and port.
"""

from __future__ import annotations

import time
from typing import Any

import redis

PRIMARY = "primary"

# KEYS: the hash. ARGV: the address now, the time. Returns 1 when the address changed.
NOTE_SCRIPT = """
local now = redis.call('HGET', KEYS[1], 'address')
if now == ARGV[1] then return 0 end
if now then
    redis.call('HSET', KEYS[1], 'previous', now, 'changed_at', ARGV[2])
end
redis.call('HSET', KEYS[1], 'address', ARGV[1], 'since', ARGV[2])
return 1
"""


def primary_key(key_prefix: str) -> str:
    """The hash of the primary the fleet uses."""
    return f"{key_prefix}{PRIMARY}"


def sentinel_primary(client: redis.Redis) -> str | None:
    """``host:port`` of the primary the client's Sentinels name now (``None``: the
    client is not Sentinel-managed).

    Raises:
        redis.RedisError: no Sentinel answered.
    """
    pool: Any = client.connection_pool
    ask = getattr(pool, "get_master_address", None)
    if ask is None:
        return None
    host, port = ask()
    return f"{host}:{port}"


def note_primary(pipe: Any, key_prefix: str, address: str) -> None:
    """Queue the note of ``address`` as the primary on ``pipe`` (a pipeline)."""
    pipe.eval(NOTE_SCRIPT, 1, primary_key(key_prefix), address, f"{time.time():.3f}")


def read_primary(client: redis.Redis, key_prefix: str) -> dict[str, Any]:
    """The fleet's primary as its workers noted it: ``address``, ``since`` and, after a
    failover, ``previous`` and ``changed_at`` (empty: none noted)."""
    raw = client.hgetall(primary_key(key_prefix))
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        text = value.decode() if isinstance(value, bytes) else str(value)
        out[name] = float(text) if name in ("since", "changed_at") else text
    return out
