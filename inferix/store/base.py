"""The `Store` protocol: the small key-value interface the services keep their state in.

The scheduler (session state) and kvcache_svc (worker registry, reservations, committed block
latents) need the same few operations, and must run both embedded (`MemoryStore`, one process,
nothing to install) and against Redis (`RedisStore`, shared and durable). Keeping the interface
this small is what lets one test suite run unchanged against both backends.

Values are opaque `bytes` (callers serialise with protobuf or JSON); keys are non-empty strings
relative to the store's namespace. Every method is atomic on its own; `update` and
`compare_and_set` are the read-modify-write primitives, atomic against every other client of
the same store (other tasks, other processes, other hosts for Redis).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from inferix.errors import InferixError, UserError

UpdateFn = Callable[[bytes | None], bytes | None]
"""`fn(current) -> new` for `Store.update`: `current` is None when the key is absent; returning
None deletes the key. It may run more than once (after a conflicting write) so it must not have
side effects; raising aborts the update without writing and the exception reaches the caller."""


class StoreError(InferixError):
    """The store could not do what was asked (base class)."""


class StoreURLError(StoreError, UserError):
    """A store URL `open_store` does not understand."""


class StoreUnavailableError(StoreError):
    """The backend cannot be reached (e.g. Redis is down); retrying later may succeed."""


class StoreConflictError(StoreError):
    """An atomic update kept losing to concurrent writers and gave up."""


@runtime_checkable
class Store(Protocol):
    """Async key-value store with TTLs, atomic updates, prefix listing and append-only lists."""

    # Whether what is written outlives this process (sessions can then survive a restart).
    persistent: bool

    async def ping(self) -> None:
        """Check that the backend answers; raises `StoreUnavailableError` otherwise."""
        ...

    async def get(self, key: str) -> bytes | None:
        """The value of `key`, or None when absent or expired."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of `keys` in order (None where absent), in one round trip."""
        ...

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        """Set `key`; `ttl_s` makes it expire that many seconds from now (None: never)."""
        ...

    async def delete(self, key: str) -> bool:
        """Remove `key` (a value or a list); True when it existed."""
        ...

    async def compare_and_set(
        self, key: str, expected: bytes | None, new: bytes | None, *, ttl_s: float | None = None
    ) -> bool:
        """Atomically set `key` to `new` (None: delete) only if it currently holds `expected`
        (None: absent). True when the write happened."""
        ...

    async def update(self, key: str, fn: UpdateFn, *, ttl_s: float | None = None) -> bytes | None:
        """Atomically replace the value of `key` by `fn(current)`; returns the value written
        (None when `fn` deleted the key). The new value gets `ttl_s` like `put`."""
        ...

    async def list_prefix(self, prefix: str) -> list[str]:
        """Live keys that start with `prefix` (literally, no patterns), sorted."""
        ...

    async def append(self, key: str, value: bytes, *, ttl_s: float | None = None) -> int:
        """Append `value` to the list at `key` (created when absent); returns its new length.
        `ttl_s` (when given) restarts the whole list's expiry."""
        ...

    async def get_list(self, key: str) -> list[bytes]:
        """Every item of the list at `key` in append order ([] when absent)."""
        ...

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        """Make `key` expire `ttl_s` seconds from now, or never (None); True when it exists."""
        ...

    async def ttl(self, key: str) -> float | None:
        """Seconds until `key` expires; None when it has no expiry or does not exist."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...


def check_key(key: str) -> str:
    """Reject keys that would be ambiguous in any backend."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"store keys must be non-empty strings, got {key!r}")
    return key


def check_ttl(ttl_s: float | None) -> float | None:
    """A TTL must be positive: a zero or negative TTL is almost always a unit bug in the caller."""
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0 seconds or None (no expiry), got {ttl_s!r}")
    return ttl_s
