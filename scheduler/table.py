"""The scheduler's session table: every `SessionRecord` by id, their copies in the store (written
after each change, read back when a scheduler starts), and the sessions-by-state gauges.

With a persistent store (Redis) a restarted scheduler resumes every unfinished session from its
record. With the in-memory store nothing survives the process: sessions found on workers without a
record are `lost` (answered for as failed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inferix.api.v1 import common_pb2
from inferix.store import Store, StoreUnavailableError
from scheduler import metrics
from scheduler.sessions import STATE_NAMES, CorruptRecord, SessionRecord
from scheduler.validation import InvalidRequest, ValidSpec

log = logging.getLogger("inferix.scheduler")
SESSIONS_PREFIX = "scheduler/sessions/"
NO_PERSISTENT_STORE = "scheduler restarted without a persistent store (run it with --redis-url to keep sessions)"


class SessionTable:
    def __init__(self, store: Store) -> None:
        self.store = store
        # Shared by reference with the viewer gateway and the streamer link.
        self.records: dict[str, SessionRecord] = {}
        # Sessions found on workers that no record describes (a restart without a persistent store): id -> reason.
        self.lost: dict[str, str] = {}
        self.loaded = asyncio.Event()  # stored sessions are back in `records`
        metrics.QUEUE_OLDEST.set_function(self.oldest_queued_s)  # at scrape time (another thread): waiting grows alone

    def oldest_queued_s(self) -> float:
        """How long the oldest queued session has waited for a worker (0 when none waits)."""
        queued = [r.created_at for r in list(self.records.values()) if r.state == common_pb2.SESSION_STATE_QUEUED]
        return max(0.0, time.time() - min(queued)) if queued else 0.0

    @property
    def persistent(self) -> bool:
        """Whether records outlive this process (else a shutdown ends the sessions)."""
        return self.store.persistent

    async def persist(self, record: SessionRecord) -> None:
        """Write the session's record; while the store is away the next write carries the latest state."""
        self.update_gauges()
        try:
            await self.store.put(f"{SESSIONS_PREFIX}{record.session_id}", record.to_json())
        except StoreUnavailableError as exc:
            log.warning("session %s: store unavailable, record not persisted yet (%s)", record.session_id, exc)

    async def load(self, revalidate: Callable[[common_pb2.SessionSpec], ValidSpec]) -> list[SessionRecord]:
        """Every readable stored record (retrying while the store is unavailable); unreadable ones are
        logged and skipped. They are not added to `records`."""
        delay = 0.2
        while True:
            try:
                keys = await self.store.list_prefix(SESSIONS_PREFIX)
                values = await self.store.get_many(keys)
                break
            except StoreUnavailableError as exc:
                log.warning("cannot load stored sessions yet (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)
        records = []
        for key, data in zip(keys, values, strict=True):
            if data is None:
                continue
            try:
                records.append(SessionRecord.from_json(data, revalidate))
            except (CorruptRecord, InvalidRequest) as exc:
                log.error(
                    "session %s: stored record is unreadable (%s); skipped", key.removeprefix(SESSIONS_PREFIX), exc
                )
        return records

    def update_gauges(self) -> None:
        counts = dict.fromkeys(STATE_NAMES.values(), 0)
        for record in self.records.values():
            counts[STATE_NAMES[record.state]] += 1
        for name, count in counts.items():
            metrics.SESSIONS.labels(state=name).set(count)
