"""`open_store` picks the backend from a URL and refuses anything else with a usable message."""

from __future__ import annotations

import pytest

from inferix.errors import UserError
from inferix.store import MemoryStore, Store, StoreURLError, open_store
from inferix.store.redis_store import RedisStore


@pytest.mark.parametrize("url", [None, "memory://"])
def test_memory_urls(url: str | None) -> None:
    store = open_store(url)
    assert isinstance(store, MemoryStore)
    assert isinstance(store, Store)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "redis://:secret@cache:6380/2", "rediss://cache/1"])
def test_redis_urls(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, RedisStore)
    assert isinstance(store, Store)
    assert "secret" not in repr(store)


@pytest.mark.parametrize("url", ["postgres://db/x", "memory:/", "", "127.0.0.1:6379", "memory://other"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(StoreURLError, match="use memory:// .* or redis://host:port/db") as info:
        open_store(url)
    assert isinstance(info.value, UserError)


def test_malformed_redis_url() -> None:
    with pytest.raises(StoreURLError, match="invalid Redis URL"):
        open_store("redis://127.0.0.1:notaport/0")
