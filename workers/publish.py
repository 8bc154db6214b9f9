"""Frames to the streamer: each block's frames straight to the session's streamer (never through the
scheduler), and what a restarted streamer is missing.

A block goes in one `PushBlock` call: a client-streaming `PushFrames` call with a message per frame
spent twice as long per block, most of it Python on the worker's event loop, which its engine thread
waits for (the GIL; bench/RESULTS.md, issue 38). A streamer of an earlier release (a rolling
upgrade) answers UNIMPLEMENTED; it then gets its frames through `PushFrames`.

A streamer keeps a recording in progress durable up to its last closed segment
(`streamer.segments`); a push's answer (`durable_frames`) says how far. The publisher keeps the
frames it pushed past that point in memory (`SentFrames`), so a restarted streamer gets just those
again, at once. Only when they are not there (this worker took the session over, or a streamer did
not say) are they decoded again from the session's committed latents: from its anchor, the newest
KV snapshot within the durable frames (it holds the decoder's memory there; kvcache_svc drops the
blocks before it), or from the first block when it has none yet.

The durable frames also go to kvcache_svc with each snapshot (`durable_frames`): they make the anchor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from engine.contract import Session, VideoBlock
from engine.snapshot import SessionSnapshot, SnapshotMismatch
from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.errors import UserError
from inferix.server import MAX_MESSAGE_BYTES, channel
from workers import metrics
from workers.engine_host import EngineHost
from workers.kvcache_link import INTERNAL_DEADLINE_S, KVCacheLink
from workers.retry import while_away

log = logging.getLogger("inferix.worker")

# Frames kept per session for a restarted streamer: a few seconds of video normally (the streamer's
# segment in progress); the cap bounds a streamer that never reports durable frames.
SENT_FRAMES_MAX_BYTES = 256 * 2**20
# The frames of one PushBlock call: well within a gRPC message (a 1080p block of 12 frames takes 3 calls).
PUSH_BLOCK_MAX_BYTES = MAX_MESSAGE_BYTES // 2


@dataclass
class SentFrames:
    """A session's frames pushed to its streamer and not yet durable there, block by block."""

    max_bytes: int = SENT_FRAMES_MAX_BYTES
    end: int = 0  # the frame after the last one pushed
    durable: int = 0  # the frames the streamer's recording holds durably, as it last said
    blocks: deque[tuple[int, int, np.ndarray]] = field(default_factory=deque)  # (block index, first frame, rgb)
    bytes: int = 0

    def add(self, block_index: int, first_frame: int, rgb: np.ndarray) -> None:
        if self.blocks and first_frame != self.end:  # not contiguous (cannot happen in order): start over
            self.blocks.clear()
            self.bytes = 0
        self.blocks.append((block_index, first_frame, rgb))
        self.bytes += rgb.nbytes
        self.end = first_frame + rgb.shape[0]
        while self.bytes > self.max_bytes and len(self.blocks) > 1:
            self._drop_oldest()

    def trim(self, durable: int) -> None:
        """Forget blocks the streamer holds on disk."""
        self.durable = max(self.durable, durable)
        while self.blocks and self.blocks[0][1] + self.blocks[0][2].shape[0] <= durable:
            self._drop_oldest()

    def since(self, start: int) -> list[tuple[int, int, np.ndarray]] | None:
        """The frames from `start` to `end`, as (block index, first frame, rgb); None if not all kept."""
        if not self.blocks or self.blocks[0][1] > start or start > self.end:
            return None
        return [
            (index, max(first, start), rgb[max(0, start - first) :])
            for index, first, rgb in self.blocks
            if first + rgb.shape[0] > start
        ]

    def _drop_oldest(self) -> None:
        self.bytes -= self.blocks.popleft()[2].nbytes


def block_requests(
    frames: list[streamer_pb2.VideoFrame], max_bytes: int = PUSH_BLOCK_MAX_BYTES
) -> list[streamer_pb2.PushBlockRequest]:
    """A block's frames as PushBlock calls of at most `max_bytes` of pixels each (at least a frame each)."""
    per_call = max(1, max_bytes // max(len(frames[0].data), 1)) if frames else 1
    return [
        streamer_pb2.PushBlockRequest(frames=frames[start : start + per_call])
        for start in range(0, len(frames), per_call)
    ]


@dataclass
class StreamerLink:
    """A streamer's stub, and how it takes frames."""

    address: str
    stub: streamer_pb2_grpc.StreamerServiceStub
    frame_by_frame: bool = False  # a streamer of a release before PushBlock: PushFrames, one message per frame


class FramePublisher:
    """One stub per streamer address; pushes blocks, gives a restarted streamer what it is missing."""

    def __init__(self, host: EngineHost, kvcache: KVCacheLink) -> None:
        self.host = host
        self.kvcache = kvcache
        self._streamers: dict[str, StreamerLink] = {}
        self._sent: dict[str, SentFrames] = {}

    def streamer(self, address: str) -> StreamerLink:
        if address not in self._streamers:
            self._streamers[address] = StreamerLink(address, streamer_pb2_grpc.StreamerServiceStub(channel(address)))
        return self._streamers[address]

    def forget(self, session_id: str) -> None:
        """The session left this worker: drop the frames kept for its streamer."""
        self._sent.pop(session_id, None)
        self._report()

    def durable_frames(self, session_id: str) -> int:
        """How many frames of the session its streamer's recording holds durably, as it last said (0: none
        said yet, or the session is not published from here)."""
        sent = self._sent.get(session_id)
        return sent.durable if sent is not None else 0

    def _report(self) -> None:
        metrics.RESEND_BYTES.set(sum(sent.bytes for sent in self._sent.values()))

    async def publish(
        self,
        streamer: StreamerLink,
        session_id: str,
        video: Session,
        fps: int,
        block: VideoBlock,
    ) -> None:
        """Send the block's frames to the streamer (re-sent frames are skipped there). A streamer that
        restarted and lacks earlier frames (OUT_OF_RANGE) first gets those."""

        async def attempt() -> int:
            try:
                return await self._push(
                    streamer, session_id, fps, block.index, block.first_frame, block.frames, backfill=False
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                await self._catch_up(streamer, session_id, video, fps, before_block=block.index)
                return await self._push(
                    streamer, session_id, fps, block.index, block.first_frame, block.frames, backfill=False
                )

        durable = await while_away(f"frames of {session_id} block {block.index}: streamer", attempt)
        sent = self._sent.setdefault(session_id, SentFrames())
        sent.add(block.index, block.first_frame, block.frames)
        sent.trim(durable)
        self._report()

    async def finish(self, streamer: StreamerLink, session_id: str, video: Session, fps: int) -> None:
        """The session's video is complete: its outputs are finalized (its MP4 is written). A streamer
        that is restarting is waited for; one that restarted and lacks frames at the end (OUT_OF_RANGE),
        or the whole session (NOT_FOUND), first gets them, so the recording is not lost."""
        sent = self._sent.get(session_id)
        frames = sent.end if sent is not None else 0

        async def attempt() -> None:
            nonlocal frames
            request = streamer_pb2.FinishStreamRequest(session_id=session_id, frames=frames)
            try:
                await streamer.stub.FinishStream(request, timeout=INTERNAL_DEADLINE_S)
            except grpc.aio.AioRpcError as exc:
                missing = exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE)
                if not missing or video.next_block_index == 0:
                    raise
                frames = await self._catch_up(streamer, session_id, video, fps, before_block=video.next_block_index)
                request = streamer_pb2.FinishStreamRequest(session_id=session_id, frames=frames)
                await streamer.stub.FinishStream(request, timeout=INTERNAL_DEADLINE_S)

        await while_away(f"recording of {session_id}: streamer", attempt)

    async def _push(
        self,
        streamer: StreamerLink,
        session_id: str,
        fps: int,
        block_index: int,
        first_frame: int,
        rgb: np.ndarray,
        backfill: bool,
    ) -> int:
        """Push the frames; the streamer's durable frames, as it answers (see `SentFrames`)."""
        height, width = rgb.shape[1:3]
        frames = [
            streamer_pb2.VideoFrame(
                session_id=session_id,
                block_index=block_index,
                frame_index=first_frame + i,
                width=width,
                height=height,
                format=streamer_pb2.PIXEL_FORMAT_RGB24,
                data=image.tobytes(),
                fps=fps,
                backfill=backfill,
            )
            for i, image in enumerate(rgb)
        ]
        if not streamer.frame_by_frame:
            try:
                return await self._push_block(streamer, frames)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                # A streamer of a release before PushBlock (during a rolling upgrade): frame by frame.
                log.info("the streamer at %s has no PushBlock: pushing its frames one message each", streamer.address)
                streamer.frame_by_frame = True
        requests = (streamer_pb2.PushFramesRequest(frame=frame) for frame in frames)
        response = await streamer.stub.PushFrames(requests, timeout=INTERNAL_DEADLINE_S)
        return int(response.durable_frames)

    @staticmethod
    async def _push_block(streamer: StreamerLink, frames: list[streamer_pb2.VideoFrame]) -> int:
        """The frames in as few PushBlock calls as the message size allows (one, but for large frames)."""
        durable = 0
        for request in block_requests(frames):
            durable = (await streamer.stub.PushBlock(request, timeout=INTERNAL_DEADLINE_S)).durable_frames
        return int(durable)

    async def _held(self, streamer: StreamerLink, session_id: str) -> int:
        """How many frames of the session the streamer holds (0 when it does not know the session)."""
        request = streamer_pb2.GetStreamInfoRequest(session_id=session_id)
        try:
            info = await streamer.stub.GetStreamInfo(request, timeout=INTERNAL_DEADLINE_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return 0
        return int(info.frames)

    async def _catch_up(
        self,
        streamer: StreamerLink,
        session_id: str,
        video: Session,
        fps: int,
        before_block: int,
    ) -> int:
        """Re-send to a streamer that restarted the frames it lacks, up to `before_block`: from the frames
        kept in memory when they reach back far enough, else decoded again from the committed latents.
        Returns the frame count up to `before_block`."""
        began = time.perf_counter()
        start = await self._held(streamer, session_id)
        sent = self._sent.get(session_id)
        if sent is not None and sent.blocks and sent.blocks[-1][0] == before_block - 1:
            kept = sent.since(start)
            if kept is not None:
                for block_index, first, rgb in kept:
                    await self._push(streamer, session_id, fps, block_index, first, rgb, backfill=True)
                log.info("re-sent frames %d..%d of %s to a restarted streamer from memory in %.2fs", start,
                         sent.end - 1, session_id, time.perf_counter() - began)  # fmt: skip
                return sent.end
        end = await self._backfill(streamer, session_id, video, fps, before_block, start)
        log.info("re-sent frames %d..%d of %s to a restarted streamer, decoded again up to block %d in %.2fs",
                 start, end - 1, session_id, before_block, time.perf_counter() - began)  # fmt: skip
        return end

    async def _backfill(
        self,
        streamer: StreamerLink,
        session_id: str,
        video: Session,
        fps: int,
        before_block: int,
        start: int,
    ) -> int:
        """Decode the session's committed latents up to `before_block` again (the decoder carries memory
        from block to block: from the anchor when it is at or before `start`, else from the first block)
        and push the frames from `start` on (recovery by recompute). Returns the frame count."""
        state, from_block, first = await self._anchor(session_id, video, start) or (video.new_redecode_state(), 0, 0)
        async for group in self.kvcache.committed_groups(session_id, before_block, from_block):
            for block in group:  # one block's frames in memory at a time
                rgb = await self.host.call(video.redecode, block, state)
                if first + rgb.shape[0] > start:
                    skip = max(0, start - first)
                    await self._push(
                        streamer, session_id, fps, block.block_index, first + skip, rgb[skip:], backfill=True
                    )
                first += rgb.shape[0]
        return first

    async def _anchor(self, session_id: str, video: Session, start: int) -> tuple[Any, int, int] | None:
        """The decoder's memory at the session's anchor (a redecode state), its block and first frame, when
        the anchor is at or before frame `start`; None otherwise (decode from the first block)."""
        if start == 0:
            return None
        try:
            found = await self.kvcache.snapshot(session_id, anchor=True)
            if found is None or found.next_frame > start:
                return None
            state = await self.kvcache.snapshot_state(session_id, found)
        except grpc.aio.AioRpcError as exc:
            log.warning("no anchor of %s (%s): decoding from the first block", session_id, exc.code().name)
            return None
        if state is None:
            log.warning("the anchor of %s does not match its SHA-256: decoding from the first block", session_id)
            return None
        try:
            snapshot = await asyncio.to_thread(SessionSnapshot.decode, state)
            redecode = await self.host.call(video.redecode_state_at, snapshot)
        except (SnapshotMismatch, UserError) as exc:
            log.warning("the anchor of %s is not used (%s): decoding from the first block", session_id, exc)
            return None
        log.info("decoding %s again from its anchor at block %d (frame %d)", session_id, found.next_block,
                 found.next_frame)  # fmt: skip
        return redecode, found.next_block, int(found.next_frame)
