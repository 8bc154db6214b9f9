"""The latest KV snapshot of each session: what bounds recovery time (see engine/snapshot.py).

A worker ships a session's exact KV state every N blocks (`--snapshot-every`); recovery loads the
latest and replays only the blocks committed after it. One value per session, replaced by each newer
snapshot, so a session of any length keeps one snapshot in the store:

    kvcache/snapshots/<session>    the KVSnapshot message, serialised

The replacement is one atomic update that keeps the snapshot with the larger `next_block`: snapshots
shipped out of order (retries, a slow link, two workers during a failover) never replace a newer one
with an older one. The bytes are the engine's; this service never looks inside them. A released
session's snapshot expires with its committed blocks.

A snapshot larger than a message carries (a 1.3B model's KV at 480x832 is gigabytes) comes in pieces:

    kvcache/snapshot-pieces/<session>/<next_block>/<index>    piece <index> of that snapshot's state

The worker puts every piece first (each with a TTL, so pieces of a snapshot that never arrives go
away), then the snapshot itself with `pieces` set and `state` empty. Putting it checks that every
piece is there; once it replaces the older snapshot, the older one's pieces are deleted and its own
are kept for as long as it is the latest. A reader that fetches pieces while a newer snapshot
replaces it gets NOT_FOUND and replays from the first block instead: a lost snapshot only lengthens
a recovery.
"""

from __future__ import annotations

from inferix.api.v1 import kvcache_pb2
from inferix.store import Store
from kvcache_svc.blocks import session_ttl
from kvcache_svc.errors import InvalidRequestError, NotFoundError, PreconditionError
from kvcache_svc.registry import require_id

SNAPSHOTS_PREFIX = "kvcache/snapshots/"
PIECES_PREFIX = "kvcache/snapshot-pieces/"
# Pieces wait this long for their snapshot; a worker ships all of them within its SHIP_DEADLINE_S.
PENDING_PIECE_TTL_S = 3600.0


def _key(session_id: str) -> str:
    return f"{SNAPSHOTS_PREFIX}{session_id}"


def _piece_prefix(session_id: str, next_block: int) -> str:
    return f"{PIECES_PREFIX}{session_id}/{next_block}/"


def _piece_key(session_id: str, next_block: int, index: int) -> str:
    return f"{_piece_prefix(session_id, next_block)}{index}"


class SnapshotStore:
    """Keep, read and expire the latest snapshot of each session."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def put(self, session_id: str, snapshot: kvcache_pb2.KVSnapshot) -> bool:
        """Keep `snapshot` unless the store holds one at least as recent; whether it was kept. A
        snapshot in pieces is refused (PreconditionError) unless every piece was put before it."""
        require_id("session_id", session_id)
        if snapshot.next_block < 1 or not (snapshot.state or snapshot.pieces):
            raise InvalidRequestError(
                f"snapshot of session {session_id!r}: next_block must be >= 1 and the state non-empty (or in pieces)"
            )
        if snapshot.state and snapshot.pieces:
            raise InvalidRequestError(f"snapshot of session {session_id!r}: a state inline or in pieces, not both")
        if snapshot.pieces:
            have = len(await self.store.list_prefix(_piece_prefix(session_id, snapshot.next_block)))
            if have != snapshot.pieces:
                raise PreconditionError(
                    f"snapshot of session {session_id!r} at block {snapshot.next_block} names {snapshot.pieces} "
                    f"pieces but {have} were put: put every piece first"
                )
        payload = snapshot.SerializeToString()
        ttl = await session_ttl(self.store, session_id)
        kept = False
        replaced: kvcache_pb2.KVSnapshot | None = None

        def newest(old: bytes | None) -> bytes:
            nonlocal kept, replaced
            previous = None if old is None else kvcache_pb2.KVSnapshot.FromString(old)
            if old is not None and previous is not None and previous.next_block >= snapshot.next_block:
                kept, replaced = False, None
                return old
            kept, replaced = True, previous
            return payload

        await self.store.update(_key(session_id), newest, ttl_s=ttl)
        if kept and snapshot.pieces:  # the latest now: its pieces live as long as it does
            await self._expire_pieces(session_id, snapshot.next_block, snapshot.pieces, ttl)
        if not kept:
            await self._delete_pieces(session_id, snapshot.next_block, snapshot.pieces)
        elif replaced is not None and replaced.next_block != snapshot.next_block:
            await self._delete_pieces(session_id, replaced.next_block, replaced.pieces)
        return kept

    async def put_piece(self, session_id: str, next_block: int, index: int, data: bytes) -> None:
        """Keep one piece of the snapshot at `next_block` until that snapshot is put (or PENDING_PIECE_TTL_S)."""
        require_id("session_id", session_id)
        if next_block < 1 or not data:
            raise InvalidRequestError(
                f"snapshot piece {index} of session {session_id!r}: next_block must be >= 1 and the data non-empty"
            )
        ttl = await session_ttl(self.store, session_id)
        ttl = PENDING_PIECE_TTL_S if ttl is None else min(ttl, PENDING_PIECE_TTL_S)
        await self.store.put(_piece_key(session_id, next_block, index), data, ttl_s=ttl)

    async def get_piece(self, session_id: str, next_block: int, index: int) -> bytes:
        require_id("session_id", session_id)
        data = await self.store.get(_piece_key(session_id, next_block, index))
        if data is None:
            raise NotFoundError(
                f"piece {index} of the snapshot of session {session_id!r} at block {next_block} is gone "
                "(a newer snapshot replaced it, or it expired)"
            )
        return data

    async def _expire_pieces(self, session_id: str, next_block: int, pieces: int, ttl_s: float | None) -> None:
        for index in range(pieces):
            await self.store.expire(_piece_key(session_id, next_block, index), ttl_s)

    async def _delete_pieces(self, session_id: str, next_block: int, pieces: int) -> None:
        for index in range(pieces):
            await self.store.delete(_piece_key(session_id, next_block, index))

    async def get(self, session_id: str) -> kvcache_pb2.KVSnapshot | None:
        require_id("session_id", session_id)
        data = await self.store.get(_key(session_id))
        return None if data is None else kvcache_pb2.KVSnapshot.FromString(data)

    async def expire(self, session_id: str, ttl_s: float) -> bool:
        """The session's snapshot (and its pieces) expire in `ttl_s`; whether it had one."""
        require_id("session_id", session_id)
        latest = await self.get(session_id)
        if latest is not None:
            await self._expire_pieces(session_id, latest.next_block, latest.pieces, ttl_s)
        return await self.store.expire(_key(session_id), ttl_s)
