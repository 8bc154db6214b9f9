"""kvcache_svc's snapshot store: the latest snapshot per session, never replaced by an older one; the
anchor, the newest snapshot the session's recording holds, which only moves forward; everything
expiring with the session (in-process, on the in-memory store and on a real redis-server)."""

from __future__ import annotations

import asyncio
import time

import pytest

from inferix.api.v1 import kvcache_pb2
from inferix.store import open_store
from inferix.store.memory import MemoryStore
from kvcache_svc.errors import InvalidRequestError, NotFoundError, PreconditionError
from kvcache_svc.snapshots import LEASES_PREFIX, MAX_CANDIDATES, SnapshotStore


def snapshot(next_block: int) -> kvcache_pb2.KVSnapshot:
    return kvcache_pb2.KVSnapshot(next_block=next_block, next_frame=3 * next_block, state=b"x" * next_block)


def test_the_latest_snapshot_is_kept_and_an_older_one_never_replaces_it() -> None:
    async def scenario() -> None:
        snapshots = SnapshotStore(MemoryStore())
        assert await snapshots.get("s") is None
        assert (await snapshots.put("s", snapshot(8))).stored
        assert not (await snapshots.put("s", snapshot(4))).stored  # shipped late: dropped
        assert not (await snapshots.put("s", snapshot(8))).stored
        kept = await snapshots.get("s")
        assert kept is not None and (kept.next_block, kept.state) == (8, b"x" * 8)
        assert (await snapshots.put("s", snapshot(16))).stored
        kept = await snapshots.get("s")
        assert kept is not None and kept.next_block == 16
        assert await snapshots.get("other") is None
        with pytest.raises(InvalidRequestError):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=0, state=b"x"))
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await snapshots.get("s") is None

    asyncio.run(scenario())


def test_a_snapshot_in_pieces_is_kept_only_whole_and_a_late_one_takes_its_pieces_along(
    store_url: str,
) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        snapshots = SnapshotStore(store)

        async def put_pieces(next_block: int, pieces: int) -> kvcache_pb2.KVSnapshot:
            for index in range(pieces):
                await snapshots.put_piece("s", next_block, index, bytes([next_block, index]) * 4)
            return kvcache_pb2.KVSnapshot(next_block=next_block, pieces=pieces, state_sha256="digest")

        assert (await snapshots.put("s", await put_pieces(8, 3))).stored
        assert [await snapshots.get_piece("s", 8, i) for i in range(3)] == [bytes([8, i]) * 4 for i in range(3)]
        # A late, older snapshot is dropped with its pieces; the kept one's pieces stay.
        assert not (await snapshots.put("s", await put_pieces(4, 2))).stored
        with pytest.raises(NotFoundError, match="piece 0 of the snapshot of session 's' at block 4 is gone"):
            await snapshots.get_piece("s", 4, 0)
        assert await snapshots.get_piece("s", 8, 2) == bytes([8, 2]) * 4
        # A snapshot whose pieces did not all arrive is refused, and the latest stays.
        await snapshots.put_piece("s", 16, 0, b"a")
        with pytest.raises(PreconditionError, match="names 2 pieces but 1 were put"):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=16, pieces=2))
        kept = await snapshots.get("s")
        assert kept is not None and kept.next_block == 8
        # A newer whole one replaces it (the replaced one waits as a candidate for the anchor, with its
        # pieces); pieces wait for their snapshot with a TTL.
        assert await store.ttl("kvcache/snapshot-pieces/s/16/0") is not None
        await snapshots.put_piece("s", 16, 1, b"b")
        assert (await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=16, pieces=2))).stored
        assert await store.ttl("kvcache/snapshot-pieces/s/16/0") is None  # the latest's pieces live as long as it
        assert len(await store.list_prefix("kvcache/snapshot-pieces/s/8/")) == 3
        with pytest.raises(InvalidRequestError, match="inline or in pieces, not both"):
            await snapshots.put("s", kvcache_pb2.KVSnapshot(next_block=20, pieces=1, state=b"x"))
        # Released: the snapshots and their pieces expire together.
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await snapshots.get("s") is None
        assert await store.list_prefix("kvcache/snapshot-pieces/s/") == []
        await store.close()

    asyncio.run(scenario())


def test_the_newest_snapshot_the_recording_holds_becomes_the_anchor_and_only_moves_forward(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        snapshots = SnapshotStore(store)

        async def put(next_block: int, durable_frames: int) -> int:
            put = await snapshots.put("s", snapshot(next_block), durable_frames)
            assert put.stored
            return put.anchor

        async def candidates() -> list[int]:
            keys = await store.list_prefix("kvcache/snapshot-candidates/s/")
            return sorted(int(key.rsplit("/", 1)[1]) for key in keys)

        assert await put(8, 0) == 0  # the latest is never the anchor: the next put may promote it
        assert await put(16, 10) == 0  # block 8 starts at frame 24: not durable yet, it waits
        assert await candidates() == [8]
        assert await put(24, 30) == 8  # frame 24 is held now; 16 (frame 48) is not
        assert await candidates() == [16]
        anchor = await snapshots.get("s", anchor=True)
        assert anchor is not None and (anchor.next_block, anchor.state) == (8, b"x" * 8)
        assert await put(32, 100) == 24  # the newest held wins; the older candidates it passed go
        assert await candidates() == []
        late = await snapshots.put("s", snapshot(20), 100)  # shipped late: neither latest nor anchor
        assert (late.stored, late.anchor) == (False, 24)
        assert await put(40, 100) == 32  # 32 starts at frame 96: held
        # A recording that stops growing (its streamer away): candidates pile up to the cap, oldest out.
        for next_block in range(48, 48 + 8 * (MAX_CANDIDATES + 2), 8):
            assert await put(next_block, 100) == 32
        assert len(await candidates()) == MAX_CANDIDATES
        latest = await snapshots.get("s")
        assert latest is not None and await candidates() == list(
            range(latest.next_block - 8 * MAX_CANDIDATES, latest.next_block, 8)
        )
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await snapshots.get("s", anchor=True) is None and await candidates() == []
        await store.close()

    asyncio.run(scenario())


def test_pieces_stay_while_a_kept_snapshot_names_them(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        snapshots = SnapshotStore(store)

        async def put(next_block: int, durable_frames: int) -> int:
            await snapshots.put_piece("s", next_block, 0, bytes([next_block]))
            message = kvcache_pb2.KVSnapshot(next_block=next_block, next_frame=3 * next_block, pieces=1)
            return (await snapshots.put("s", message, durable_frames)).anchor

        async def pieces() -> list[int]:
            keys = await store.list_prefix("kvcache/snapshot-pieces/s/")
            return sorted(int(key.split("/")[3]) for key in keys)

        await put(8, 0)
        await put(16, 0)
        assert await pieces() == [8, 16]  # the latest's and a candidate's
        assert await put(24, 24) == 8
        assert await pieces() == [8, 16, 24]  # the anchor's, a candidate's, the latest's
        assert await put(32, 72) == 24  # 16 passed by: its pieces go; the old anchor's too
        assert await pieces() == [24, 32]
        assert await snapshots.get_piece("s", 24, 0) == bytes([24])
        assert await snapshots.expire("s", 0.01)
        await asyncio.sleep(0.05)
        assert await pieces() == []
        await store.close()

    asyncio.run(scenario())


def test_a_put_waits_out_the_lease_of_a_replica_that_died_holding_it(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        snapshots = SnapshotStore(store)
        # A replica that died in the middle of a put of session "s" left its lease behind.
        await store.put(f"{LEASES_PREFIX}s", b"dead replica", ttl_s=0.4)
        started = time.monotonic()
        assert (await snapshots.put("s", snapshot(8))).stored
        assert time.monotonic() - started >= 0.3  # not before the lease expired
        assert await store.get(f"{LEASES_PREFIX}s") is None  # the put gave its own back
        assert (await snapshots.put("other", snapshot(8))).stored  # another session takes its own lease
        await store.close()

    asyncio.run(scenario())
