"""The latest KV snapshot of each session: what bounds recovery time (see engine/snapshot.py).

A worker ships a session's exact KV state every N blocks (`--snapshot-every`); recovery loads the
latest and replays only the blocks committed after it. One value per session, replaced by each newer
snapshot, so a session of any length keeps one snapshot in the store:

    kvcache/snapshots/<session>    the KVSnapshot message, serialised

The replacement is one atomic update that keeps the snapshot with the larger `next_block`: snapshots
shipped out of order (retries, a slow link, two workers during a failover) never replace a newer one
with an older one. The bytes are the engine's; this service never looks inside them. A released
session's snapshot expires with its committed blocks.
"""

from __future__ import annotations

from inferix.api.v1 import kvcache_pb2
from inferix.store import Store
from kvcache_svc.blocks import MIN_TTL_S, _index_key
from kvcache_svc.errors import InvalidRequestError
from kvcache_svc.registry import require_id

SNAPSHOTS_PREFIX = "kvcache/snapshots/"


def _key(session_id: str) -> str:
    return f"{SNAPSHOTS_PREFIX}{session_id}"


class SnapshotStore:
    """Keep, read and expire the latest snapshot of each session."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def put(self, session_id: str, snapshot: kvcache_pb2.KVSnapshot) -> bool:
        """Keep `snapshot` unless the store holds one at least as recent; whether it was kept."""
        require_id("session_id", session_id)
        if snapshot.next_block < 1 or not snapshot.state:
            raise InvalidRequestError(
                f"snapshot of session {session_id!r}: next_block must be >= 1 and the state non-empty"
            )
        payload = snapshot.SerializeToString()
        # A released session's keys expire; a late snapshot follows its committed blocks' clock.
        ttl = await self.store.ttl(_index_key(session_id))
        ttl = None if ttl is None else max(ttl, MIN_TTL_S)
        kept = False

        def newest(old: bytes | None) -> bytes:
            nonlocal kept
            if old is not None and kvcache_pb2.KVSnapshot.FromString(old).next_block >= snapshot.next_block:
                return old
            kept = True
            return payload

        await self.store.update(_key(session_id), newest, ttl_s=ttl)
        return kept

    async def get(self, session_id: str) -> kvcache_pb2.KVSnapshot | None:
        require_id("session_id", session_id)
        data = await self.store.get(_key(session_id))
        return None if data is None else kvcache_pb2.KVSnapshot.FromString(data)

    async def expire(self, session_id: str, ttl_s: float) -> bool:
        require_id("session_id", session_id)
        return await self.store.expire(_key(session_id), ttl_s)
