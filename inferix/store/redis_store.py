"""`RedisStore`: the shared, durable backend (what the Helm chart and `--redis-url` use).

Keys live under a versioned namespace (`inferix:v1:` by default) so that several Inferix
deployments, or a future incompatible layout (`inferix:v2:`), can share one Redis without
colliding, and so that `redis-cli --scan --pattern 'inferix:v1:*'` shows exactly our data.

Atomicity: `compare_and_set` is one Lua script (Redis runs scripts atomically); `update` is an
optimistic WATCH/MULTI/EXEC loop, which keeps the caller's `fn` in Python; `append` with a TTL
is one MULTI. Redis errors are translated into the store's own exceptions so callers never
import redis.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from inferix.store.base import (
    StoreConflictError,
    StoreError,
    StoreUnavailableError,
    StoreURLError,
    UpdateFn,
    check_key,
    check_ttl,
)

NAMESPACE = "inferix:v1:"
MAX_UPDATE_ATTEMPTS = 200  # every lost round means another writer succeeded; this only bounds starvation

# KEYS[1]; ARGV: expected-present ('0'/'1'), expected, new-present ('0'/'1'), new, ttl in ms ('' = none)
_COMPARE_AND_SET = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '0' then
  if current then return 0 end
elseif current ~= ARGV[2] then
  return 0
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
elseif ARGV[5] == '' then
  redis.call('SET', KEYS[1], ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
end
return 1
"""

_GLOB_SPECIAL = "\\*?[]"


def _ms(ttl_s: float | None) -> int | None:
    ttl_s = check_ttl(ttl_s)
    return None if ttl_s is None else max(1, math.ceil(ttl_s * 1000))


def _bytes(value: bytes | str | None) -> bytes | None:
    """redis-py types replies as bytes | str (str only with decode_responses, which we never set)."""
    return value.encode() if isinstance(value, str) else value


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in _GLOB_SPECIAL else ch for ch in text)


@contextmanager
def _translated(store: RedisStore) -> Iterator[None]:
    """Map redis-py exceptions to the store's, naming the server so the message is actionable."""
    try:
        yield
    except (redis_errors.ConnectionError, redis_errors.TimeoutError) as exc:
        raise StoreUnavailableError(f"Redis at {store.location} is unreachable: {exc}") from exc
    except redis_errors.ResponseError as exc:
        if "WRONGTYPE" in str(exc):
            raise TypeError(f"a key holds a list where a value was expected, or the reverse: {exc}") from exc
        raise StoreError(f"Redis at {store.location} refused the command: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise StoreError(f"Redis at {store.location}: {exc}") from exc


class RedisStore:
    """`Store` on Redis via redis.asyncio; one instance per event loop."""

    persistent = True

    def __init__(self, client: aioredis.Redis, namespace: str = NAMESPACE) -> None:
        if not namespace:
            raise ValueError("the Redis key namespace must not be empty (e.g. 'inferix:v1:')")
        self._redis = client
        self.namespace = namespace
        self._cas = client.register_script(_COMPARE_AND_SET)

    @classmethod
    def from_url(cls, url: str, namespace: str = NAMESPACE) -> RedisStore:
        """Open `redis://[:password@]host:port/db` (or `rediss://`, `unix://`); connects lazily."""
        try:
            client = aioredis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
        except ValueError as exc:
            raise StoreURLError(f"invalid Redis URL {url!r}: {exc}; expected redis://host:port/db") from exc
        return cls(client, namespace)

    @property
    def location(self) -> str:
        """host:port/db (never the password), for messages and logs."""
        kwargs: dict[str, Any] = self._redis.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}/{kwargs.get('db', 0)}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"

    def __repr__(self) -> str:
        return f"RedisStore({self.location}, namespace={self.namespace!r})"

    def _key(self, key: str) -> str:
        return self.namespace + check_key(key)

    async def ping(self) -> None:
        with _translated(self):
            await self._redis.ping()

    async def get(self, key: str) -> bytes | None:
        with _translated(self):
            return _bytes(await self._redis.get(self._key(key)))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        with _translated(self):
            return [_bytes(value) for value in await self._redis.mget([self._key(key) for key in keys])]

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        with _translated(self):
            await self._redis.set(self._key(key), value, px=_ms(ttl_s))

    async def delete(self, key: str) -> bool:
        with _translated(self):
            return bool(await self._redis.delete(self._key(key)))

    async def compare_and_set(
        self, key: str, expected: bytes | None, new: bytes | None, *, ttl_s: float | None = None
    ) -> bool:
        ttl_ms = _ms(ttl_s)
        args = [
            "0" if expected is None else "1",
            expected or b"",
            "0" if new is None else "1",
            new or b"",
            "" if ttl_ms is None else str(ttl_ms),
        ]
        with _translated(self):
            return bool(await self._cas(keys=[self._key(key)], args=args))

    async def update(self, key: str, fn: UpdateFn, *, ttl_s: float | None = None) -> bytes | None:
        name, ttl_ms = self._key(key), _ms(ttl_s)
        with _translated(self):
            async with self._redis.pipeline(transaction=True) as pipe:
                for attempt in range(MAX_UPDATE_ATTEMPTS):
                    try:
                        await pipe.watch(name)
                        new = fn(_bytes(await pipe.get(name)))
                        pipe.multi()
                        if new is None:
                            pipe.delete(name)
                        else:
                            pipe.set(name, new, px=ttl_ms)
                        await pipe.execute()
                        return new
                    except redis_errors.WatchError:
                        # Jitter so that many writers of one hot key stop colliding in lockstep.
                        await asyncio.sleep(random.uniform(0, 0.0005 * min(attempt + 1, 20)))
        raise StoreConflictError(f"update of {key!r} lost to concurrent writers {MAX_UPDATE_ATTEMPTS} times")

    async def list_prefix(self, prefix: str) -> list[str]:
        pattern = _glob_escape(self.namespace + prefix) + "*"
        skip = len(self.namespace)
        keys: set[str] = set()  # SCAN may return a key more than once
        with _translated(self):
            async for raw in self._redis.scan_iter(match=pattern, count=1000):
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
                keys.add(name[skip:])
        return sorted(keys)

    async def append(self, key: str, value: bytes, *, ttl_s: float | None = None) -> int:
        name, ttl_ms = self._key(key), _ms(ttl_s)
        with _translated(self):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(name, value)
                if ttl_ms is not None:
                    pipe.pexpire(name, ttl_ms)
                results = await pipe.execute()
        return int(results[0])

    async def get_list(self, key: str) -> list[bytes]:
        with _translated(self):
            items = await self._redis.lrange(self._key(key), 0, -1)
        return [item.encode() if isinstance(item, str) else item for item in items]

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        name, ttl_ms = self._key(key), _ms(ttl_s)
        with _translated(self):
            if ttl_ms is not None:
                return bool(await self._redis.pexpire(name, ttl_ms))
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.exists(name)
                pipe.persist(name)
                exists, _ = await pipe.execute()
            return bool(exists)

    async def ttl(self, key: str) -> float | None:
        with _translated(self):
            ttl_ms = int(await self._redis.pttl(self._key(key)))
        return None if ttl_ms < 0 else ttl_ms / 1000

    async def close(self) -> None:
        with _translated(self):
            await self._redis.aclose()
