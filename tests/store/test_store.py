"""The Store contract; every test runs against MemoryStore and a real redis-server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from inferix.store import Store, UpdateFn
from tests.store.conftest import Backend

SHORT_TTL_S = 0.3


def test_get_put_delete_round_trip_bytes(backend: Backend) -> None:
    async def body(store: Store) -> None:
        assert await store.get("missing") is None
        payload = bytes(range(256)) + b"\x00\r\n"
        await store.put("sessions/s1", payload)
        assert await store.get("sessions/s1") == payload
        await store.put("sessions/s1", b"v2")
        assert await store.get("sessions/s1") == b"v2"
        await store.put("empty", b"")
        assert await store.get("empty") == b""
        assert await store.delete("sessions/s1") is True
        assert await store.delete("sessions/s1") is False
        assert await store.get("sessions/s1") is None

    backend.run(body)


def test_get_many_keeps_order_and_reports_missing(backend: Backend) -> None:
    async def body(store: Store) -> None:
        await store.put("a", b"1")
        await store.put("c", b"3")
        assert await store.get_many(["c", "b", "a"]) == [b"3", None, b"1"]
        assert await store.get_many([]) == []

    backend.run(body)


def test_compare_and_set(backend: Backend) -> None:
    async def body(store: Store) -> None:
        assert await store.compare_and_set("k", None, b"first") is True  # create if absent
        assert await store.compare_and_set("k", None, b"again") is False
        assert await store.compare_and_set("k", b"wrong", b"x") is False
        assert await store.get("k") == b"first"
        assert await store.compare_and_set("k", b"first", b"second") is True
        assert await store.get("k") == b"second"
        assert await store.compare_and_set("k", b"second", None) is True  # delete
        assert await store.get("k") is None
        assert await store.compare_and_set("k", b"", b"x") is False  # empty value is not absence
        await store.put("e", b"")
        assert await store.compare_and_set("e", b"", b"now") is True
        assert await store.get("e") == b"now"

    backend.run(body)


def test_update_creates_modifies_deletes_and_aborts(backend: Backend) -> None:
    async def body(store: Store) -> None:
        seen: list[bytes | None] = []

        def increment(old: bytes | None) -> bytes:
            seen.append(old)
            return str(int(old or b"0") + 1).encode()

        assert await store.update("n", increment) == b"1"
        assert await store.update("n", increment) == b"2"
        assert seen == [None, b"1"]
        assert await store.update("n", lambda old: None) is None
        assert await store.get("n") is None

        await store.put("kept", b"v")

        def refuse(old: bytes | None) -> bytes:
            raise LookupError("not allowed")

        with pytest.raises(LookupError, match="not allowed"):
            await store.update("kept", refuse)
        assert await store.get("kept") == b"v"

    backend.run(body)


def test_list_prefix_is_literal_sorted_and_live(backend: Backend) -> None:
    async def body(store: Store) -> None:
        for key in ["w/b", "w/a", "w*/x", "x/a", "w"]:
            await store.put(key, b"1")
        await store.put("w/expiring", b"1", ttl_s=SHORT_TTL_S)
        assert await store.list_prefix("w/") == ["w/a", "w/b", "w/expiring"]
        assert await store.list_prefix("w*") == ["w*/x"]  # '*' is a character, not a pattern
        assert await store.list_prefix("nothing/") == []
        await asyncio.sleep(SHORT_TTL_S + 0.2)
        assert await store.list_prefix("w/") == ["w/a", "w/b"]

    backend.run(body)


def test_append_and_get_list(backend: Backend) -> None:
    async def body(store: Store) -> None:
        assert await store.get_list("events/s1") == []
        assert await store.append("events/s1", b"created") == 1
        assert await store.append("events/s1", b"\x00running") == 2
        assert await store.append("events/s2", b"other") == 1
        assert await store.get_list("events/s1") == [b"created", b"\x00running"]
        await store.put("plain", b"v")
        with pytest.raises(TypeError):
            await store.append("plain", b"x")
        with pytest.raises(TypeError):
            await store.get("events/s1")
        assert await store.delete("events/s1") is True
        assert await store.get_list("events/s1") == []

    backend.run(body)


def test_ttl_expiry_expire_and_persist(backend: Backend) -> None:
    async def body(store: Store) -> None:
        await store.put("short", b"v", ttl_s=SHORT_TTL_S)
        await store.put("forever", b"v")
        remaining = await store.ttl("short")
        assert remaining is not None and 0 < remaining <= SHORT_TTL_S
        assert await store.ttl("forever") is None
        assert await store.ttl("missing") is None

        await store.put("kept", b"v", ttl_s=SHORT_TTL_S)
        assert await store.expire("kept", None) is True  # persist
        await store.append("log", b"a", ttl_s=SHORT_TTL_S)
        await store.update("updated", lambda old: b"u", ttl_s=SHORT_TTL_S)
        await store.put("later", b"v")
        assert await store.expire("later", SHORT_TTL_S) is True
        assert await store.expire("missing", SHORT_TTL_S) is False
        assert await store.expire("missing", None) is False

        await asyncio.sleep(SHORT_TTL_S + 0.2)
        assert await store.get("short") is None
        assert await store.get("forever") == b"v"
        assert await store.get("kept") == b"v"
        assert await store.get_list("log") == []
        assert await store.get("updated") is None
        assert await store.get("later") is None

    backend.run(body)


def test_put_without_ttl_clears_an_earlier_ttl(backend: Backend) -> None:
    async def body(store: Store) -> None:
        await store.put("k", b"1", ttl_s=SHORT_TTL_S)
        await store.put("k", b"2")
        assert await store.ttl("k") is None

    backend.run(body)


def test_bad_keys_and_ttls_are_rejected(backend: Backend) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(ValueError, match="non-empty"):
            await store.put("", b"v")
        with pytest.raises(ValueError, match="ttl_s must be > 0"):
            await store.put("k", b"v", ttl_s=0)
        with pytest.raises(ValueError, match="ttl_s must be > 0"):
            await store.append("k", b"v", ttl_s=-1)
        assert await store.get("k") is None

    backend.run(body)


def test_concurrent_updates_are_atomic(backend: Backend) -> None:
    """Many tasks increment one counter and append to one JSON list: no update may be lost."""
    tasks, rounds = 20, 5

    async def body(store: Store) -> None:
        def add(task: int, step: int) -> UpdateFn:
            def fn(old: bytes | None) -> bytes:
                doc: dict[str, Any] = json.loads(old) if old else {"count": 0, "seen": []}
                doc["count"] += 1
                doc["seen"].append(f"{task}.{step}")
                return json.dumps(doc).encode()

            return fn

        async def worker(task: int) -> None:
            for step in range(rounds):
                await store.update("counter", add(task, step))
                await asyncio.sleep(0)

        await asyncio.gather(*(worker(task) for task in range(tasks)))
        doc = json.loads(await store.get("counter") or b"{}")
        assert doc["count"] == tasks * rounds
        assert sorted(doc["seen"]) == sorted(f"{t}.{s}" for t in range(tasks) for s in range(rounds))

    backend.run(body)


def test_concurrent_create_if_absent_has_one_winner(backend: Backend) -> None:
    async def body(store: Store) -> None:
        results = await asyncio.gather(*(store.compare_and_set("lock", None, str(i).encode()) for i in range(30)))
        assert results.count(True) == 1
        winner = results.index(True)
        assert await store.get("lock") == str(winner).encode()

    backend.run(body)
