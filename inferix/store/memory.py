"""`MemoryStore`: the embedded default backend (one process, state lost on exit).

Every method runs to completion without awaiting anything, so on one event loop each call is
atomic by construction; a lock also makes it safe to share between threads (e.g. a gRPC
servicer and a metrics thread). Expiry uses the monotonic clock so wall-clock jumps never
resurrect or kill keys; expired keys are dropped lazily when touched or listed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from inferix.store.base import UpdateFn, check_key, check_ttl


@dataclass
class _Entry:
    value: bytes | list[bytes]
    expires_at: float | None = None  # time.monotonic() deadline


class MemoryStore:
    """In-process `Store`; see the module docstring for its concurrency guarantees."""

    persistent = False

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "MemoryStore()"

    @staticmethod
    def _deadline(ttl_s: float | None) -> float | None:
        ttl_s = check_ttl(ttl_s)
        return None if ttl_s is None else time.monotonic() + ttl_s

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(check_key(key))
        if entry is not None and entry.expires_at is not None and entry.expires_at <= time.monotonic():
            del self._entries[key]
            return None
        return entry

    def _value(self, key: str) -> bytes | None:
        entry = self._live(key)
        if entry is None:
            return None
        if not isinstance(entry.value, bytes):
            raise TypeError(f"key {key!r} holds a list; read it with get_list")
        return entry.value

    def _write(self, key: str, value: bytes | None, ttl_s: float | None) -> None:
        if value is None:
            self._entries.pop(key, None)
        else:
            self._entries[key] = _Entry(bytes(value), self._deadline(ttl_s))

    async def ping(self) -> None:
        return None

    async def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._value(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        with self._lock:
            return [self._value(key) for key in keys]

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        check_ttl(ttl_s)
        with self._lock:
            self._write(check_key(key), value, ttl_s)

    async def delete(self, key: str) -> bool:
        with self._lock:
            existed = self._live(key) is not None
            self._entries.pop(key, None)
            return existed

    async def compare_and_set(
        self, key: str, expected: bytes | None, new: bytes | None, *, ttl_s: float | None = None
    ) -> bool:
        check_ttl(ttl_s)
        with self._lock:
            if self._value(key) != expected:
                return False
            self._write(key, new, ttl_s)
            return True

    async def update(self, key: str, fn: UpdateFn, *, ttl_s: float | None = None) -> bytes | None:
        check_ttl(ttl_s)
        with self._lock:
            new = fn(self._value(key))
            self._write(key, new, ttl_s)
            return new

    async def list_prefix(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key in list(self._entries) if key.startswith(prefix) and self._live(key))

    async def append(self, key: str, value: bytes, *, ttl_s: float | None = None) -> int:
        check_ttl(ttl_s)
        with self._lock:
            entry = self._live(key)
            if entry is None:
                entry = self._entries[key] = _Entry([])
            if not isinstance(entry.value, list):
                raise TypeError(f"key {key!r} holds a value, not a list")
            entry.value.append(bytes(value))
            if ttl_s is not None:
                entry.expires_at = self._deadline(ttl_s)
            return len(entry.value)

    async def get_list(self, key: str) -> list[bytes]:
        with self._lock:
            entry = self._live(key)
            if entry is None:
                return []
            if not isinstance(entry.value, list):
                raise TypeError(f"key {key!r} holds a value, not a list")
            return list(entry.value)

    async def expire(self, key: str, ttl_s: float | None) -> bool:
        check_ttl(ttl_s)
        with self._lock:
            entry = self._live(key)
            if entry is None:
                return False
            entry.expires_at = self._deadline(ttl_s)
            return True

    async def ttl(self, key: str) -> float | None:
        with self._lock:
            entry = self._live(key)
            if entry is None or entry.expires_at is None:
                return None
            return max(0.0, entry.expires_at - time.monotonic())

    async def close(self) -> None:
        with self._lock:
            self._entries.clear()
