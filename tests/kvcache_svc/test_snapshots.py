"""kvcache_svc's snapshot store: one snapshot per session, never replaced by an older one, expiring with the
session (in-process, on the in-memory store; the mesh tests run it on Redis)."""

from __future__ import annotations

import asyncio

import pytest

from inferix.api.v1 import kvcache_pb2
from inferix.store.memory import MemoryStore
from kvcache_svc.errors import InvalidRequestError
from kvcache_svc.snapshots import SnapshotStore


def snapshot(next_block: int) -> kvcache_pb2.KVSnapshot:
    return kvcache_pb2.KVSnapshot(next_block=next_block, next_frame=3 * next_block, state=b"x" * next_block)


def test_the_latest_snapshot_is_kept_and_an_older_one_never_replaces_it() -> None:
    async def scenario() -> None:
        snapshots = SnapshotStore(MemoryStore())
        assert await snapshots.get("s") is None
        assert await snapshots.put("s", snapshot(8))
        assert not await snapshots.put("s", snapshot(4))  # shipped late: dropped
        assert not await snapshots.put("s", snapshot(8))
        kept = await snapshots.get("s")
        assert kept is not None and (kept.next_block, kept.state) == (8, b"x" * 8)
        assert await snapshots.put("s", snapshot(16))
        kept = await snapshots.get("s")
        assert kept is not None and kept.next_block == 16
        assert await snapshots.get("other") is None
        with pytest.raises(InvalidRequestError):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=0, state=b"x"))
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await snapshots.get("s") is None

    asyncio.run(scenario())
