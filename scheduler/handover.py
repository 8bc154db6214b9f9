"""Workers that drain: their sessions move at once, not when their next block is due.

A worker asked to stop (pod deleted, scaled in, rolled; SIGTERM) turns its gRPC health NOT_SERVING,
finishes and commits its blocks in flight, refuses new sessions and blocks, and exits once its
sessions have been dropped (`Placement.move`) or its drain deadline passed. `DrainWatch` checks the
health of every worker that runs sessions of this scheduler every `POLL_S`; when one drains, each of
its sessions is flagged (`worker_leaving`) and woken, so that its dispatch loop moves it right after
its block in flight -- while viewers still play the blocks made ahead, and paused sessions too --
instead of when the next block is due (then the new worker's restore would show as a stall).

It polls rather than watches (health `Watch`): a watch stream is one more call a stopping worker's
server would wait for before it exits.
"""

from __future__ import annotations

import asyncio
import logging

from scheduler.hosting import WorkerClient
from scheduler.sessions import SessionRecord

log = logging.getLogger("inferix.scheduler")
# How often a worker running sessions is asked whether it drains (one health check per worker).
POLL_S = 0.5
CHECK_TIMEOUT_S = 2.0


class DrainWatch:
    """One health poll per worker address that sessions follow."""

    def __init__(self, workers: WorkerClient) -> None:
        self.workers = workers
        self._followers: dict[str, dict[str, SessionRecord]] = {}  # address -> session id -> record
        self._following: dict[str, str] = {}  # session id -> address
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def follow(self, record: SessionRecord) -> None:
        """Watch the session's current worker (and no longer its previous one)."""
        self.unfollow(record)
        address = record.worker_address
        if not address:
            return
        self._following[record.session_id] = address
        self._followers.setdefault(address, {})[record.session_id] = record
        if address not in self._tasks:
            self._tasks[address] = asyncio.create_task(self._watch(address), name=f"drain-watch-{address}")

    def unfollow(self, record: SessionRecord) -> None:
        address = self._following.pop(record.session_id, None)
        if address is None:
            return
        followers = self._followers[address]
        followers.pop(record.session_id, None)
        if not followers:
            del self._followers[address]
            self._tasks.pop(address).cancel()

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        self._followers.clear()
        self._following.clear()

    async def _watch(self, address: str) -> None:
        while not await self.workers.draining(address, timeout=CHECK_TIMEOUT_S):
            await asyncio.sleep(POLL_S)
        followers = self._followers.pop(address, {})
        del self._tasks[address]
        log.info("worker at %s drains: moving its %d session(s) now", address, len(followers))
        for record in followers.values():
            del self._following[record.session_id]
            record.worker_leaving = True
            record.wake()
