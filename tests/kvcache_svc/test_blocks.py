"""kvcache_svc's committed-block store over an hour-long session: the index is paged, so a commit
rewrites one page whatever the session's length, and listing, reading and expiry cover every page
(in-process, on the in-memory store and on a real redis-server)."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from inferix.spec.blocks import CommittedBlock
from inferix.store import open_store
from kvcache_svc.blocks import INDEX_PAGE_BLOCKS, BlockStore

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
