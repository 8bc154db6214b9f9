"""`StreamSession`: one session's ingest state, encoded stream and recording, with push and finish.

A per-session lock keeps the order frames are checked, queued and counted identical even when
several pushes for the same session overlap (e.g. a recovering worker re-sending while the old
stream is still draining), and makes finish wait for a push that is halfway through queueing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as otel_context

from inferix.api.v1 import streamer_pb2
from streamer.errors import EncoderFailed, RecordingNotReady
from streamer.finished import MANIFEST_VERSION, Manifest, write_manifest
from streamer.ingest import Admission, IngestState
from streamer.live import LiveSession
from streamer.sinks import Mp4Recorder
from streamer.stream import EncodedStream, RawFrame

log = logging.getLogger("inferix.streamer")


@dataclass
class StreamSession:
    """Everything the streamer holds for one session id."""

    ingest: IngestState
    stream: EncodedStream
    recorder: Mp4Recorder
    finalized: bool = False  # FinishStream completed: the MP4 is written
    # The live output, while the session's video is being re-sent (backfill) after a streamer restart:
    # it joins with the first new frame, so viewers never see the past again.
    live_pending: LiveSession | None = None
    # Digest of the accepted raw frames in order: checks delivery bit for bit despite the lossy encode.
    frames_digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def open(
        cls,
        ingest: IngestState,
        data_dir: Path,
        codec: str,
        queue_frames: int,
        live: LiveSession | None = None,
        live_now: bool = True,
    ) -> StreamSession:
        """Start the session's encoder with the MP4 recorder and, when given, the live pacer as outputs
        (`live_now=False`: the pacer joins with the first frame that is not backfill)."""
        stream = EncodedStream(ingest.session_id, ingest.format, codec=codec, queue_frames=queue_frames)
        recorder = Mp4Recorder(data_dir / f"{ingest.session_id}.mp4", ingest.format)
        stream.attach(recorder)
        session = cls(ingest, stream, recorder)
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
                await self.stream.put(
                    RawFrame(frame.frame_index, frame.block_index, frame.data, otel_context.get_current())
                )
                self.ingest.commit()
                self.frames_digest.update(frame.data)
            return admission

    async def finish(self, persist: bool = True) -> int:
        """End the video: encode what is queued, flush, finalize the MP4. Returns the frame count.
        `persist`: also write its manifest, so that a restarted streamer serves it (FinishStream's;
        not a shutdown's, which cuts a session short)."""
        async with self._lock:
            self.ingest.finished = True  # from here on only re-sent frames are accepted
            await self.stream.close()
            if persist and not self.finalized:
                await self._persist()
            self.finalized = True
            return self.ingest.next_index

    async def _persist(self) -> None:
        """Write the manifest that lets a restarted streamer serve this recording (`streamer.finished`).
        A failure only costs that: this process still serves it, so it is logged, not raised."""
        path = self.recorder.path
        if self.recorder.name in self.stream.sink_errors or not path.exists():
            return
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
