"""KV snapshots of the worker's sessions: shipped to kvcache_svc every N blocks, loaded on recovery.

A worker that takes over a session loads the session's latest snapshot (`engine.snapshot`: its KV
pages in the pool's own dtype and layout, plus everything else the next block reads) and replays
only the blocks committed after it, so recovery takes about the same time one hour or one minute
into a session. The snapshot is exact, so the frames stay bit-identical to an uninterrupted run;
replaying from the first block stays the fallback (no snapshot, a snapshot of another layout, e.g.
another `--kv-dtype`, or one the store lost).

Off the block's path: once a block is committed (`BlockLanes.after_commit`), a background task waits
for the session's next block boundary (`BlockLanes.paused`: the session's block in the batcher, if
any, finishes first), copies the session's state on the engine thread (`Session.snapshot`: a few
pages, well under a millisecond for toyworld; the session's next block waits for it, the others do
not; `inferix_worker_snapshot_stall_seconds`), serialises the copy in another thread, and ships it
once every block it covers is committed. The block's reply never waits for any of it. While one
snapshot of a session is on its way, the next is started by the first commit after it has gone.

The cost model behind the default N (`--snapshot-every auto`). A snapshot costs the worker c seconds
of CPU (the copy, the session's stall, plus the serialisation aside) and the store S bytes; a block
takes b seconds; a recovery replays at most N blocks, one context pass of r seconds each, after
loading the snapshot. Snapshots every N blocks cost c / N per block and bound the replay to N * r.
`auto` spends at most SHARE (1%) of the worker's time on snapshots and, within that, replays as
little as possible: N = ceil(c / (SHARE * b)), clamped to [AUTO_MIN, AUTO_MAX] (the floor keeps the
store's traffic, S / N bytes per block, within a few times the committed latents' for small models;
the cap bounds the replay of models whose snapshots are huge). c and b are measured: a session
starts at N = AUTO_MIN, and each snapshot re-sets N from the median cost of the session's last
COSTS_KEPT snapshots and its mean block time. Toyworld at 64x64 on one CPU thread: c = 2-12 ms,
b = 60 ms, so N = AUTO_MIN = 8 to 20, S = 400 KB (20-50 KB per block, against 6 KB of latents),
and a recovery replays at most N blocks (10 ms each: 0.1-0.2 s).
Wan 1.3B at 480x832 in bf16: S is gigabytes (c in seconds) against a block of about a second on a
GPU, so N = AUTO_MAX.

A snapshot larger than `WorkerConfig.snapshot_piece_bytes` (16 MiB; a gRPC message carries 64 MiB
here) ships in pieces: every piece first (`PutSnapshotPiece`), then the snapshot that counts them
with the SHA-256 of the whole state; a successor fetches the pieces one by one (`GetSnapshotPiece`)
and checks the digest before loading it (see kvcache_svc/snapshots.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from prometheus_client import Histogram

from engine.contract import Session, VideoBlock
from engine.snapshot import SessionSnapshot, SnapshotMismatch
from inferix.api.v1 import common_pb2, kvcache_pb2
from inferix.spec.blocks import CommittedBlock
from workers.blocks import Pause, block_event
from workers.engine_host import EngineHost
from workers.kvcache_link import KVCacheLink, state_sha256

log = logging.getLogger("inferix.worker.snapshots")
AUTO = "auto"
AUTO_MIN, AUTO_MAX = 8, 256
SHARE = 0.01  # of the worker's time spent on snapshots at most, under `auto`
SHIP_DEADLINE_S = 60.0
COSTS_KEPT = 9  # snapshot costs the auto N is taken from (their median)
FRAMES_KEPT = 64  # frame counts of the last blocks shipped with a snapshot: more than a scheduler lags behind
SNAPSHOT_STALL_SECONDS = Histogram(
    "inferix_worker_snapshot_stall_seconds",
    "Seconds a KV snapshot holds the engine after a block (the copy; serialising and shipping run aside)",
    buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
)
SNAPSHOT_BYTES = Histogram(
    "inferix_worker_snapshot_bytes",
    "Bytes of each KV snapshot shipped to kvcache_svc",
    buckets=(2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28, 2**30, 2**32),
)


def parse_every(value: str) -> int | None:
    """`--snapshot-every`: "auto" (None: the cost model's N per session), 0 (off) or N >= 1 blocks."""
    if value == AUTO:
        return None
    try:
        every = int(value)
    except ValueError:
        raise ValueError(f"--snapshot-every must be 'auto' or a number of blocks >= 0, got {value!r}") from None
    if every < 0:
        raise ValueError(f"--snapshot-every must be 'auto' or a number of blocks >= 0, got {every}")
    return every


def default_every(snapshot_s: float, block_s: float) -> int:
    """The cost model's N (see the module docstring): at most SHARE of the worker's time on snapshots."""
    return min(max(math.ceil(snapshot_s / (SHARE * max(block_s, 1e-6))), AUTO_MIN), AUTO_MAX)


@dataclass
class _Progress:
    every: int  # this session's N
    covered: int  # next_block of the last snapshot taken here (or of the first block made here)
    committed: int  # the session's blocks committed so far
    commits: asyncio.Condition = field(default_factory=asyncio.Condition)
    # (block index, pixel frames) of the last blocks made here: shipped with a snapshot (`block_frames`).
    frames: collections.deque[tuple[int, int]] = field(default_factory=lambda: collections.deque(maxlen=FRAMES_KEPT))
    block_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=FRAMES_KEPT))
    costs: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=COSTS_KEPT))
    taking: asyncio.Task[None] | None = None  # the snapshot being taken or shipped


@dataclass
class Restored:
    """Where a restore starts replaying committed blocks: after the snapshot loaded (0, 0: none)."""

    next_block: int = 0
    next_frame: int = 0
    # The events of the blocks before the snapshot that the scheduler has not announced (not replayed).
    events: list[common_pb2.BlockEvent] = field(default_factory=list)


class Snapshots:
    """One worker's snapshots. `every`: None for the cost model's N, 0 for none; `supported`: whether
    the engine's family takes snapshots (`Capabilities.snapshots`, and not a pod); `durable_frames`: how
    many frames of a session its recording holds durably (shipped with each snapshot: it makes the
    anchor, see kvcache_svc/snapshots.py)."""

    def __init__(
        self,
        host: EngineHost,
        kvcache: KVCacheLink,
        worker_id: str,
        every: int | None,
        supported: bool,
        durable_frames: Callable[[str], int],
        piece_bytes: int = 16 * 2**20,
    ) -> None:
        self.host = host
        self.kvcache = kvcache
        self.worker_id = worker_id
        self.every = every
        self.supported = supported
        self.piece_bytes = piece_bytes
        self.durable_frames = durable_frames
        self._progress: dict[str, _Progress] = {}

    @property
    def enabled(self) -> bool:
        return self.supported and self.every != 0

    async def after_commit(self, session_id: str, video: Session, block: VideoBlock, paused: Pause) -> None:
        """A block of the session is committed (a `BlockLanes.after_commit` hook): start a snapshot if
        the session is due one. It is taken in the background at the session's next block boundary
        and shipped once every block it covers is committed; the block's reply does not wait."""
        if not self.enabled:
            return
        progress = self._progress.get(session_id)
        if progress is None:
            every = self.every or AUTO_MIN  # auto: re-set from each snapshot's measured cost
            progress = self._progress[session_id] = _Progress(every, covered=block.index, committed=block.index)
        progress.frames.append((block.index, block.frames.shape[0]))
        progress.block_s.append(block.total_s)
        async with progress.commits:
            progress.committed = block.index + 1
            progress.commits.notify_all()
        if block.index + 1 - progress.covered < progress.every:
            return
        if progress.taking is not None and not progress.taking.done():
            return  # the previous one is still on its way: the next commit starts this one
        progress.covered = block.index + 1
        progress.taking = asyncio.create_task(self._take(session_id, video, progress, paused))

    async def _take(self, session_id: str, video: Session, progress: _Progress, paused: Pause) -> None:
        """Copy the session's state between two of its blocks (on the engine thread: the stall), then
        serialise it in another thread and ship it once the blocks it covers are committed. A lost
        snapshot only lengthens a recovery."""
        try:
            async with paused():  # the session's next block waits for the copy, the other sessions' do not
                began = time.perf_counter()
                snapshot = await self.host.call(video.snapshot)
                stall = time.perf_counter() - began
                SNAPSHOT_STALL_SECONDS.observe(stall)
            progress.covered = snapshot.next_block
            began = time.perf_counter()
            state = await asyncio.to_thread(snapshot.encode)
            if self.every is None:  # the median of the last costs: one slow copy (a busy CPU) does not swing N
                progress.costs.append(stall + time.perf_counter() - began)
                cost = statistics.median(progress.costs)
                every = default_every(cost, statistics.fmean(progress.block_s))
                if every != progress.every:
                    log.debug("session %s: a KV snapshot every %d blocks (one costs %.1f ms)", session_id, every,
                              cost * 1e3)  # fmt: skip
                progress.every = every
            async with progress.commits:  # blocks made before the pause may still be committing
                await progress.commits.wait_for(lambda: progress.committed >= snapshot.next_block)
            message = kvcache_pb2.KVSnapshot(
                next_block=snapshot.next_block,
                next_frame=snapshot.next_frame,
                worker_id=self.worker_id,
                block_frames=_frames_before(progress.frames, snapshot.next_block),
            )
            if len(state) <= self.piece_bytes:
                message.state = state
            else:
                message.pieces = await self._ship_pieces(session_id, snapshot.next_block, state)
                message.state_sha256 = await asyncio.to_thread(state_sha256, state)
            request = kvcache_pb2.PutSnapshotRequest(
                session_id=session_id, snapshot=message, durable_frames=self.durable_frames(session_id)
            )
            await self.kvcache.stub.PutSnapshot(request, timeout=SHIP_DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            log.warning("snapshot of %s not stored: %s", session_id, exc.code().name)
            return
        except Exception:  # e.g. the session closed meanwhile: no snapshot this time
            if session_id in self._progress:
                log.exception("snapshot of %s failed", session_id)
            return
        SNAPSHOT_BYTES.observe(len(state))
        log.debug("snapshot of %s at block %d: %d bytes", session_id, snapshot.next_block, len(state))

    async def _ship_pieces(self, session_id: str, next_block: int, state: bytes) -> int:
        """Put the state in pieces of `piece_bytes`, in order; how many."""
        view = memoryview(state)
        starts = range(0, len(state), self.piece_bytes)
        for index, start in enumerate(starts):
            piece = kvcache_pb2.PutSnapshotPieceRequest(
                session_id=session_id,
                next_block=next_block,
                index=index,
                data=bytes(view[start : start + self.piece_bytes]),
            )
            await self.kvcache.stub.PutSnapshotPiece(piece, timeout=SHIP_DEADLINE_S)
        return len(starts)

    def forget(self, session_id: str) -> None:
        """The session left this worker: a snapshot still waiting for commits is dropped."""
        progress = self._progress.pop(session_id, None)
        if progress is not None and progress.taking is not None:
            progress.taking.cancel()

    async def restore(self, video: Session, session_id: str, announced_blocks: int) -> Restored:
        """Load the session's latest snapshot into the new `video`, if there is one it can use; where
        the replay of committed blocks starts, and the events of the blocks before it that the
        scheduler has not announced (`announced_blocks`). A snapshot is not used when the blocks it
        covers are not all committed (a store that lost some), nor when it lacks the frame counts of
        blocks the scheduler still needs announced: the replay from the first block makes those."""
        if not self.supported:
            return Restored()
        try:
            found = await self.kvcache.snapshot(session_id)
            if found is None:
                return Restored()
            unannounced = await self._unannounced(session_id, found, announced_blocks)
            if unannounced is None:
                log.info("session %s: its snapshot at block %d is past the blocks committed, or the scheduler needs "
                         "blocks announced from %d: replaying from the first block", session_id, found.next_block,
                         announced_blocks)  # fmt: skip
                return Restored()
            state = await self.kvcache.snapshot_state(session_id, found)
        except grpc.aio.AioRpcError as exc:
            log.warning("no snapshot of %s (%s): replaying from the first block", session_id, exc.code().name)
            return Restored()
        if state is None:
            log.warning("session %s: the pieces of its snapshot at block %d do not match its SHA-256: replaying "
                        "from the first block", session_id, found.next_block)  # fmt: skip
            return Restored()
        try:
            snapshot = await asyncio.to_thread(SessionSnapshot.decode, state)
            await self.host.call(video.load_snapshot, snapshot)
        except SnapshotMismatch as exc:
            log.warning("session %s: snapshot not used (%s): replaying from the first block", session_id, exc)
            return Restored()
        log.info("session %s: loaded its snapshot at block %d (%d bytes in %d piece(s), taken by %s)", session_id,
                 found.next_block, len(state), max(found.pieces, 1), found.worker_id)  # fmt: skip
        world = video.schema is not None
        events = []
        counts = found.block_frames[len(found.block_frames) - len(unannounced) :]
        first_frame = found.next_frame - sum(counts)
        for block, count in zip(unannounced, counts, strict=True):
            held = common_pb2.HeldAction(keys=block.action_keys, mouse=block.action_mouse) if world else None
            events.append(block_event(self.worker_id, block.block_index, first_frame, count, block.prompt, held))
            first_frame += count
        return Restored(found.next_block, found.next_frame, events)

    async def _unannounced(
        self, session_id: str, found: kvcache_pb2.KVSnapshot, announced_blocks: int
    ) -> list[CommittedBlock] | None:
        """The committed blocks from `announced_blocks` up to the snapshot (none when the scheduler has
        announced them all); None if the snapshot cannot be used: a block it covers is not committed,
        or it lacks the frame counts of the unannounced ones."""
        last = found.next_block - 1
        first = min(announced_blocks, last)
        if found.next_block - announced_blocks > len(found.block_frames):
            return None
        blocks: list[CommittedBlock] = []
        async for group in self.kvcache.committed_groups(session_id, before_block=last + 1, from_block=first):
            blocks += group
        if [b.block_index for b in blocks] != list(range(first, last + 1)):
            return None
        return [b for b in blocks if b.block_index >= announced_blocks]


def _frames_before(frames: collections.deque[tuple[int, int]], next_block: int) -> list[int]:
    """The pixel frames of the blocks made here right before `next_block`, in a row, the last one last."""
    counts: list[int] = []
    expected = next_block - 1
    for index, count in reversed(frames):
        if index > expected:
            continue
        if index != expected:
            break
        counts.append(count)
        expected -= 1
    return counts[::-1]
