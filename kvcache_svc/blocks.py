"""Committed block latents per session: the durable input of recovery by recompute.

Layout in the store (one value per block, because a block's latents are ~1 MB and a session
can run for hours, ~19,000 toyworld blocks an hour; rewriting one growing value per commit would be
quadratic, so the index too is in pages of INDEX_PAGE_BLOCKS blocks):

    kvcache/blocks/<session>/index                 JSON {block index: content digest}, blocks 0-1023
    kvcache/blocks/<session>/index/<page:06d>      the same for blocks from page * 1024 (page >= 1)
    kvcache/blocks/<session>/<index:010d>-<digest> the CommittedBlock message, serialised
    kvcache/blocks/<session>/dropped-before        the first block kept (absent: 0), see `drop_before`

A commit reads and rewrites one page (at most 1,024 entries, ~45 KB), whatever the session's length;
reading the whole listing (a recovery) reads every page. Pages follow each other: blocks are
committed in order, so the listing stops at the first page that is missing. The first page's key is
the session's: its expiry is the session's (a released session's blocks expire together).

Commit writes the block value first and then adds it to the index with one atomic update, so a
crash between the two leaves an unreferenced value, never an index entry without data. The
digest in the key means a conflicting commit can never overwrite committed bytes. Committing
the same index again with identical content is a no-op (workers retry; recovery re-runs
blocks deterministically); different content is refused, because it means two workers are
generating the same session.

A long session does not keep every block: once the session's anchor snapshot (kvcache_svc/snapshots.py)
covers them, nothing reads the blocks before it (a recovery replays from the latest snapshot, a
restarted streamer's frames are decoded again from the anchor), so `drop_before` deletes them and
their index pages, and reading from before the first block kept is refused (`BlocksDroppedError`).
The store then holds a bounded window of blocks however long the session runs.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial

from inferix.spec.blocks import CommittedBlock
from inferix.store import Store, StoreError
from kvcache_svc.errors import AlreadyCommittedError, BlocksDroppedError, InvalidRequestError
from kvcache_svc.registry import require_id

BLOCKS_PREFIX = "kvcache/blocks/"
MIN_TTL_S = 0.001  # a key about to expire keeps a positive TTL when copied to a new key


def validate_block(block: CommittedBlock, session_id: str) -> None:
    """Refuse a malformed block before it is stored (INVALID_ARGUMENT, naming the block)."""
    problem = block.problem()
    if problem is not None:
        raise InvalidRequestError(f"block {block.block_index} of session {session_id!r}: {problem}")


INDEX_PAGE_BLOCKS = 1024
LISTING_PAGES_PER_READ = 16


def _index_key(session_id: str, page: int = 0) -> str:
    """The key of an index page; page 0's is the session's key (its expiry is the session's)."""
    base = f"{BLOCKS_PREFIX}{session_id}/index"
    return base if page == 0 else f"{base}/{page:06d}"


async def session_ttl(store: Store, session_id: str) -> float | None:
    """The TTL for a key the session adds now: None while it runs; once it is released (its keys
    expire), the session's remaining time, so that a key added late follows the same clock."""
    ttl = await store.ttl(_index_key(session_id))
    return None if ttl is None else max(ttl, MIN_TTL_S)


def _dropped_key(session_id: str) -> str:
    return f"{BLOCKS_PREFIX}{session_id}/dropped-before"


def _block_key(session_id: str, block_index: int, digest: str) -> str:
    return f"{BLOCKS_PREFIX}{session_id}/{block_index:010d}-{digest}"


def _decode_index(data: bytes | None) -> dict[int, str]:
    return {int(index): digest for index, digest in json.loads(data).items()} if data else {}


def _entries_from(first: int, old: bytes | None) -> bytes:
    """An index page without its entries before `first`."""
    return _encode_index({i: d for i, d in _decode_index(old).items() if i >= first})


def _first_kept(data: bytes | None) -> int:
    return int(data) if data else 0


def _encode_index(index: dict[int, str]) -> bytes:
    return json.dumps({str(i): d for i, d in sorted(index.items())}).encode()


class BlockStore:
    """Commit, read and expire the committed blocks of sessions."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def commit(self, session_id: str, block: CommittedBlock) -> bool:
        """Store `block`; True when it is new, False when the same content was already there."""
        require_id("session_id", session_id)
        validate_block(block, session_id)
        payload = block.encode()
        digest = hashlib.sha256(payload).hexdigest()[:32]
        index_key = _index_key(session_id, block.block_index // INDEX_PAGE_BLOCKS)

        def conflict(existing: str) -> AlreadyCommittedError:
            return AlreadyCommittedError(
                f"block {block.block_index} of session {session_id!r} is already committed with different "
                f"content (digest {existing}, this one {digest}); committed blocks are immutable, so another "
                "worker is probably generating this session"
            )

        page, dropped = await self.store.get_many([index_key, _dropped_key(session_id)])
        if block.block_index < _first_kept(dropped):
            return False  # a late retry of a block committed long ago and dropped since
        existing = _decode_index(page).get(block.block_index)
        if existing == digest:
            return False
        if existing is not None:
            raise conflict(existing)
        ttl = await session_ttl(self.store, session_id)
        block_key = _block_key(session_id, block.block_index, digest)
        await self.store.put(block_key, payload, ttl_s=ttl)
        added = False

        def add(old: bytes | None) -> bytes:
            nonlocal added
            index = _decode_index(old)
            current = index.get(block.block_index)
            if current is not None and current != digest:
                raise conflict(current)
            added = current is None
            index[block.block_index] = digest
            return _encode_index(index)

        try:
            await self.store.update(index_key, add, ttl_s=ttl)
        except AlreadyCommittedError:
            await self.store.delete(block_key)  # ours is unreferenced; the winner's key differs
            raise
        return added

    async def first_kept(self, session_id: str) -> int:
        """The session's first block not dropped (0 until `drop_before`)."""
        return _first_kept(await self.store.get(_dropped_key(session_id)))

    async def listing(self, session_id: str, from_block: int = 0) -> list[tuple[int, str]] | None:
        """(block index, digest) of the session's committed blocks from `from_block`, ascending; None when
        it has never committed one. Read it once and `read` it in slices: a long session's index is
        large. `BlocksDroppedError` when `from_block` is before the first block kept."""
        require_id("session_id", session_id)
        first_kept = await self.first_kept(session_id)
        if from_block < first_kept:
            raise BlocksDroppedError(
                f"the committed blocks of session {session_id!r} before block {first_kept} were dropped (its "
                f"anchor snapshot covers them); block {from_block} and later cannot be read, only {first_kept} "
                "and later"
            )
        index = await self._index(session_id, first_page=first_kept // INDEX_PAGE_BLOCKS)
        if not index and not first_kept:
            return None
        return sorted((i, d) for i, d in index.items() if i >= from_block)

    async def _index(self, session_id: str, first_page: int = 0) -> dict[int, str]:
        """The pages of the session's index from `first_page` on, merged."""
        index: dict[int, str] = {}
        first = first_page
        while True:
            pages = range(first, first + LISTING_PAGES_PER_READ)
            values = await self.store.get_many([_index_key(session_id, page) for page in pages])
            for value in values:
                if value is None:
                    return index
                index.update(_decode_index(value))
            first += LISTING_PAGES_PER_READ

    async def read(self, session_id: str, listed: list[tuple[int, str]]) -> list[CommittedBlock]:
        """These blocks of `listing`, in the order given (one store round trip)."""
        values = await self.store.get_many([_block_key(session_id, i, d) for i, d in listed])
        missing = [i for (i, _), value in zip(listed, values, strict=True) if value is None]
        if missing:
            raise StoreError(
                f"committed blocks {missing} of session {session_id!r} are listed but missing from the store "
                "(expired or deleted outside kvcache_svc)"
            )
        return [CommittedBlock.decode(value) for value in values if value is not None]

    async def get(self, session_id: str) -> list[CommittedBlock] | None:
        """The session's blocks by ascending index; None when it has never committed one."""
        listed = await self.listing(session_id)
        return None if listed is None else await self.read(session_id, listed)

    async def drop_before(self, session_id: str, before_block: int) -> int:
        """Delete the session's committed blocks before `before_block` (its anchor's next block); how many.

        Idempotent, and safe to interrupt anywhere (kvcache_svc may be killed meanwhile): blocks are deleted
        before their page forgets them (no block is left that no page names), the first-kept mark moves
        before emptied pages go, and the next call starts again from the previous mark's page. Page 0
        stays (empty): its key is the session's."""
        require_id("session_id", session_id)
        previous = await self.first_kept(session_id)
        if before_block <= previous:
            return 0
        ttl = await session_ttl(self.store, session_id)
        dropped = 0
        last_page = (before_block - 1) // INDEX_PAGE_BLOCKS
        for page in range(previous // INDEX_PAGE_BLOCKS, last_page + 1):
            entries = await self.store.get(_index_key(session_id, page))
            if entries is None:
                break  # pages follow each other: none after a missing one
            gone = [(i, d) for i, d in _decode_index(entries).items() if i < before_block]
            for block_index, digest in gone:
                await self.store.delete(_block_key(session_id, block_index, digest))
            await self.store.update(_index_key(session_id, page), partial(_entries_from, before_block), ttl_s=ttl)
            dropped += len(gone)

        def later(old: bytes | None) -> bytes:
            return str(max(_first_kept(old), before_block)).encode()

        await self.store.update(_dropped_key(session_id), later, ttl_s=ttl)
        for page in range(max(1, previous // INDEX_PAGE_BLOCKS), before_block // INDEX_PAGE_BLOCKS):
            await self.store.delete(_index_key(session_id, page))  # wholly before the mark: empty now
        return dropped

    async def expire(self, session_id: str, ttl_s: float) -> int:
        """Let every committed block of the session expire in `ttl_s`; returns how many."""
        require_id("session_id", session_id)
        first_page = await self.first_kept(session_id) // INDEX_PAGE_BLOCKS
        index = await self._index(session_id, first_page)
        for block_index, digest in index.items():
            await self.store.expire(_block_key(session_id, block_index, digest), ttl_s)
        # the pages before the first kept too: a drop_before interrupted after its mark may have left some
        pages = {block_index // INDEX_PAGE_BLOCKS for block_index in index} | set(range(first_page + 1))
        await self.store.expire(_dropped_key(session_id), ttl_s)
        for page in sorted(pages, reverse=True):  # the session's key last: a commit meanwhile reads its TTL
            await self.store.expire(_index_key(session_id, page), ttl_s)
        return len(index)
