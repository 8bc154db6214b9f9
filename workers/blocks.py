"""A session's blocks through the worker, as a pipeline: queued, computed batched, published, committed.

The scheduler may send a session's next `RunBlock` before the previous one is answered (within the
session's lookahead, see `scheduler.dispatch`): the request waits here, and its job joins the
batcher in the very step after the previous block's job is done (the pump calls `on_done` between
two steps), so the session's blocks meet the other sessions' in every forward without a round trip
per block. A block's output -- its frames to the streamer, then its latents to kvcache_svc, then the
reply -- runs on the event loop while the engine computes the next blocks; outputs of one session
stay in order (each waits for the one before), and at most `OUTPUT_DEPTH` blocks of a session are
done and not yet answered (a slow streamer or kvcache_svc holds that session back, not the others).
A block's frames leave as soon as they are decoded, while its context pass still runs (where the
family hands them out early, `BatchPump.submit`), once the block before is committed: a streamer
that restarted is then re-sent every block before this one from kvcache_svc.

A block's action and prompt are set right before its job starts: the action is a field of the
session (no engine call), a prompt change is a text encoding on the engine thread, after which the
job joins at the next step. Every stage is timed (`inferix_worker_block_stage_seconds`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from engine.batching import BatchJob
from engine.contract import Session, VideoBlock
from inferix.api.v1 import common_pb2, worker_pb2
from inferix.profiling import Profiler
from inferix.profiling.profiler import BlockScope
from inferix.spec.actions import parse_held_action
from workers import metrics
from workers.batch_pump import BatchPump
from workers.capacity import RecentSpeed
from workers.engine_host import EngineHost
from workers.kvcache_link import KVCacheLink
from workers.publish import FramePublisher, StreamerLink

log = logging.getLogger("inferix.worker")
# Blocks of one session computed and not yet answered, at most: one publishing while the next is done.
OUTPUT_DEPTH = 2
# Blocks of one session queued here and not started, at most (the scheduler sends one ahead; the one
# before it may still be on its way).
QUEUED = 2
# Events of the latest blocks made or restored here, per session: what a restarted scheduler announces
# from (a few blocks) and the history it rebuilds for its clients (the scheduler keeps as many).
EVENTS_KEPT = 2048
# Called after a block is committed, before its reply (e.g. a KV snapshot): session id, session, block,
# and `BlockLanes.paused` for the session: inside it no block of the session computes (the session's
# next block may be in the batcher already when its previous one is committed).
Pause = Callable[[], contextlib.AbstractAsyncContextManager[None]]
AfterCommit = Callable[[str, Session, VideoBlock, Pause], Awaitable[None]]


class BlockOutOfOrder(Exception):
    """A RunBlock for another block than the session's next one."""


class SessionClosed(Exception):
    """The session was closed before its queued block started."""


class WorkerDraining(Exception):
    """The worker drains: a queued block that has not started is made elsewhere."""


@dataclass(eq=False)
class BlockTicket:
    """One RunBlock: its request, its answer, and when it passed each stage."""

    request: worker_pb2.RunBlockRequest
    reply: asyncio.Future[common_pb2.BlockEvent]
    context: contextvars.Context  # the RPC's (its trace): frames and commit are sent in it
    arrived: float
    admitted: float = 0.0
    computed: float = 0.0
    scope: BlockScope | None = None
    published: asyncio.Task[None] | None = None  # its frames, sent before its context pass ended


@dataclass
class WorkerSession:
    """A session open on this worker, with its blocks in the pipeline."""

    session_id: str
    video: Session
    streamer: StreamerLink
    fps: int
    last_block_unix: float = field(default_factory=time.time)
    # The latest blocks made or restored here (timings only for those made here): a scheduler that
    # missed some, because it restarted, announces them from these.
    events: collections.deque[common_pb2.BlockEvent] = field(
        default_factory=lambda: collections.deque(maxlen=EVENTS_KEPT)
    )
    replied_s: float | None = None  # perf_counter when its last block was answered
    queued: collections.deque[BlockTicket] = field(default_factory=collections.deque)
    computing: BlockTicket | None = None  # its block in the batcher (or its prompt being encoded)
    outputs: int = 0  # blocks computed whose output has not finished
    last_output: asyncio.Future[None] | None = None
    unanswered: int = 0
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set while no block is unanswered
    failed: BaseException | None = None  # an output failed: the blocks after it fail too
    holds: int = 0  # `BlockLanes.paused` scopes open: no block of it starts meanwhile
    between_blocks: asyncio.Event = field(default_factory=asyncio.Event)  # set while none computes

    def __post_init__(self) -> None:
        self.settled.set()
        self.between_blocks.set()

    @property
    def busy(self) -> bool:
        return self.unanswered > 0

    def next_to_start(self) -> int:
        """The index of the session's next block to start (the engine's count moves on the engine thread
        while a block computes: read only at rest)."""
        if self.computing is not None:
            return self.computing.request.block_index + 1
        return self.video.next_block_index


class BlockLanes:
    """Runs the sessions' blocks: requests queued per session, jobs fed to the pump, outputs in order."""

    def __init__(
        self,
        host: EngineHost,
        pump: BatchPump,
        publisher: FramePublisher,
        kvcache: KVCacheLink,
        worker_id: str,
        fps: int,
        profiler: Profiler,
    ) -> None:
        self.host = host
        self.pump = pump
        self.publisher = publisher
        self.kvcache = kvcache
        self.worker_id = worker_id
        self.fps = fps
        self.profiler = profiler
        self.speed = RecentSpeed()
        self.after_commit: list[AfterCommit] = []
        self.tickets: set[asyncio.Future[common_pb2.BlockEvent]] = set()  # blocks in flight (a drain waits)
        self._blocks_run = 0  # the profiler numbers blocks across sessions

    def accept(self, session: WorkerSession, request: worker_pb2.RunBlockRequest) -> BlockTicket:
        """Queue one of the session's next blocks; its ticket's `reply` is answered once it is committed.

        Two calls sent one after the other may arrive in either order: a block up to `QUEUED` past the next
        one waits (in index order) for the blocks before it."""
        first = session.next_to_start()
        queued = {t.request.block_index for t in session.queued}
        if not first <= request.block_index < first + QUEUED or request.block_index in queued:
            raise BlockOutOfOrder(f"block_index {request.block_index}: the session's next block is {first}")
        ticket = BlockTicket(
            request,
            asyncio.get_running_loop().create_future(),
            contextvars.copy_context(),
            time.perf_counter(),
        )
        if session.replied_s is not None and not session.busy:
            metrics.BLOCK_STAGE_SECONDS.labels("dispatch").observe(ticket.arrived - session.replied_s)
        elif session.busy:  # sent ahead: no round trip to wait for
            metrics.BLOCK_STAGE_SECONDS.labels("dispatch").observe(0.0)
        session.queued.append(ticket)
        session.queued = collections.deque(sorted(session.queued, key=lambda t: t.request.block_index))
        session.unanswered += 1
        session.settled.clear()
        self.tickets.add(ticket.reply)
        ticket.reply.add_done_callback(self.tickets.discard)
        self._feed(session)
        return ticket

    def withdraw(self, session: WorkerSession, ticket: BlockTicket) -> None:
        """The block's caller went away before it started (e.g. the block before it failed): drop it. One
        that has started is still published and committed."""
        if ticket in session.queued:
            session.queued.remove(ticket)
            ticket.reply.cancel()  # nobody waits for its answer
            session.unanswered -= 1
            if not session.unanswered:
                session.settled.set()
            self._feed(session)

    def close(self, session: WorkerSession) -> None:
        """Fail the session's blocks that have not started (it is being closed)."""
        while session.queued:
            self._answer(session, session.queued.popleft(), SessionClosed(f"session {session.session_id} was closed"))

    def refuse_queued(self, session: WorkerSession, why: str) -> None:
        """Fail the session's blocks that have not started (the worker drains): the session moves right
        after its block in flight, as with a block sent after the drain began."""
        while session.queued:
            self._answer(session, session.queued.popleft(), WorkerDraining(why))

    @contextlib.asynccontextmanager
    async def paused(self, session: WorkerSession) -> AsyncIterator[None]:
        """No block of the session computes inside (its state is at a block boundary)."""
        session.holds += 1
        try:
            await session.between_blocks.wait()
            yield
        finally:
            session.holds -= 1
            self._feed(session)

    # ---- compute ------------------------------------------------------------------------------
    def _feed(self, session: WorkerSession) -> None:
        """Start the session's next queued block if its previous one is computed and its outputs keep up."""
        if session.computing is not None or session.holds or not session.queued or session.outputs >= OUTPUT_DEPTH:
            return
        video = session.video
        if session.queued[0].request.block_index > video.next_block_index:  # the block before it is on its way
            return
        ticket = session.queued.popleft()
        if ticket.request.block_index != video.next_block_index:  # a block before it failed
            self._answer(
                session,
                ticket,
                BlockOutOfOrder(
                    f"block_index {ticket.request.block_index}: the session's next block is {video.next_block_index}"
                ),
            )
            self._feed(session)
            return
        self._computing(session, ticket)
        request = ticket.request
        try:
            if video.schema is not None:  # a block's action is set before it is made
                held = request.held_action
                video.hold(parse_held_action(video.schema, list(held.keys), list(held.mouse), "held_action"))
        except Exception as exc:  # noqa: BLE001 - the block's own failure: its RPC answers it
            self._not_started(session, ticket, exc)
            return
        if request.prompt and request.prompt != video.prompt_text:  # (an image model has none)
            asyncio.get_running_loop().create_task(self._prompt_then_submit(session, ticket), context=ticket.context)
        else:
            self._submit(session, ticket)

    async def _prompt_then_submit(self, session: WorkerSession, ticket: BlockTicket) -> None:
        try:
            await self.host.call(session.video.set_prompt, ticket.request.prompt, ticket.request.recache)
        except Exception as exc:  # noqa: BLE001 - the block's own failure: its RPC answers it
            self._not_started(session, ticket, exc)
            return
        self._submit(session, ticket)

    def _submit(self, session: WorkerSession, ticket: BlockTicket) -> None:
        ticket.admitted = time.perf_counter()
        metrics.BLOCK_STAGE_SECONDS.labels("admit").observe(ticket.admitted - ticket.arrived)
        self._blocks_run += 1
        ticket.scope = self.profiler.block(self._blocks_run - 1, session=session.session_id)
        ticket.scope.__enter__()
        try:
            self.pump.submit(
                session.video,
                lambda entry: self._computed(session, ticket, entry),
                lambda block: self._decoded(session, ticket, block),
            )
        except Exception as exc:  # noqa: BLE001 - e.g. a session past its last block
            ticket.scope.__exit__(type(exc), exc, None)
            self._not_started(session, ticket, exc)

    def _not_started(self, session: WorkerSession, ticket: BlockTicket, exc: Exception) -> None:
        """The block failed before its job joined the batcher: answer it, start the session's next one."""
        self._computing(session, None)
        self._answer(session, ticket, exc)
        self._feed(session)

    def _decoded(self, session: WorkerSession, ticket: BlockTicket, block: VideoBlock) -> None:
        """On the event loop: the block's frames exist (its context pass still runs): send them after
        the session's previous block's output."""
        metrics.BLOCK_STAGE_SECONDS.labels("frames").observe(time.perf_counter() - ticket.admitted)
        ticket.published = asyncio.get_running_loop().create_task(
            self._publish(session, block, session.last_output), context=ticket.context
        )

    async def _publish(self, session: WorkerSession, block: VideoBlock, before: asyncio.Future[None] | None) -> None:
        """The block's frames to the streamer, once the outputs before it are done (in order, and
        every block before it committed); not after a failed one."""
        if before is not None:
            await asyncio.wait([before])
        if session.failed is not None:  # frames must not skip a block the streamer never got
            raise session.failed
        began = time.perf_counter()
        await self.publisher.publish(session.streamer, session.session_id, session.video, session.fps, block)
        metrics.BLOCK_STAGE_SECONDS.labels("publish").observe(time.perf_counter() - began)

    def _computed(self, session: WorkerSession, ticket: BlockTicket, entry: BatchJob[object]) -> None:
        """On the event loop, between two steps: hand the block to its output, start the next."""
        ticket.computed = time.perf_counter()
        metrics.BLOCK_STAGE_SECONDS.labels("compute").observe(ticket.computed - ticket.admitted)
        self._computing(session, None)
        assert ticket.scope is not None
        if entry.error is not None:
            ticket.scope.__exit__(type(entry.error), entry.error, None)
            if ticket.published is not None:  # a block that failed after its frames left: made again
                ticket.published.cancel()
                ticket.published.add_done_callback(_retrieved)
            self._answer(session, ticket, entry.error)
        else:
            block = entry.value()
            assert isinstance(block, VideoBlock)
            ticket.scope.pixel_frames = block.frames.shape[0]
            ticket.scope.__exit__(None, None, None)
            session.outputs += 1
            before = session.last_output
            session.last_output = asyncio.get_running_loop().create_task(
                self._output(session, ticket, block, before), context=ticket.context
            )
        self._feed(session)

    # ---- output -------------------------------------------------------------------------------
    async def _output(
        self, session: WorkerSession, ticket: BlockTicket, block: VideoBlock, before: asyncio.Future[None] | None
    ) -> None:
        """Publish, commit and answer the block, after the session's previous block's output."""
        if before is not None:
            await asyncio.wait([before])
        request = ticket.request
        try:
            await (ticket.published or self._publish(session, block, None))
            published = time.perf_counter()
            await self.kvcache.commit(session.session_id, block, request.held_action)
            committed = time.perf_counter()
            for hook in self.after_commit:
                await hook(session.session_id, session.video, block, lambda: self.paused(session))
        except Exception as exc:  # noqa: BLE001 - answered to the block's RPC
            session.failed = session.failed or exc
            session.outputs -= 1
            self._answer(session, ticket, exc)
            self._feed(session)
            return
        metrics.BLOCK_STAGE_SECONDS.labels("commit").observe(committed - published)
        made_under = request.held_action if request.HasField("held_action") else None
        event = block_event(
            self.worker_id, block.index, block.first_frame, block.frames.shape[0], block.prompt, made_under
        )
        event.timings.CopyFrom(
            common_pb2.BlockTimings(
                denoise_ms=block.denoise_s * 1e3,
                context_ms=block.context_s * 1e3,
                decode_ms=block.decode_s * 1e3,
                total_ms=block.total_s * 1e3,
            )
        )
        session.events.append(event)
        session.last_block_unix = time.time()
        metrics.BLOCKS.inc()
        metrics.BLOCK_SECONDS.observe(block.total_s)
        video_s = block.frames.shape[0] / self.fps
        metrics.VIDEO_SECONDS.inc(video_s)
        self.speed.record(video_s, block.total_s)
        session.outputs -= 1
        self._answer(session, ticket, event)
        self._feed(session)

    def _computing(self, session: WorkerSession, ticket: BlockTicket | None) -> None:
        session.computing = ticket
        if ticket is None:
            session.between_blocks.set()
        else:
            session.between_blocks.clear()

    def _answer(
        self, session: WorkerSession, ticket: BlockTicket, outcome: common_pb2.BlockEvent | BaseException
    ) -> None:
        if isinstance(outcome, BaseException):
            ticket.reply.set_exception(outcome)
        else:
            ticket.reply.set_result(outcome)
        session.replied_s = time.perf_counter()
        session.unanswered -= 1
        if not session.unanswered:
            session.settled.set()


def _retrieved(task: asyncio.Task[None]) -> None:
    """Take the outcome of a publish nobody awaits (its block failed): asyncio would log it as lost."""
    if not task.cancelled():
        task.exception()


def block_event(
    worker_id: str, index: int, first_frame: int, frames: int, prompt: str, action: common_pb2.HeldAction | None
) -> common_pb2.BlockEvent:
    event = common_pb2.BlockEvent(
        block_index=index, first_frame=first_frame, num_frames=frames, prompt=prompt, worker_id=worker_id
    )
    if action is not None:
        event.action.CopyFrom(action)
    return event
