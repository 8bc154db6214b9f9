"""kvcache_svc's committed-block store over an hour-long session: the index is paged, so a commit
rewrites one page whatever the session's length, and listing, reading and expiry cover every page
Blocks before a session's anchor snapshot are dropped, index pages with them, so a session keeps a
bounded window (in-process, on the in-memory store and on a real redis-server)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from inferix.spec.blocks import CommittedBlock
from inferix.store import open_store
from kvcache_svc.blocks import INDEX_PAGE_BLOCKS, BlockStore
from kvcache_svc.errors import BlocksDroppedError

BLOCKS = 2 * INDEX_PAGE_BLOCKS + 50  # three index pages


def block(index: int) -> CommittedBlock:
    latents = np.full((1, 2, 2, 2), index, dtype="<f4").tobytes()
    return CommittedBlock(index, index, (1, 2, 2, 2), latents)


def test_a_long_session_commits_into_bounded_index_pages_and_lists_reads_and_expires_them_all(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        blocks = BlockStore(store)
        for i in range(BLOCKS):
            assert await blocks.commit("s", block(i))
        assert not await blocks.commit("s", block(BLOCKS - 1))  # the same content again: a no-op
        pages = sorted(await store.list_prefix("kvcache/blocks/s/index"))
        assert pages == ["kvcache/blocks/s/index", "kvcache/blocks/s/index/000001", "kvcache/blocks/s/index/000002"]
        sizes = [len(json.loads(await store.get(key) or b"{}")) for key in pages]
        assert sizes == [INDEX_PAGE_BLOCKS, INDEX_PAGE_BLOCKS, 50]  # what one commit rewrites stays this size
        listed = await blocks.listing("s")
        assert listed is not None and [i for i, _ in listed] == list(range(BLOCKS))
        tail = await blocks.read("s", listed[INDEX_PAGE_BLOCKS - 2 : INDEX_PAGE_BLOCKS + 2])
        assert [b.block_index for b in tail] == list(range(INDEX_PAGE_BLOCKS - 2, INDEX_PAGE_BLOCKS + 2))
        assert tail[2].latents == block(INDEX_PAGE_BLOCKS).latents
        assert await blocks.expire("s", 0.05) == BLOCKS
        await asyncio.sleep(0.2)
        assert await blocks.listing("s") is None
        assert await store.list_prefix("kvcache/blocks/s/") == []
        await store.close()

    asyncio.run(scenario())


def test_blocks_before_the_anchor_are_dropped_with_their_index_pages_and_cannot_be_read(store_url: str) -> None:
    async def scenario() -> None:
        store = open_store(store_url)
        blocks = BlockStore(store)
        for i in range(BLOCKS):
            await blocks.commit("s", block(i))
        assert await blocks.drop_before("s", 40) == 40
        assert await blocks.drop_before("s", 40) == 0  # again: nothing left to drop
        assert await blocks.drop_before("s", 30) == 0  # the first block kept only moves forward
        assert await blocks.first_kept("s") == 40
        with pytest.raises(BlocksDroppedError, match="before block 40 were dropped .* only 40 and later"):
            await blocks.listing("s")
        listed = await blocks.listing("s", 40)
        assert listed is not None and [i for i, _ in listed] == list(range(40, BLOCKS))
        # Past a whole page: page 1 goes, page 0 stays (empty: its key carries the session's expiry).
        assert await blocks.drop_before("s", INDEX_PAGE_BLOCKS + 10) == INDEX_PAGE_BLOCKS + 10 - 40
        pages = sorted(await store.list_prefix("kvcache/blocks/s/index"))
        assert pages == ["kvcache/blocks/s/index", "kvcache/blocks/s/index/000001", "kvcache/blocks/s/index/000002"]
        assert json.loads(await store.get("kvcache/blocks/s/index") or b"") == {}
        assert await blocks.drop_before("s", 2 * INDEX_PAGE_BLOCKS + 5) == INDEX_PAGE_BLOCKS - 5
        pages = sorted(await store.list_prefix("kvcache/blocks/s/index"))
        assert pages == ["kvcache/blocks/s/index", "kvcache/blocks/s/index/000002"]
        listed = await blocks.listing("s", 2 * INDEX_PAGE_BLOCKS + 5)
        assert listed is not None and [i for i, _ in listed] == list(range(2 * INDEX_PAGE_BLOCKS + 5, BLOCKS))
        first = 2 * INDEX_PAGE_BLOCKS + 5
        assert [b.block_index for b in await blocks.read("s", listed[:2])] == [first, first + 1]
        block_keys = [k for k in await store.list_prefix("kvcache/blocks/s/") if "/index" not in k]
        assert len(block_keys) == 45 + 1  # the blocks kept and the first-kept mark
        # A late retry of a dropped block is a no-op; new blocks go on.
        assert not await blocks.commit("s", block(3))
        assert await blocks.commit("s", block(BLOCKS))
        assert await blocks.expire("s", 0.05) == 46
        await asyncio.sleep(0.2)
        assert await store.list_prefix("kvcache/blocks/s/") == []
        await store.close()

    asyncio.run(scenario())
