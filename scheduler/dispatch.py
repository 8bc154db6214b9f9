"""The per-session dispatch loop, and the life of the loops across scheduler restarts.

Each running session has one dispatch task that runs its blocks in order on its worker, at most
`lookahead` blocks ahead of real-time playback (an interactive session: one median generation time
ahead, so that each block is done about when it is due and an action waits for no queued video),
applying prompt changes / pause / stop at block boundaries, announcing each block once and
persisting the record after each. A worker that fails mid-session is replaced through `Placement`
and the session continues from its committed blocks. A worker that drains (SIGTERM: scale-in,
rolling update) is no failure: `DrainWatch` flags its sessions, and each moves right after its
block in flight (committed there), without counting against `max_recoveries`,
so a session survives any number of rolling updates.

With a persistent store the scheduler may restart at any time: `drain` (SIGTERM) hands the live
sessions over at a block boundary (it does not end them), and `resume` on the next scheduler
continues every unfinished session from its record; the worker (or, if it died too, a successor
restoring the committed blocks) tells it which blocks were made meanwhile, so clients see every
block exactly once. With the in-memory store a shutdown ends the sessions as failed, never as
completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.latency import LatencyMode
from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR, tracer
from scheduler import metrics
from scheduler.config import Presets, SchedulerConfig
from scheduler.handover import DrainWatch
from scheduler.hosting import CallFailed, Placement
from scheduler.quotas import Quotas
from scheduler.sessions import SessionRecord
from scheduler.table import NO_PERSISTENT_STORE, SessionTable

log = logging.getLogger("inferix.scheduler")
# ErrorEvent codes are gRPC status codes (google.rpc.Code); a session's own failure is INTERNAL.
INTERNAL = 13
RESOURCE_EXHAUSTED = 8


@dataclass(frozen=True)
class Ending:
    """How a session ended: its final state and the reason given with it."""

    state: int
    reason: str


@dataclass
class _Sent:
    """A block sent to the session's worker: its index, the call, when it was sent."""

    block: int
    call: asyncio.Future[tuple[common_pb2.BlockEvent, float]]
    started: float


class Dispatcher:
    """Runs one dispatch task per unfinished session."""

    def __init__(
        self,
        config: SchedulerConfig,
        table: SessionTable,
        placement: Placement,
        presets: Presets,
        quotas: Quotas | None = None,
    ) -> None:
        self.config = config
        self.table = table
        self.placement = placement
        self.presets = presets
        self.quotas = quotas or Quotas()
        self.stopping = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.watch = DrainWatch(placement.workers)

    def start(self, record: SessionRecord) -> None:
        self._tasks[record.session_id] = asyncio.create_task(self._run(record), name=f"session-{record.session_id}")

    async def cancel(self, record: SessionRecord) -> None:
        """End an unfinished session as cancelled at its next block boundary; returns once it has ended
        (or was handed over)."""
        if record.terminal:
            return
        record.cancel_requested = True
        record.wake()
        task = self._tasks.get(record.session_id)
        if task is not None:
            # The caller going away (a cancelled RPC) must not cancel the session's own task.
            await asyncio.shield(task)

    async def resume(self) -> None:
        """On start: load the stored sessions, resume the unfinished ones, and close sessions that
        workers still run but no record describes (their scheduler died with an in-memory store)."""
        resumed = 0
        try:  # the presets the workers run, before the stored sessions are sized by them
            self.presets.learn(await self.placement.served_models(timeout=self.config.probe_timeout_s))
        except CallFailed as exc:
            log.warning("cannot ask kvcache_svc for the workers' model settings (%s); the shipped presets "
                        "stand until a session is created", exc.code)  # fmt: skip
        for record in await self.table.load(self.presets.revalidate):
            self.table.records[record.session_id] = record
            if not record.terminal:
                record.publish(
                    scheduler_pb2.InteractResponse(
                        state=scheduler_pb2.StateChange(state=record.state, reason="resumed by a restarted scheduler")  # type: ignore[arg-type]
                    )
                )
                self.start(record)
                resumed += 1
        orphans = await self.placement.find_orphans(self.table.records)
        for orphan in orphans:  # answered for as failed from now on
            self.table.lost[orphan.session_id] = NO_PERSISTENT_STORE
        self.table.update_gauges()
        self.table.loaded.set()
        if resumed:
            log.info("resumed %d unfinished session(s) from the store", resumed)
        for orphan in orphans:
            log.warning("session %s has no record (%s); closing it", orphan.session_id, NO_PERSISTENT_STORE)
            await self.placement.close_orphan(orphan)

    async def drain(self) -> None:
        """On SIGTERM: every session stops at its next block boundary. With a persistent store it is
        handed over (left unfinished for the next scheduler, on the same worker); without one it
        ends as failed, its outputs finalized."""
        self.stopping = True
        for record in self.table.records.values():
            record.wake()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self.watch.close()
        for record in self.table.records.values():
            record.close_subscribers()

    async def _run(self, record: SessionRecord) -> None:
        """Drive the session to its end, or until a scheduler shutdown hands it over (then it stays
        unfinished in the store, for the next scheduler to resume)."""
        ending: Ending | None
        try:
            ending = await self._drive(record)
        except asyncio.CancelledError:
            return  # shutdown past its grace period: the stored record resumes elsewhere
        except Exception as exc:  # a session failure must never take the scheduler down
            log.exception("session %s failed", record.session_id)
            record.error = f"{type(exc).__name__}: {exc}"
            record.publish(
                scheduler_pb2.InteractResponse(error=scheduler_pb2.ErrorEvent(code=INTERNAL, message=record.error))
            )
            ending = Ending(common_pb2.SESSION_STATE_FAILED, record.error)
        if ending is None:
            await self.table.persist(record)
            self._tasks.pop(record.session_id, None)
            return
        if ending.state == common_pb2.SESSION_STATE_FAILED and not record.error:
            record.error = ending.reason
        # Outputs are finalized (MP4 written) before anyone is told the session ended.
        await self.placement.close(record)
        self._tasks.pop(record.session_id, None)
        record.set_state(ending.state, ending.reason)
        await self.table.persist(record)

    async def _drive(self, record: SessionRecord) -> Ending | None:
        """Place the session if needed, then run its blocks; how it ended, or None when the
        scheduler is handing it over."""
        while not record.worker_address:  # queued, or resumed by a new scheduler: find a worker
            if record.cancel_requested:
                return Ending(common_pb2.SESSION_STATE_CANCELLED, "cancelled while queued")
            if self.stopping:
                return self._handover()
            if not await self.placement.try_place(record):
                await record.wait(self.config.admission_retry_s)
        if record.paused_since is None:
            record.set_state(common_pb2.SESSION_STATE_RUNNING, f"running on {record.worker_id}")
        await self.table.persist(record)
        self.watch.follow(record)
        try:
            return await self._dispatch_blocks(record)
        finally:
            self.watch.unfollow(record)

    def _handover(self) -> Ending | None:
        """At a shutdown: None (resume it later) with a persistent store, else the session ends as failed."""
        if self.table.persistent:
            return None
        return Ending(common_pb2.SESSION_STATE_FAILED, NO_PERSISTENT_STORE)

    async def _dispatch_blocks(self, record: SessionRecord) -> Ending | None:
        """Run blocks until the session ends; how it ended (None: handed over)."""
        schedule = {c.at_block: c for c in record.spec.prompts}
        fps = float(self.presets.get(record.spec.model).video.fps)
        frames_per_block = record.valid.shape.video_frames_per_block
        recoveries = 0
        over_quota = False  # told the session's clients that its key's hourly budget holds it
        while True:
            if record.cancel_requested:
                return Ending(common_pb2.SESSION_STATE_CANCELLED, "cancelled by the client")
            if record.stop_requested or (record.valid.num_blocks and record.next_block >= record.valid.num_blocks):
                return Ending(common_pb2.SESSION_STATE_COMPLETED, "stopped" if record.stop_requested else "done")
            if self.stopping:
                return self._handover()
            if record.worker_leaving:  # paused or waiting for playback too: the new worker restores meanwhile
                await self._move(record)
                continue
            if record.paused_since is not None:
                await record.wait(None)
                continue
            # Pixel frames made: the last block's end (a Wan VAE's first block decodes to fewer frames).
            made = record.frames_made or record.next_block * frames_per_block
            if record.valid.latency is LatencyMode.INTERACTIVE:
                record.keep_up(fps, made, frames_per_block)
            ahead = made - record.playback_frame(fps)
            if record.valid.latency is LatencyMode.INTERACTIVE:  # dispatched to be done as it is due
                limit = record.lead_frames(fps, frames_per_block)
            else:
                limit = float(record.valid.lookahead * frames_per_block)
            if record.first_block_at is not None and ahead > limit:
                await record.wait((ahead - limit) / fps)
                continue
            wait = self.quotas.wait_s(record.owner)
            if wait > 0:  # the key's hourly budget is spent: the session waits, nothing is lost
                if not over_quota:
                    over_quota = True
                    error = scheduler_pb2.ErrorEvent(
                        code=RESOURCE_EXHAUSTED, message=self.quotas.hourly_message(record.owner, wait)
                    )
                    record.publish(scheduler_pb2.InteractResponse(error=error))
                await record.wait(wait)
                continue
            over_quota = False
            sent: _Sent | None = self._send(record, record.next_block, schedule)
            while sent is not None:  # its block, then the ones sent ahead of each answer
                # The session's next block waits at the worker while this one is made, so that it joins the
                # worker's next batched forward without a round trip (within the lookahead).
                may = self._may_send_ahead(record, sent, schedule)
                sent_ahead = self._send(record, sent.block + 1, schedule) if may else None
                try:
                    await self._finish(record, sent)
                    recoveries = 0  # a block was made: only failures in a row end a session (hours long)
                except Exception as exc:
                    if sent_ahead is not None:
                        await self._withdraw(record, sent_ahead)
                    failure = self.placement.failure(exc)
                    refused = failure == "UNAVAILABLE" and await self.placement.drains(record)
                    if failure is not None and (record.worker_leaving or refused):
                        record.worker_leaving = True  # its draining worker refused the block: it moves (above)
                        break
                    if failure is None:
                        raise
                    if recoveries >= self.config.max_recoveries:
                        metrics.RECOVERY_FAILURES.inc()
                        raise
                    recoveries += 1
                    await self._recover(record, failure)
                    break
                sent = sent_ahead

    def _may_send_ahead(self, record: SessionRecord, sent: _Sent, schedule: dict[int, common_pb2.PromptChange]) -> bool:
        """Whether the block after `sent` (in flight) may be sent now: the session plays smoothly (an
        interactive one waits for each block, to answer actions as late as possible) and takes no
        actions (a steered world applies an action at the block after the one in flight, whatever its
        latency mode), nothing stops or holds it, the block keeps the prompt of the one in flight (so
        that a re-run of that one, after a failure, is made as before), and it is within the lookahead
        with the one in flight counted as made."""
        if record.valid.latency is LatencyMode.INTERACTIVE or record.valid.actions is not None:
            return False
        if record.first_block_at is None:
            return False
        if record.cancel_requested or record.stop_requested or self.stopping or record.worker_leaving:
            return False
        block = sent.block + 1
        if record.paused_since is not None or record.pending_prompt is not None or block in schedule:
            return False
        if record.valid.num_blocks and block >= record.valid.num_blocks:
            return False
        model = self.presets.get(record.spec.model)
        frames_per_block = record.valid.shape.video_frames_per_block
        made = (record.frames_made or record.next_block * frames_per_block) + frames_per_block
        if made - record.playback_frame(float(model.video.fps)) > record.valid.lookahead * frames_per_block:
            return False
        return self.quotas.wait_s(record.owner) <= 0

    def _send(self, record: SessionRecord, block: int, schedule: dict[int, common_pb2.PromptChange]) -> _Sent:
        """Take the block's prompt and action and send it to the session's worker."""
        recache = False
        if block in schedule:
            record.current_prompt, recache = schedule[block].text, schedule[block].recache
        if record.pending_prompt is not None:
            record.current_prompt, recache = record.pending_prompt.text, record.pending_prompt.recache
            record.pending_prompt = None
        # At the block it was answered with: not earlier, e.g. when a block in flight then fails and is re-run.
        if record.pending_action is not None and record.pending_action.at_block <= block:
            record.current_action, record.pending_action = record.pending_action.action, None
        record.in_flight = block
        # Charged when dispatched, so that sessions of one key running at once never pass its budget.
        self.quotas.charge_block(record.owner)
        call = asyncio.ensure_future(self._call(record, block, recache))
        return _Sent(block, call, time.perf_counter())

    async def _call(self, record: SessionRecord, block: int, recache: bool) -> tuple[common_pb2.BlockEvent, float]:
        with tracer("inferix.scheduler").start_as_current_span(
            "scheduler.block", attributes={SESSION_ID_ATTR: record.session_id, BLOCK_INDEX_ATTR: block}
        ):
            call_started = time.perf_counter()
            event = await self.placement.run_block(record, block, recache)
            return event, time.perf_counter() - call_started

    async def _withdraw(self, record: SessionRecord, sent: _Sent) -> None:
        """The block before `sent` failed: `sent` is not made here (the worker refuses it, or it is made
        again after the recovery)."""
        sent.call.cancel()
        with contextlib.suppress(BaseException):
            await sent.call
        if record.in_flight == sent.block:  # nothing is in flight now: commands apply from the next block
            record.in_flight = None
        self.quotas.refund_block(record.owner)

    async def _finish(self, record: SessionRecord, sent: _Sent) -> None:
        """Wait for the block's answer and announce it."""
        block = sent.block
        try:
            event, call_s = await sent.call
        except BaseException:
            self.quotas.refund_block(record.owner)  # it is run again (recovery) or never made
            raise
        finally:
            if record.in_flight == block:  # else the next block is in flight
                record.in_flight = None
        elapsed = time.perf_counter() - sent.started
        event.timings.dispatch_to_done_ms = elapsed * 1e3
        if record.first_block_at is not None:  # the first block pays the worker's first-call costs: no estimate
            record.generation_s.append(elapsed)
        record.next_block = block + 1
        record.frames_made = event.first_frame + event.num_frames
        if record.first_block_at is None:
            record.first_block_at = time.monotonic()
            metrics.TIME_TO_FIRST_BLOCK.observe(time.time() - record.created_at)
        metrics.BLOCKS.inc()
        metrics.BLOCK_LATENCY.observe(elapsed)
        metrics.BLOCK_VIDEO_SECONDS.inc(event.num_frames / self.presets.get(record.spec.model).video.fps)
        record.announce(event)
        await self.table.persist(record)
        metrics.DISPATCH_OVERHEAD.observe(time.perf_counter() - sent.started - call_s)

    async def _recover(self, record: SessionRecord, failure: str) -> None:
        failed = record.worker_id
        log.warning("worker %s failed on session %s (%s); re-placing", failed, record.session_id, failure)
        record.publish(
            scheduler_pb2.InteractResponse(
                state=scheduler_pb2.StateChange(state=record.state, reason=f"worker {failed} failed; recovering")  # type: ignore[arg-type]
            )
        )
        self.watch.unfollow(record)
        try:
            await self.placement.replace(record, f"{failure} during a block")
        except RuntimeError:
            if not record.cancel_requested:
                metrics.RECOVERY_FAILURES.inc()
            raise
        record.worker_leaving = False  # the failed worker may have been draining too
        self.watch.follow(record)
        await self.table.persist(record)
        metrics.RECOVERIES.inc()
        log.info("session %s continues on %s from block %d", record.session_id, record.worker_id, record.next_block)

    async def _move(self, record: SessionRecord) -> None:
        """Its worker drains: place the session again now. Its blocks are committed (the worker finished
        the one in flight), the new worker restores them, and the streamer's stream goes on."""
        leaving = record.worker_id
        self.watch.unfollow(record)  # first: the old worker's watch must not flag it again meanwhile
        record.worker_leaving = False
        started = time.perf_counter()
        record.publish(
            scheduler_pb2.InteractResponse(
                state=scheduler_pb2.StateChange(state=record.state, reason=f"worker {leaving} drains; moving")  # type: ignore[arg-type]
            )
        )
        await self.placement.move(record)
        metrics.HANDOVERS.observe(time.perf_counter() - started)
        self.watch.follow(record)
        await self.table.persist(record)
        log.info("session %s moved off draining worker %s to %s in %.2fs (next block %d)", record.session_id,
                 leaving, record.worker_id, time.perf_counter() - started, record.next_block)  # fmt: skip
