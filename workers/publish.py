"""Frames to the streamer: each block's frames straight to the session's streamer (never through the
scheduler), and a restarted streamer's backfill (the session's video again, decoded from its
committed latents)."""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc
import numpy as np

from engine.contract import Session, VideoBlock
from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.server import channel
from workers.engine_host import EngineHost
from workers.kvcache_link import INTERNAL_DEADLINE_S, KVCacheLink
from workers.retry import while_away

log = logging.getLogger("inferix.worker")


class FramePublisher:
    """One stub per streamer address; pushes blocks, backfills restarted streamers."""

    def __init__(self, host: EngineHost, kvcache: KVCacheLink) -> None:
        self.host = host
        self.kvcache = kvcache
        self._streamers: dict[str, streamer_pb2_grpc.StreamerServiceStub] = {}

    def streamer(self, address: str) -> streamer_pb2_grpc.StreamerServiceStub:
        if address not in self._streamers:
            self._streamers[address] = streamer_pb2_grpc.StreamerServiceStub(channel(address))
        return self._streamers[address]

    async def publish(
        self,
        streamer: streamer_pb2_grpc.StreamerServiceStub,
        session_id: str,
        video: Session,
        fps: int,
        block: VideoBlock,
    ) -> None:
        """Send the block's frames to the streamer (re-sent frames are skipped there). A streamer that
        restarted and lost the session first gets its video again."""

        async def attempt() -> None:
            try:
                await self._push(
                    streamer, session_id, fps, block.index, block.first_frame, block.frames, backfill=False
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                    raise
                await self._backfill(streamer, session_id, video, fps, before_block=block.index)
                await self._push(
                    streamer, session_id, fps, block.index, block.first_frame, block.frames, backfill=False
                )

        await while_away(f"frames of {session_id} block {block.index}: streamer", attempt)

    async def finish(
        self, streamer: streamer_pb2_grpc.StreamerServiceStub, session_id: str, video: Session, fps: int
    ) -> None:
        """The session's video is complete: its outputs are finalized (its MP4 is written). A streamer
        that is restarting is waited for; one that restarted after the session's last frame, and so
        does not hold it (NOT_FOUND), first gets the whole video again, so the recording is not lost."""
        request = streamer_pb2.FinishStreamRequest(session_id=session_id)

        async def attempt() -> None:
            try:
                await streamer.FinishStream(request, timeout=INTERNAL_DEADLINE_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND or video.next_block_index == 0:
                    raise
                await self._backfill(streamer, session_id, video, fps, before_block=video.next_block_index)
                await streamer.FinishStream(request, timeout=INTERNAL_DEADLINE_S)

        await while_away(f"recording of {session_id}: streamer", attempt)

    async def _push(
        self,
        streamer: streamer_pb2_grpc.StreamerServiceStub,
        session_id: str,
        fps: int,
        block_index: int,
        first_frame: int,
        rgb: np.ndarray,
        backfill: bool,
    ) -> None:
        height, width = rgb.shape[1:3]

        def frames() -> Any:
            for i, image in enumerate(rgb):
                yield streamer_pb2.PushFramesRequest(
                    frame=streamer_pb2.VideoFrame(
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
                )

        await streamer.PushFrames(frames(), timeout=INTERNAL_DEADLINE_S)

    async def _backfill(
        self,
        streamer: streamer_pb2_grpc.StreamerServiceStub,
        session_id: str,
        video: Session,
        fps: int,
        before_block: int,
    ) -> None:
        """Re-send the session's video up to `before_block` to a streamer that restarted: its committed
        latents decoded again from the start (recovery by recompute, for the recording)."""
        began = time.perf_counter()
        state = video.new_redecode_state()
        blocks = first = 0
        async for group in self.kvcache.committed_groups(session_id, before_block):
            for block in group:  # one block's frames in memory at a time
                rgb = await self.host.call(video.redecode, block, state)
                await self._push(streamer, session_id, fps, block.block_index, first, rgb, backfill=True)
                first += rgb.shape[0]
                blocks += 1
        log.info("re-sent %d blocks (%d frames) of %s to a restarted streamer in %.2fs", blocks, first,
                 session_id, time.perf_counter() - began)  # fmt: skip
