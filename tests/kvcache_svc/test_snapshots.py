"""kvcache_svc's snapshot store: one snapshot per session, never replaced by an older one, expiring with the
session (in-process, on the in-memory store and on a real redis-server)."""

from __future__ import annotations

import asyncio

import pytest

from inferix.api.v1 import kvcache_pb2
from inferix.store import open_store
from inferix.store.memory import MemoryStore
from kvcache_svc.errors import InvalidRequestError, NotFoundError, PreconditionError
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


def test_a_snapshot_in_pieces_is_kept_only_whole_and_the_one_it_replaces_takes_its_pieces_along(
    store_url: str,
) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        snapshots = SnapshotStore(store)

        async def put_pieces(next_block: int, pieces: int) -> kvcache_pb2.KVSnapshot:
            for index in range(pieces):
                await snapshots.put_piece("s", next_block, index, bytes([next_block, index]) * 4)
            return kvcache_pb2.KVSnapshot(next_block=next_block, pieces=pieces, state_sha256="digest")

        assert await snapshots.put("s", await put_pieces(8, 3))
        assert [await snapshots.get_piece("s", 8, i) for i in range(3)] == [bytes([8, i]) * 4 for i in range(3)]
        # A late, older snapshot is dropped with its pieces; the kept one's pieces stay.
        assert not await snapshots.put("s", await put_pieces(4, 2))
        with pytest.raises(NotFoundError, match="piece 0 of the snapshot of session 's' at block 4 is gone"):
            await snapshots.get_piece("s", 4, 0)
        assert await snapshots.get_piece("s", 8, 2) == bytes([8, 2]) * 4
        # A snapshot whose pieces did not all arrive is refused, and the latest stays.
        await snapshots.put_piece("s", 16, 0, b"a")
        with pytest.raises(PreconditionError, match="names 2 pieces but 1 were put"):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=16, pieces=2))
        kept = await snapshots.get("s")
        assert kept is not None and kept.next_block == 8
        # A newer whole one replaces it: the replaced snapshot's pieces are deleted, pieces wait with a TTL.
        assert await store.ttl("kvcache/snapshot-pieces/s/16/0") is not None
        await snapshots.put_piece("s", 16, 1, b"b")
        assert await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=16, pieces=2))
        assert await store.ttl("kvcache/snapshot-pieces/s/16/0") is None  # the latest's pieces live as long as it
        assert await store.list_prefix("kvcache/snapshot-pieces/s/8/") == []
        with pytest.raises(InvalidRequestError, match="inline or in pieces, not both"):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=20, pieces=1, state=b"x"))
        # Released: the snapshot and its pieces expire together.
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await snapshots.get("s") is None
        assert await store.list_prefix("kvcache/snapshot-pieces/s/") == []
        await store.close()

    asyncio.run(scenario())
