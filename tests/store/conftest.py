"""Fixtures of the store tests: every test runs against MemoryStore and a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from inferix.store import Store, open_store
from tests.store.redis_server import RedisServer


@dataclass
class Backend:
    """How to open a fresh, empty store of one backend inside a test's event loop."""

    name: str
    url: str | None

    def open(self) -> Store:
        return open_store(self.url)

    def run(self, body: Callable[[Store], Awaitable[None]]) -> None:
        """Run `body(store)` on a fresh event loop and close the store afterwards."""

        async def main() -> None:
            store = self.open()
            try:
                await body(store)
            finally:
                await store.close()

        asyncio.run(main())


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return Backend("memory", None)
    server: RedisServer = request.getfixturevalue("redis_server")
    server.flush()
    return Backend("redis", server.url())
