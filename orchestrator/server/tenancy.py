"""Tenants: whose threads and runs are whose.

Every request is made by one tenant (:mod:`orchestrator.server.auth` names it from the
token; ``serve --no-auth`` has the one tenant ``anonymous``).
"""

from __future__ import annotations

import secrets
from typing import Any

import redis.asyncio as aioredis

from orchestrator.server.keys import Keys


async def tenant_key(client: aioredis.Redis, keys: Keys) -> bytes:
    """The deployment's key for tenant ids, made by the first replica that starts.

    Kept in Redis (the one server key that does not expire: a new key would give every
    bare token a new tenant, and its threads would be lost to it), so every replica
    hashes a token to the same id.
    """
    r: Any = client
    await r.set(keys.tenant_key, secrets.token_hex(32), nx=True)
    key: str | bytes = await r.get(keys.tenant_key)
    return key.encode() if isinstance(key, str) else key
