"""State stores shared by the services: `Store` protocol, `MemoryStore`, `RedisStore`, `open_store`.

    store = open_store(os.environ.get("INFERIX_REDIS_URL"))   # None -> embedded MemoryStore
    await store.update("sessions/s1", lambda old: new_state(old))

`RedisStore` is imported lazily so that the embedded default works without redis-py.
"""

from __future__ import annotations

from inferix.store.base import (
    Store,
    StoreConflictError,
    StoreError,
    StoreUnavailableError,
    StoreURLError,
    UpdateFn,
)
from inferix.store.memory import MemoryStore

__all__ = [
    "MemoryStore",
    "Store",
    "StoreConflictError",
    "StoreError",
    "StoreURLError",
    "StoreUnavailableError",
    "UpdateFn",
    "open_store",
]

_REDIS_SCHEMES = ("redis", "rediss", "unix")


def open_store(url: str | None) -> Store:
    """The store for `url`: None or "memory://" -> `MemoryStore`; "redis://host:port/db"
    (also rediss://, unix://) -> `RedisStore` (connects on first use; call `ping()` to check)."""
    if url is None or url == "memory://":
        return MemoryStore()
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() in _REDIS_SCHEMES:
        from inferix.store.redis_store import RedisStore

        return RedisStore.from_url(url)
    raise StoreURLError(f"unsupported store URL {url!r}: use memory:// (embedded, the default) or redis://host:port/db")
