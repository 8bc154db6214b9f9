"""Redis-only behaviour: namespaced keys, atomicity across processes, clear errors when down."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap

import pytest

from inferix.store import StoreUnavailableError, open_store
from inferix.store.redis_store import RedisStore
from tests.store.redis_server import RedisServer

INCREMENTER = textwrap.dedent(
    """
    import asyncio, sys
    from inferix.store import open_store

    async def main(url: str, rounds: int) -> None:
        store = open_store(url)
        for _ in range(rounds):
            await store.update("shared/counter", lambda old: str(int(old or b"0") + 1).encode())
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


def _raw_keys(server: RedisServer) -> list[bytes | str]:
    async def main() -> list[bytes | str]:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(server.url())
        try:
            return sorted(await client.keys("*"), key=str)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_keys_are_namespaced_and_versioned(redis_server: RedisServer) -> None:
    redis_server.flush()

    async def main() -> None:
        store = open_store(redis_server.url())
        assert isinstance(store, RedisStore)
        assert repr(store) == f"RedisStore(127.0.0.1:{redis_server.port}/0, namespace='inferix:v1:')"
        await store.put("workers/w1", b"v")
        await store.append("events/s1", b"e")
        await store.close()
        other = RedisStore.from_url(redis_server.url(), namespace="inferix:v2:")
        assert await other.get("workers/w1") is None  # another layout version sees nothing
        await other.close()

    asyncio.run(main())
    assert _raw_keys(redis_server) == [b"inferix:v1:events/s1", b"inferix:v1:workers/w1"]


def test_updates_from_separate_processes_are_atomic(redis_server: RedisServer) -> None:
    redis_server.flush()
    processes, rounds = 3, 40
    children = [
        subprocess.Popen([sys.executable, "-c", INCREMENTER, redis_server.url(), str(rounds)]) for _ in range(processes)
    ]
    for child in children:
        assert child.wait(60) == 0

    async def read() -> bytes | None:
        store = open_store(redis_server.url())
        try:
            return await store.get("shared/counter")
        finally:
            await store.close()

    assert asyncio.run(read()) == str(processes * rounds).encode()


def test_unreachable_redis_is_a_clear_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def main() -> None:
        store = open_store(f"redis://127.0.0.1:{port}/0")
        try:
            with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{port}/0 is unreachable"):
                await store.ping()
            with pytest.raises(StoreUnavailableError):
                await store.get("k")
        finally:
            await store.close()

    asyncio.run(main())
