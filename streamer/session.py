"""`StreamSession`: one session's ingest state, encoded stream and recording, with push and finish.

The session decides where the recording's segments start (`streamer.segments`): every
`segment_frames` frames, at the frame being accepted, with the frames digest before it, so that a
segment boundary and its digest are fixed in ingest order, not by the encoder's timing.

A per-session lock keeps the order frames are checked, queued and counted identical even when
several pushes for the same session overlap (e.g. a recovering worker re-sending while the old
stream is still draining), and makes finish wait for a push that is halfway through queueing.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import av
from opentelemetry import context as otel_context

from inferix.api.v1 import streamer_pb2
from inferix.frames_digest import FramesDigest
from streamer.errors import EncoderFailed, RecordingNotReady
from streamer.finished import MANIFEST_VERSION, Manifest, write_manifest
from streamer.ingest import Admission, IngestState
from streamer.live import LiveSession
from streamer.packets import SegmentStart
from streamer.segments import Journal, SegmentedRecorder
from streamer.stream import EncodedStream, RawFrame

log = logging.getLogger("inferix.streamer")


@dataclass
class StreamSession:
    """Everything the streamer holds for one session id."""

    ingest: IngestState
    stream: EncodedStream
    recorder: SegmentedRecorder
    segment_frames: int  # a recording segment every this many frames
    finalized: bool = False  # FinishStream completed: the MP4 is written
    # The live output, while the session's video is being re-sent (backfill) after a streamer restart:
    # it joins with the first new frame, so viewers never see the past again.
    live_pending: LiveSession | None = None
    # Digest of the accepted raw frames in order: checks delivery bit for bit despite the lossy encode.
    frames_digest: FramesDigest = field(default_factory=FramesDigest)
    segment_start: int = 0  # the frame the segment being recorded starts at
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def open(
        cls,
        ingest: IngestState,
        data_dir: Path,
        codec: str,
        queue_frames: int,
        segment_frames: int,
        live: LiveSession | None = None,
        live_now: bool = True,
        resumed: Journal | None = None,
    ) -> StreamSession:
        """Start the session's encoder with the recorder and, when given, the live pacer as outputs
        (`live_now=False`: the pacer joins with the first frame that is not backfill). `resumed`: the
        journal a previous streamer process left; the session goes on after its last durable frame."""
        stream = EncodedStream(ingest.session_id, ingest.format, codec=codec, queue_frames=queue_frames)
        recorder = SegmentedRecorder(data_dir, ingest.session_id, ingest.format, resumed)
        stream.attach(recorder)
        session = cls(ingest, stream, recorder, segment_frames, segment_start=ingest.next_index)
        if resumed is not None:
            session.frames_digest = FramesDigest.from_hex(resumed.frames_digest)
        if live is not None:
            if live_now:
                stream.attach(live.open(ingest.format))
            else:
                session.live_pending = live
        return session

    @property
    def session_id(self) -> str:
        return self.ingest.session_id

    async def push(self, frame: streamer_pb2.VideoFrame) -> Admission:
        """Queue the next frame for encoding, or skip a re-sent one; raises on a bad or late frame."""
        async with self._lock:
            admission = self.ingest.check(frame)
            if admission is Admission.NEW and not frame.backfill and self.live_pending is not None:
                self.stream.attach(self.live_pending.open(self.ingest.format))
                self.live_pending = None
            if admission is Admission.NEW:
                segment = None
                if frame.frame_index - self.segment_start >= self.segment_frames:
                    segment = SegmentStart(frame.frame_index, self.frames_digest.hexdigest())
                await self.stream.put(
                    RawFrame(frame.frame_index, frame.block_index, frame.data, otel_context.get_current(),
                             segment=segment)
                )  # fmt: skip
                self.ingest.commit()
                self.frames_digest.update(frame.data)
                if segment is not None:
                    self.segment_start = frame.frame_index
            return admission

    @property
    def durable_frames(self) -> int:
        """Frames from 0 that a restarted streamer would still have (`streamer.segments`)."""
        return self.recorder.durable_frames

    async def finish(self, persist: bool = True) -> int:
        """End the video: encode what is queued, flush, close the recording. Returns the frame count.
        `persist`: join its segments into the MP4 and write its manifest, so that a restarted streamer
        serves it (FinishStream's). Otherwise (a shutdown, which cuts a session short) journal every
        frame, so the next streamer goes on after the last one."""
        async with self._lock:
            self.ingest.finished = True  # from here on only re-sent frames are accepted
            await self.stream.close()
            if not self.finalized and self._recorded():
                if persist:
                    await self._persist()
                else:
                    await asyncio.to_thread(self.recorder.seal, self.frames_digest.hexdigest())
            self.finalized = True
            return self.ingest.next_index

    def _recorded(self) -> bool:
        """Whether the recorder holds every accepted frame (no encoder or recorder failure)."""
        return self.stream.error is None and self.recorder.name not in self.stream.sink_errors

    async def _persist(self) -> None:
        """Join the segments into the MP4, then write the manifest that lets a restarted streamer serve
        it (`streamer.finished`). A failure to join fails the recording; a failure to write the
        manifest only costs that: this process still serves it, so it is logged, not raised."""
        try:
            joined = await asyncio.to_thread(self.recorder.assemble)
        except (OSError, RuntimeError, av.FFmpegError) as exc:
            log.exception("session %s: cannot join the recording's segments", self.session_id)
            self.stream.sink_errors[self.recorder.name] = f"joining its segments failed: {exc}"
            return
        if joined is None:
            return
        path = joined
        fmt = self.ingest.format
        manifest = Manifest(
            MANIFEST_VERSION,
            self.session_id,
            self.ingest.next_index,
            fmt.width,
            fmt.height,
            fmt.fps,
            self.frames_digest.hexdigest(),
            path.stat().st_size,
        )
        try:
            await asyncio.to_thread(write_manifest, path.parent, manifest)
        except OSError as exc:
            log.error("session %s: cannot write the manifest of %s (%s): a restarted streamer will not serve it",
                      self.session_id, path, exc)  # fmt: skip
            return
        await asyncio.to_thread(self.recorder.discard)

    def recording(self) -> Path:
        """The finished MP4; raises if the session is still open or its recording failed."""
        if self.stream.error is not None:
            raise EncoderFailed(f"session {self.session_id!r}: {self.stream.error}")
        if self.recorder.name in self.stream.sink_errors:
            raise EncoderFailed(
                f"session {self.session_id!r}: recording failed: {self.stream.sink_errors[self.recorder.name]}"
            )
        if not self.finalized:
            raise RecordingNotReady(
                f"session {self.session_id!r} is not finished ({self.ingest.next_index} frames so far); "
                "call FinishStream first"
            )
        return self.recorder.path
