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

The anchor. A streamer that restarts holds the session's recording up to its last closed segment and
asks for the frames after it; a worker that took the session over never had them and decodes them
again from the committed latents. The decoder carries memory from block to block, so that decode
starts where a snapshot holds the decoder's memory, at or before the recording's durable end. The
worker says how far the recording is durable with each snapshot it puts (`durable_frames`); the
snapshot a newer one replaces waits as a candidate until the recording holds its first frame:

    kvcache/snapshot-candidates/<session>                      JSON list of the candidates' next blocks
    kvcache/snapshot-candidates/<session>/<next_block:010d>   older snapshots, not yet durable
    kvcache/snapshot-anchors/<session>                         the newest snapshot the recording holds

The anchor only moves forward. Once it does, the committed blocks before it are dropped
(`BlockStore.drop_before`): a recovery replays from the latest snapshot (never older than the anchor)
and a restarted streamer's frames are decoded again from the anchor, so nothing reads them. A session
keeps the latest snapshot, the anchor, at most MAX_CANDIDATES candidates and the blocks after the
anchor: a bounded store however long it runs. Pieces of a snapshot are deleted when no kept record
names them.

A failover's two workers may put one session's snapshots at once, through two kvcache_svc replicas
sharing the store (the old worker retrying its last one while the new worker puts the next). A put
reads records and then writes others, so two interleaved puts could delete the pieces of a snapshot
the other was just making a candidate. So a session's puts take turns: a lock within a process, then
the session's lease in the store, which a put holds for a few round trips:

    kvcache/snapshot-leases/<session>    the holding put's random token, expiring after LEASE_TTL_S

A replica that dies holding it delays the session's next put by LEASE_TTL_S at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

from inferix.api.v1 import kvcache_pb2
from inferix.store import Store
from kvcache_svc.blocks import session_ttl
from kvcache_svc.errors import InvalidRequestError, NotFoundError, PreconditionError
from kvcache_svc.registry import require_id

SNAPSHOTS_PREFIX = "kvcache/snapshots/"
PIECES_PREFIX = "kvcache/snapshot-pieces/"
ANCHORS_PREFIX = "kvcache/snapshot-anchors/"
CANDIDATES_PREFIX = "kvcache/snapshot-candidates/"
LEASES_PREFIX = "kvcache/snapshot-leases/"
# A put holds its session's lease for a few store round trips; one older than this was cut off (its
# replica died) and the next put takes the lease over.
LEASE_TTL_S = 10.0
# How often a put waiting for the lease asks again: from a millisecond, doubling to 50 ms.
LEASE_RETRY_S, LEASE_MAX_RETRY_S = 0.001, 0.05
# Candidates kept at most: snapshots every 8 or more blocks (1.5 s of toyworld) against a recording
# durable every 4 s leave 3 waiting; past the cap the oldest goes (the anchor then moves later).
MAX_CANDIDATES = 4
# Pieces wait this long for their snapshot; a worker ships all of them within its SHIP_DEADLINE_S.
PENDING_PIECE_TTL_S = 3600.0


def _key(session_id: str) -> str:
    return f"{SNAPSHOTS_PREFIX}{session_id}"


def _anchor_key(session_id: str) -> str:
    return f"{ANCHORS_PREFIX}{session_id}"


def _candidates_key(session_id: str) -> str:
    return f"{CANDIDATES_PREFIX}{session_id}"


def _lease_key(session_id: str) -> str:
    return f"{LEASES_PREFIX}{session_id}"


def _candidate_key(session_id: str, next_block: int) -> str:
    return f"{_candidates_key(session_id)}/{next_block:010d}"


def _blocks_of(data: bytes | None) -> list[int]:
    return sorted(json.loads(data)) if data else []


def _with_blocks(added: list[int], removed: list[int], old: bytes | None) -> bytes:
    """A candidates list with `added` and without `removed` (one atomic update)."""
    return json.dumps(sorted((set(_blocks_of(old)) | set(added)) - set(removed))).encode()


def _parse(data: bytes | None) -> kvcache_pb2.KVSnapshot | None:
    return None if data is None else kvcache_pb2.KVSnapshot.FromString(data)


@dataclass(frozen=True)
class SnapshotPut:
    """What a put did: whether the snapshot is the session's latest now, and the session's anchor's
    next block (0: no anchor yet; the committed blocks before it may be dropped)."""

    stored: bool
    anchor: int


def _piece_prefix(session_id: str, next_block: int) -> str:
    return f"{PIECES_PREFIX}{session_id}/{next_block}/"


def _piece_key(session_id: str, next_block: int, index: int) -> str:
    return f"{_piece_prefix(session_id, next_block)}{index}"


class SnapshotStore:
    """Keep, read and expire the latest snapshot of each session."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def put(self, session_id: str, snapshot: kvcache_pb2.KVSnapshot, durable_frames: int = 0) -> SnapshotPut:
        """Keep `snapshot` unless the store holds one at least as recent; the snapshot it replaces waits
        as a candidate, and the newest candidate within `durable_frames` becomes the anchor. A
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
        async with self._ordered(session_id):
            ttl = await session_ttl(self.store, session_id)
            stored, replaced = await self._replace_latest(session_id, snapshot, ttl)
            if not stored:
                await self._forget(session_id, snapshot)
            elif snapshot.pieces:  # the latest now: its pieces live as long as it does
                await self._expire_pieces(session_id, snapshot.next_block, snapshot.pieces, ttl)
            if replaced is not None and replaced.next_block != snapshot.next_block:
                await self.store.put(_candidate_key(session_id, replaced.next_block), replaced.SerializeToString(),
                                     ttl_s=ttl)  # fmt: skip
                add = partial(_with_blocks, [replaced.next_block], [])
                await self.store.update(_candidates_key(session_id), add, ttl_s=ttl)
            anchor = await self._promote(session_id, durable_frames, ttl)
        return SnapshotPut(stored, anchor)

    async def _replace_latest(
        self, session_id: str, snapshot: kvcache_pb2.KVSnapshot, ttl: float | None
    ) -> tuple[bool, kvcache_pb2.KVSnapshot | None]:
        """Make `snapshot` the latest unless one at least as recent is there (one atomic update):
        whether it is, and the one it replaced."""
        payload = snapshot.SerializeToString()
        kept = False
        replaced: kvcache_pb2.KVSnapshot | None = None

        def newest(old: bytes | None) -> bytes:
            nonlocal kept, replaced
            previous = _parse(old)
            if old is not None and previous is not None and previous.next_block >= snapshot.next_block:
                kept, replaced = False, None
                return old
            kept, replaced = True, previous
            return payload

        await self.store.update(_key(session_id), newest, ttl_s=ttl)
        return kept, replaced

    async def _promote(self, session_id: str, durable_frames: int, ttl: float | None) -> int:
        """Make the newest candidate the recording holds (next_frame <= `durable_frames`) the anchor if it
        is newer than the anchor; drop the candidates it passed and those past MAX_CANDIDATES. Returns
        the anchor's next block (0: none)."""
        values = await self.store.get_many(await self._candidate_keys(session_id))
        candidates = [c for c in map(_parse, values) if c is not None]  # by next block, the oldest first
        anchor = _parse(await self.store.get(_anchor_key(session_id)))
        held = [c for c in candidates if c.next_frame <= durable_frames]
        if held and (anchor is None or held[-1].next_block > anchor.next_block):
            promoted = held[-1]
            payload = promoted.SerializeToString()
            await self.store.update(_anchor_key(session_id), lambda old: _later(old, payload), ttl_s=ttl)
            if anchor is not None:
                await self._forget(session_id, anchor)
            anchor = promoted
        at = anchor.next_block if anchor is not None else 0
        waiting = [c for c in candidates if c.next_block > at]
        passed = [c for c in candidates if c.next_block <= at]
        dropped = passed + waiting[: max(0, len(waiting) - MAX_CANDIDATES)]
        if dropped:
            remove = partial(_with_blocks, [], [c.next_block for c in dropped])
            await self.store.update(_candidates_key(session_id), remove, ttl_s=ttl)
        for candidate in dropped:
            await self.store.delete(_candidate_key(session_id, candidate.next_block))
            if candidate.next_block != at:
                await self._forget(session_id, candidate)
        return at

    async def _candidate_keys(self, session_id: str) -> list[str]:
        blocks = _blocks_of(await self.store.get(_candidates_key(session_id)))
        return [_candidate_key(session_id, b) for b in blocks]

    async def _forget(self, session_id: str, snapshot: kvcache_pb2.KVSnapshot) -> None:
        """Delete the pieces of a snapshot no longer kept, unless a kept record names the same ones."""
        if not snapshot.pieces:
            return
        kept = [_parse(await self.store.get(_key(session_id))), _parse(await self.store.get(_anchor_key(session_id)))]
        named = {k.next_block for k in kept if k is not None}
        if snapshot.next_block in named or await self.store.get(_candidate_key(session_id, snapshot.next_block)):
            return
        await self._delete_pieces(session_id, snapshot.next_block, snapshot.pieces)

    @contextlib.asynccontextmanager
    async def _ordered(self, session_id: str) -> AsyncIterator[None]:
        """One put of a session at a time across the replicas sharing the store: this process's lock
        (it goes once no put holds or awaits it), then the session's lease in the store."""
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        async with lock:
            key, token = _lease_key(session_id), secrets.token_hex(16).encode()
            retry = LEASE_RETRY_S
            while not await self.store.compare_and_set(key, None, token, ttl_s=LEASE_TTL_S):
                await asyncio.sleep(retry)
                retry = min(2 * retry, LEASE_MAX_RETRY_S)
            try:
                yield
            finally:
                await self.store.compare_and_set(key, token, None)

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

    async def get(self, session_id: str, anchor: bool = False) -> kvcache_pb2.KVSnapshot | None:
        """The session's latest snapshot, or its anchor; None when it has none."""
        require_id("session_id", session_id)
        return _parse(await self.store.get(_anchor_key(session_id) if anchor else _key(session_id)))

    async def expire(self, session_id: str, ttl_s: float) -> bool:
        """The session's snapshots (latest, anchor, candidates, and their pieces) expire in `ttl_s`;
        whether it had one."""
        require_id("session_id", session_id)
        candidates = await self._candidate_keys(session_id)
        kept = [await self.get(session_id, anchor=True)]
        kept += [_parse(value) for value in await self.store.get_many(candidates)]
        for key in [*candidates, _candidates_key(session_id), _anchor_key(session_id)]:
            await self.store.expire(key, ttl_s)
        latest = await self.get(session_id)
        for snapshot in [*kept, latest]:
            if snapshot is not None:
                await self._expire_pieces(session_id, snapshot.next_block, snapshot.pieces, ttl_s)
        return await self.store.expire(_key(session_id), ttl_s)


def _later(old: bytes | None, payload: bytes) -> bytes:
    """The anchor only moves forward (two puts at once cannot take it back)."""
    previous = _parse(old)
    new = kvcache_pb2.KVSnapshot.FromString(payload)
    return old if old is not None and previous is not None and previous.next_block >= new.next_block else payload
