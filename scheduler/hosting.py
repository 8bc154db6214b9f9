"""Where sessions run: admission through kvcache_svc (which knows every worker's KV capacity),
opening a session on a worker, the calls to a session's worker (watched by health probes), moving
a session off a failed worker, releasing its room, and closing the sessions that workers run but
no record describes (orphans).

Placement never settles on a worker it cannot reach: a transport failure of `OpenSession` (or a
worker that stops answering health probes during a call) excludes that worker, reports it to
kvcache_svc (no admission on it until it heartbeats again) and tries the next one. A worker that
fails mid-session is replaced the same way, and the new worker rebuilds the KV cache from the
committed blocks (recovery by recompute).

A session keeps its decoder (`SessionSpec.decoder`): the first worker that opens it reports its
own, which the spec records; a worker that decodes otherwise refuses it (`CannotContinue`) and
placement tries the next one, so a session never moves to a worker that would decode its frames
differently, and waits for one that decodes alike when none is up. A worker refuses the same way a
session whose latest KV snapshot it cannot load (another KV layout) once the blocks before that
snapshot were dropped (kvcache_svc/snapshots.py): it could not replay them.

kvcache_svc and the workers are reached through the `KVCache` and `WorkerClient` protocols; their
gRPC adapters are in `scheduler.grpc_clients`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Container
from dataclasses import dataclass
from typing import Protocol, TypeVar

from inferix.api.v1 import common_pb2
from scheduler.config import SchedulerConfig
from scheduler.sessions import SessionRecord

log = logging.getLogger("inferix.scheduler")
T = TypeVar("T")


class PlacementUnavailable(Exception):
    """kvcache_svc (placement) cannot be reached."""


class WorkerUnresponsive(Exception):
    """A worker accepted a call but stopped answering health probes (e.g. a stopped process)."""


class CannotContinue(Exception):
    """A worker refused to open a session it cannot continue: it decodes latents otherwise than the session
    was made with, or it cannot load the session's snapshot and the blocks before it were dropped."""


class CallFailed(Exception):
    """A call whose failure is only logged (all but opening a session and running a block) failed.

    `code` names the status, e.g. "UNAVAILABLE"."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class WorkerRef:
    """The worker that admitted a session."""

    worker_id: str
    address: str


@dataclass(frozen=True)
class NoRoom:
    """kvcache_svc admitted the session nowhere: no live worker has room (KV pages or real-time
    streams), or none serves its model. `reason` is its refusal, worker by worker, for the user."""

    reason: str


@dataclass(frozen=True)
class WorkerInfo:
    """A registered worker, as kvcache_svc sees it."""

    address: str
    model: str
    alive: bool
    suspect: bool  # missed heartbeats or was reported failed; it may come back
    model_settings: str = ""  # how its model folder changes the model's preset ("": as shipped)


@dataclass(frozen=True)
class OpenedSession:
    """A session open on a worker: the next block to make, and the events of the blocks the worker
    holds from the `announced_blocks` it was asked for on, in block order."""

    next_block: int
    blocks: list[common_pb2.BlockEvent]
    decoder: str = ""  # what the worker decodes with (`SessionSpec.decoder`'s spelling)


@dataclass(frozen=True)
class Orphan:
    """A session a worker runs that no record describes."""

    address: str
    session_id: str


class KVCache(Protocol):
    """kvcache_svc: admission of sessions on workers with KV room, and the workers' liveness."""

    async def admit(
        self,
        session_id: str,
        model: str,
        pages: int,
        resolution: common_pb2.Resolution,
        exclude: list[str],
        timeout: float,
    ) -> WorkerRef | NoRoom:
        """Reserve `pages` and a real-time stream at `resolution` on a live worker of `model` outside
        `exclude`; `NoRoom` when none has room (or none serves the model). Raises `PlacementUnavailable`
        when kvcache_svc cannot be reached."""
        ...

    async def workers(self, timeout: float) -> list[WorkerInfo]:
        """Every registered worker (`CallFailed`)."""
        ...

    async def report_failure(self, worker_id: str, reason: str, timeout: float) -> None:
        """No admission on the worker until it heartbeats again (`CallFailed`)."""
        ...

    async def release(self, session_id: str, timeout: float) -> None:
        """Free the session's reservation, if it holds one (`CallFailed`)."""
        ...

    async def set_activity(self, session_id: str, paused: bool, timeout: float) -> None:
        """A paused session's pages may move to host memory (`CallFailed`)."""
        ...


class WorkerClient(Protocol):
    """The workers, by address.

    `open_session` and `run_block` raise the transport's own errors unchanged (a worker's refusal
    reaches the client with its status, an engine error becomes the session's error); `unreachable`
    tells which of them mean the worker is gone. The other calls raise `CallFailed`."""

    def unreachable(self, exc: Exception) -> str | None:
        """The status name when `exc`, raised by a call here, means the worker could not be reached or
        did not answer in time; None for any other error."""
        ...

    async def probe(self, address: str, timeout: float) -> bool:
        """Whether the worker answers a health check."""
        ...

    async def draining(self, address: str, timeout: float) -> bool:
        """Whether the worker answers that it drains (health NOT_SERVING)."""
        ...

    async def open_session(
        self,
        address: str,
        session_id: str,
        spec: common_pb2.SessionSpec,
        streamer_address: str,
        announced_blocks: int,
        timeout: float,
    ) -> OpenedSession:
        """Open the session, or find it open; a worker new to it restores its committed blocks. Raises
        `CannotContinue` when the worker cannot continue it (it decodes otherwise than `spec.decoder` says,
        or it cannot load the session's snapshot and the blocks before it were dropped)."""
        ...

    async def run_block(
        self,
        address: str,
        session_id: str,
        block_index: int,
        prompt: str,
        recache: bool,
        action: common_pb2.HeldAction | None,
        timeout: float,
    ) -> common_pb2.BlockEvent:
        """Make one block (holding `action`, for action-conditioned models); it is committed when this returns."""
        ...

    async def close_session(self, address: str, session_id: str, timeout: float, finish_stream: bool = True) -> None:
        """Drop the session and, with `finish_stream`, finish its outputs (its MP4 is written) (`CallFailed`)."""
        ...

    async def prefetch(self, address: str, session_id: str, timeout: float) -> None:
        """Bring a resumed session's KV pages back from host memory (`CallFailed`)."""
        ...

    async def session_ids(self, address: str, timeout: float) -> list[str]:
        """The sessions the worker holds (`CallFailed`)."""
        ...


class Placement:
    """Puts sessions on workers, makes the calls to their workers, and moves them when one fails."""

    def __init__(self, config: SchedulerConfig, kvcache: KVCache, workers: WorkerClient) -> None:
        self.config = config
        self.kvcache = kvcache
        self.workers = workers

    def failure(self, exc: Exception) -> str | None:
        """What went wrong when `exc` (from `place` or `run_block`) means the session's worker could not
        be reached or stopped answering, so the session must move; None for any other error."""
        if isinstance(exc, WorkerUnresponsive):
            return str(exc)
        return self.workers.unreachable(exc)

    async def drains(self, record: SessionRecord) -> bool:
        """Whether the session's worker drains (it refuses blocks then, which is no failure)."""
        return await self.workers.draining(record.worker_address, timeout=self.config.probe_timeout_s)

    async def served_models(self, timeout: float | None = None) -> dict[str, str]:
        """Models of the registered workers that are up (a suspect one still counts: it may come back),
        each with the model settings its workers serve it with (a live worker's over a suspect one's;
        kvcache_svc keeps the live workers of a model on the same). Raises `CallFailed` when
        kvcache_svc does not answer (within `timeout`, by default the internal deadline)."""
        workers = await self.kvcache.workers(timeout=timeout or self.config.internal_deadline_s)
        up = sorted((w for w in workers if w.alive or w.suspect), key=lambda w: w.alive)
        return {w.model: w.model_settings for w in up}

    async def place(self, record: SessionRecord) -> bool:
        """Admit and open the session on a live worker; False when no live worker has room now
        (`record.no_room` then holds kvcache_svc's refusal).

        A worker that cannot be reached is reported to kvcache_svc and skipped, so a departed or
        hung worker never keeps a session (or a client) waiting. Raises `PlacementUnavailable` when
        kvcache_svc cannot be reached; a worker's refusal propagates.
        """
        excluded: list[str] = []  # unreachable, or decoding otherwise, on this attempt
        refusals: list[str] = []
        while await self._admit(record, excluded):
            try:
                await self._open_on_worker(record)
                return True
            except CannotContinue as exc:
                log.info("session %s: %s; trying another worker", record.session_id, exc)
                refusals.append(str(exc))
                excluded.append(record.worker_id)
                record.worker_id = record.worker_address = ""
                continue
            except Exception as exc:
                failure = self.failure(exc)
                if failure is None:
                    raise
                log.warning(
                    "session %s: worker %s unreachable on open (%s); trying another worker",
                    record.session_id,
                    record.worker_id,
                    failure,
                )
                await self._report_failure(record.worker_id, f"OpenSession: {failure}")
                excluded.append(record.worker_id)
                record.worker_id = record.worker_address = ""
        if refusals:
            record.no_room = "no live worker with room can continue the session: " + "; ".join(refusals)
        return False

    async def try_place(self, record: SessionRecord) -> bool:
        """`place` for a session that waits: kvcache_svc being away is one more reason to wait."""
        try:
            return await self.place(record)
        except PlacementUnavailable as exc:
            log.warning("session %s waits for placement: %s", record.session_id, exc)
            return False

    async def replace(self, record: SessionRecord, reason: str) -> None:
        """Move the session off its failed worker: report the worker, then place the session again,
        waiting for room up to `block_deadline_s` (RuntimeError after that, or once it is cancelled)."""
        failed = record.worker_id
        # Reported, not excluded: kvcache_svc admits nothing on it until it heartbeats again, so the same
        # worker id is eligible once it has restarted (the only worker of a small mesh, a StatefulSet pod).
        await self._report_failure(failed, reason)
        await self._place_again(record, f"{failed} failed")

    async def move(self, record: SessionRecord) -> None:
        """Move the session off its draining worker: drop it there first (the worker exits once its
        sessions are gone; its blocks are committed), then place it again like `replace`. Not reported:
        the worker left placement itself and is eligible again once it has restarted and registered."""
        leaving = record.worker_id
        try:
            await self.workers.close_session(
                record.worker_address, record.session_id, timeout=self.config.internal_deadline_s, finish_stream=False
            )
        except CallFailed as exc:  # gone already: nothing to drop
            log.info("dropping %s on draining worker %s: %s", record.session_id, leaving, exc.code)
        await self._place_again(record, f"{leaving} drained")

    async def _place_again(self, record: SessionRecord, why: str) -> None:
        record.worker_id = record.worker_address = ""
        deadline = time.monotonic() + self.config.block_deadline_s
        while not await self.try_place(record):
            if time.monotonic() > deadline or record.cancel_requested:
                raise RuntimeError(f"no worker could take over session {record.session_id} after {why}")
            await record.wait(self.config.admission_retry_s)

    async def run_block(self, record: SessionRecord, block: int, recache: bool) -> common_pb2.BlockEvent:
        """Make `block` of the session, with its current prompt and action, on its worker."""
        address = record.worker_address
        return await self._watched(
            address,
            self.workers.run_block(
                address,
                session_id=record.session_id,
                block_index=block,
                prompt=record.current_prompt,
                recache=recache,
                action=record.current_action,
                timeout=self.config.block_deadline_s,
            ),
        )

    async def set_activity(self, record: SessionRecord, paused: bool) -> None:
        """Tell kvcache_svc (a paused session's pages go to host memory); on resume, prefetch them back."""
        try:
            await self.kvcache.set_activity(record.session_id, paused, timeout=self.config.internal_deadline_s)
            if not paused and record.worker_address:
                await self.workers.prefetch(
                    record.worker_address, record.session_id, timeout=self.config.internal_deadline_s
                )
        except CallFailed as exc:  # an optimisation: the next block restores pages anyway
            log.warning("activity update of %s failed: %s", record.session_id, exc.details)

    async def close(self, record: SessionRecord) -> None:
        """Finish the session on its worker (its outputs are finalized) and free its room."""
        if record.worker_address:
            try:
                await self.workers.close_session(
                    record.worker_address, record.session_id, timeout=self.config.internal_deadline_s
                )
            except CallFailed as exc:
                log.warning("closing %s on %s failed: %s", record.session_id, record.worker_id, exc.details)
        await self.release(record)

    async def release(self, record: SessionRecord) -> None:
        try:
            await self.kvcache.release(record.session_id, timeout=self.config.internal_deadline_s)
        except CallFailed as exc:
            log.warning("release of %s failed: %s", record.session_id, exc.details)

    async def find_orphans(self, known: Container[str]) -> list[Orphan]:
        """Sessions that live workers run but `known` does not hold (their scheduler died with an
        in-memory store)."""
        probe_s = self.config.probe_timeout_s
        try:
            workers = await self.kvcache.workers(timeout=probe_s)
        except CallFailed as exc:
            log.warning("cannot look for orphaned sessions: kvcache_svc %s", exc.code)
            return []
        orphans = []
        for worker in workers:
            if not worker.alive:
                continue
            try:
                session_ids = await self.workers.session_ids(worker.address, timeout=probe_s)
            except CallFailed:
                continue
            orphans += [Orphan(worker.address, session_id) for session_id in session_ids if session_id not in known]
        return orphans

    async def close_orphan(self, orphan: Orphan) -> None:
        """Finish an orphaned session's outputs (its MP4 is written) and free its room."""
        try:
            await self.workers.close_session(orphan.address, orphan.session_id, timeout=self.config.internal_deadline_s)
        except CallFailed as exc:
            log.warning("closing orphaned session %s failed: %s", orphan.session_id, exc.code)
        with contextlib.suppress(CallFailed):
            await self.kvcache.release(orphan.session_id, timeout=self.config.internal_deadline_s)

    async def _admit(self, record: SessionRecord, exclude: list[str]) -> bool:
        """Reserve KV pages and a real-time stream (at the spec's resolution, filled by validation) on a
        live worker; False when none has room or none serves the model, with the refusal in `record.no_room`."""
        outcome = await self.kvcache.admit(
            record.session_id,
            record.spec.model,
            record.valid.shape.pages,
            record.spec.resolution,
            exclude,
            timeout=self.config.internal_deadline_s,
        )
        if isinstance(outcome, NoRoom):
            record.no_room = outcome.reason
            return False
        record.no_room = ""
        record.worker_id, record.worker_address = outcome.worker_id, outcome.address
        return True

    async def _open_on_worker(self, record: SessionRecord) -> None:
        """Open (or find open) the session on its worker; announce blocks made while nobody listened."""
        opened = await self._watched(
            record.worker_address,
            self.workers.open_session(
                record.worker_address,
                session_id=record.session_id,
                spec=record.spec,
                streamer_address=self.config.streamer_address,
                # A resumed record has no event history yet: ask for every block the worker knows.
                announced_blocks=0 if record.history_missing else record.announced_blocks,
                timeout=self.config.block_deadline_s,
            ),
        )
        if not record.spec.decoder:  # its first worker: from now on the session is decoded this way
            record.spec.decoder = opened.decoder
        record.next_block = opened.next_block
        if record.history_missing:
            record.restore_history(opened.blocks)
        for event in opened.blocks:  # in block order
            record.announce(event)

    async def _report_failure(self, worker_id: str, reason: str) -> None:
        try:
            await self.kvcache.report_failure(worker_id, reason, timeout=self.config.internal_deadline_s)
        except CallFailed as exc:  # placement still excludes it for this session
            log.warning("could not report worker %s as failed: %s", worker_id, exc.code)

    async def _watched(self, address: str, call: Awaitable[T]) -> T:
        """Await a call to a worker while probing its health: a worker that accepted the call but
        stopped answering (a stopped or wedged process) raises `WorkerUnresponsive` within
        about `probe_misses * (probe_interval_s + probe_timeout_s)`, whatever the call's deadline."""
        task = asyncio.ensure_future(call)
        misses = 0
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self.config.probe_interval_s)
                if done:
                    return task.result()
                if await self.workers.probe(address, timeout=self.config.probe_timeout_s):
                    misses = 0
                    continue
                misses += 1
                if misses >= self.config.probe_misses and not task.done():
                    raise WorkerUnresponsive(f"the worker missed {misses} health probes in a row during the call")
        finally:
            if not task.done():
                task.cancel()
