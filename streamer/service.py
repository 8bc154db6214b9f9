"""The gRPC face of the streamer: `inferix.v1.StreamerService` on top of `StreamSession`s.

Handlers only translate: protobuf in, a session call, protobuf or a status code out. Every
refusal is a `StreamerError` subclass and maps to exactly one status code here. The live side of
each session (pacing, RTMP, WebRTC) is in the `LiveRegistry`, shared with the HTTP server
(`streamer.web`); the scheduler's link (`Link`) announces sessions and hears output events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import grpc

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.server import Registration
from streamer.encoder import LIBX264
from streamer.errors import (
    EncoderFailed,
    FrameRejected,
    FramesMissing,
    RecordingNotReady,
    SessionFinished,
    SessionNotFound,
    ShuttingDown,
    StreamerError,
    StreamStartsMidway,
)
from streamer.finished import FinishedRecording, load_finished
from streamer.ingest import Admission, IngestState, first_frame_format, valid_session_id
from streamer.link import LinkHub
from streamer.live import LiveConfig, LiveRegistry
from streamer.metrics import FRAMES_DUPLICATE, FRAMES_RECEIVED, FRAMES_REJECTED, SESSIONS_ACTIVE
from streamer.packets import StreamFormat
from streamer.segments import Journal, load_journal
from streamer.session import StreamSession

log = logging.getLogger("inferix.streamer")

SERVICE_NAME = streamer_pb2.DESCRIPTOR.services_by_name["StreamerService"].full_name

_STATUS: dict[type[StreamerError], grpc.StatusCode] = {
    FrameRejected: grpc.StatusCode.INVALID_ARGUMENT,
    SessionNotFound: grpc.StatusCode.NOT_FOUND,
    SessionFinished: grpc.StatusCode.FAILED_PRECONDITION,
    RecordingNotReady: grpc.StatusCode.FAILED_PRECONDITION,
    EncoderFailed: grpc.StatusCode.INTERNAL,
    StreamStartsMidway: grpc.StatusCode.OUT_OF_RANGE,  # the worker re-sends from GetStreamInfo.frames
    FramesMissing: grpc.StatusCode.OUT_OF_RANGE,  # likewise, then finishes again
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,  # the worker waits for the next streamer process
}


@dataclass(frozen=True)
class StreamerConfig:
    """Settings of one streamer process."""

    data_dir: Path  # recordings are written here as <session id>.mp4
    segment_seconds: float = 4.0  # a recording in progress is durable up to its last segment (streamer.segments)
    codec: str = LIBX264  # a resolved encoder name (see encoder.resolve_encoder)
    queue_frames: int = 48  # frames buffered per session between ingest and encoder (4 Wan blocks)
    chunk_bytes: int = 256 * 1024  # GetRecording chunk size; well below gRPC's default 4 MiB receive limit
    live: LiveConfig = LiveConfig()  # pacing, RTMP push, viewers


def _reason(error: StreamerError) -> str:
    """The `reason` label of a refused frame: the field at fault, or the session state that refused it."""
    if isinstance(error, FrameRejected):
        return error.field
    if isinstance(error, StreamStartsMidway):
        return "frame_index"
    if isinstance(error, ShuttingDown):
        return "shutting_down"
    return "finished" if isinstance(error, SessionFinished) else "encoder_failed"


REFUSED_READ_OUT_MESSAGES = 256  # a worker pushes one block (a few frames) per call
REFUSED_READ_OUT_S = 5.0


async def _read_out(requests: AsyncIterator[streamer_pb2.PushFramesRequest]) -> None:
    """Discard what the sender still writes before refusing its call. A status that arrives while an
    aio sender's write is in flight reaches it as INTERNAL "Failed execute_batch" instead of the refusal
    (a worker would miss OUT_OF_RANGE, its cue to re-send from frame 0). Bounded, for a sender that never stops."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REFUSED_READ_OUT_S):
            read = 0
            async for _ in requests:
                read += 1
                if read >= REFUSED_READ_OUT_MESSAGES:
                    return


_Answer = TypeVar("_Answer", streamer_pb2.PushFramesResponse, streamer_pb2.PushBlockResponse)


@dataclass
class _Tally:
    """What one push call did with its frames so far."""

    accepted: int = 0
    duplicates: int = 0
    durable: int = 0

    def before_refusal(self) -> str:
        return f" [this call accepted {self.accepted} and skipped {self.duplicates} frames before it; they are kept]"

    def answer(self, response: type[_Answer]) -> _Answer:
        """The call's response (PushFramesResponse or PushBlockResponse: the same fields)."""
        return response(accepted=self.accepted, duplicates=self.duplicates, durable_frames=self.durable)


async def _abort(context: grpc.aio.ServicerContext, error: StreamerError, suffix: str = "") -> NoReturn:
    await context.abort(_STATUS[type(error)], f"{error}{suffix}")
    raise AssertionError("context.abort returns only by raising")


class StreamerService(streamer_pb2_grpc.StreamerServiceServicer):
    """Frame ingest, encode and recordings for many concurrent sessions. Sessions are held in memory;
    a finished one is also answered for from its manifest on disk after a restart (`streamer.finished`),
    and one in progress goes on from its recording journal (`streamer.segments`)."""

    def __init__(self, config: StreamerConfig, link: LinkHub) -> None:
        self.config = config
        self.link = link
        self.live = LiveRegistry(config.live, link.report)
        link.registry = self.live
        self._sessions: dict[str, StreamSession] = {}
        self.draining = False  # set on SIGTERM: no more frames or finishes (see `drain`)
        SESSIONS_ACTIVE.set_function(self._active_sessions)

    def _active_sessions(self) -> int:
        """Sessions not yet finished; read by the metrics thread at scrape time (list() copies atomically)."""
        return sum(not session.ingest.finished for session in list(self._sessions.values()))

    def recording(self, session_id: str) -> Path:
        """A finished session's MP4 (`SessionNotFound`, `RecordingNotReady`, `EncoderFailed` otherwise)."""
        session = self._session(session_id)
        if isinstance(session, Journal):
            raise RecordingNotReady(
                f"session {session_id!r} is not finished ({session.frames} frames so far); call FinishStream first"
            )
        return session.path if isinstance(session, FinishedRecording) else session.recording()

    def _session(self, session_id: str) -> StreamSession | FinishedRecording | Journal:
        """The session this process holds, else a recording a previous streamer process finished, else
        the journal of one it was making (`streamer.segments`)."""
        session = self._sessions.get(session_id)
        if session is not None:
            return session
        try:
            return load_finished(self.config.data_dir, session_id)
        except SessionNotFound:
            journal = load_journal(self.config.data_dir, session_id) if valid_session_id(session_id) else None
            if journal is None:
                raise
            return journal

    def _session_for(self, frame: streamer_pb2.VideoFrame) -> StreamSession | FinishedRecording:
        """The frame's session; its first frame opens it, or resumes it from its journal (no await here:
        two pushes cannot both open it). One finished before a restart takes re-sent frames as
        duplicates and refuses new ones."""
        try:
            known = self._session(frame.session_id)
        except SessionNotFound:
            return self._open(frame.session_id, first_frame_format(frame), None, live_now=not frame.backfill)
        if not isinstance(known, Journal):
            return known
        if frame.frame_index > known.frames:
            raise StreamStartsMidway(
                f"session {frame.session_id!r} has frames 0..{known.frames - 1} in this streamer (it restarted): "
                f"send its video from frame {known.frames}, got frame {frame.frame_index}"
            )
        return self._open(frame.session_id, known.format, known, live_now=not frame.backfill)

    def _open(self, session_id: str, fmt: StreamFormat, journal: Journal | None, live_now: bool) -> StreamSession:
        """Start recording a session, from frame 0 or after a previous process's journal."""
        config = self.config
        ingest = IngestState(session_id, fmt, next_index=journal.frames if journal is not None else 0)
        session = StreamSession.open(
            ingest,
            config.data_dir,
            config.codec,
            config.queue_frames,
            max(1, round(fmt.fps * config.segment_seconds)),
            self.live.get_or_create(session_id),
            live_now=live_now,
            resumed=journal,
        )
        self._sessions[session_id] = session
        if journal is not None:
            how = f" (resumed after frame {journal.frames - 1}, from its recording journal)"
        else:
            how = "" if live_now else " (its video re-sent from frame 0 after a restart)"
        log.info("session %s opened: %dx%d at %g fps%s", session_id, fmt.width, fmt.height, fmt.fps, how)
        return session

    async def PushFrames(
        self, request_iterator: AsyncIterator[streamer_pb2.PushFramesRequest], context: grpc.aio.ServicerContext
    ) -> streamer_pb2.PushFramesResponse:
        tally = _Tally()
        async for request in request_iterator:
            try:
                await self._admit(request.frame, tally)
            except StreamerError as error:
                await _read_out(request_iterator)
                await _abort(context, error, tally.before_refusal())
        return tally.answer(streamer_pb2.PushFramesResponse)

    async def PushBlock(
        self, request: streamer_pb2.PushBlockRequest, context: grpc.aio.ServicerContext
    ) -> streamer_pb2.PushBlockResponse:
        tally = _Tally()
        for frame in request.frames:
            try:
                await self._admit(frame, tally)
            except StreamerError as error:
                await _abort(context, error, tally.before_refusal())
        return tally.answer(streamer_pb2.PushBlockResponse)

    async def _admit(self, frame: streamer_pb2.VideoFrame, tally: _Tally) -> None:
        """One pushed frame into its session (or the finished recording it repeats), counted in `tally`."""
        try:
            self._refuse_while_draining()
            session = self._session_for(frame)
            if isinstance(session, FinishedRecording):
                admission = session.admit(frame)
                tally.durable = session.manifest.frames
            else:
                admission = await session.push(frame)
                tally.durable = session.durable_frames
        except StreamerError as error:
            FRAMES_REJECTED.labels(_reason(error)).inc()
            raise
        if admission is Admission.NEW:
            tally.accepted += 1
            FRAMES_RECEIVED.inc()
        else:
            tally.duplicates += 1
            FRAMES_DUPLICATE.inc()

    def _refuse_while_draining(self) -> None:
        if self.draining:  # a session finalized by the drain must not look finished to its worker
            raise ShuttingDown("the streamer is shutting down; retry: the next streamer takes the session's video")

    async def _finish(self, session: StreamSession | FinishedRecording, persist: bool = True) -> int:
        if isinstance(session, FinishedRecording):
            return session.manifest.frames  # a FinishStream repeated after a restart
        was_finalized = session.finalized
        frames = await session.finish(persist)
        if not was_finalized:
            log.info("session %s finished: %d frames -> %s", session.session_id, frames, session.recorder.path)
        return frames

    async def FinishStream(
        self, request: streamer_pb2.FinishStreamRequest, context: grpc.aio.ServicerContext
    ) -> streamer_pb2.FinishStreamResponse:
        try:
            self._refuse_while_draining()
            session = self._session(request.session_id)
            # Refused only when frames may be missing; a sender that knows fewer frames than are here
            # (its predecessor pushed a block it never committed) gets the recording as it is.
            if isinstance(session, Journal):
                if request.frames == 0 or request.frames > session.frames:
                    raise FramesMissing(
                        f"session {request.session_id!r} has frames 0..{session.frames - 1} in this streamer "
                        f"(it restarted){self._claimed(request.frames)}: re-send from frame {session.frames}, "
                        "then finish it"
                    )
                session = self._open(request.session_id, session.format, session, live_now=False)
            if isinstance(session, StreamSession) and not session.finalized and request.frames:
                held = session.ingest.next_index
                if request.frames > held:
                    raise FramesMissing(
                        f"session {request.session_id!r} has frames 0..{held - 1} in this streamer"
                        f"{self._claimed(request.frames)}: re-send from frame {held}, then finish it"
                    )
            frames = await self._finish(session)
        except StreamerError as error:
            await _abort(context, error)
        return streamer_pb2.FinishStreamResponse(frames=frames)

    @staticmethod
    def _claimed(frames: int) -> str:
        return f", the request says {frames}" if frames else ", the request does not say how many it has"

    async def GetStreamInfo(
        self, request: streamer_pb2.GetStreamInfoRequest, context: grpc.aio.ServicerContext
    ) -> streamer_pb2.GetStreamInfoResponse:
        try:
            session = self._session(request.session_id)
        except StreamerError as error:
            await _abort(context, error)
        if isinstance(session, FinishedRecording):
            manifest = session.manifest
            return self._info_from_disk(
                session.session_id, session.format, manifest.frames, manifest.frames_sha256, finished=True
            )
        if isinstance(session, Journal):
            return self._info_from_disk(
                session.session_id, session.format, session.frames, session.frames_digest, finished=False
            )
        fmt = session.ingest.format
        return streamer_pb2.GetStreamInfoResponse(
            session_id=session.session_id,
            frames=session.ingest.next_index,
            width=fmt.width,
            height=fmt.height,
            fps=fmt.fps,
            finished=session.finalized,
            frames_sha256=session.frames_digest.hexdigest(),
            live=self.live.get_or_create(session.session_id).to_proto(),
        )

    def _info_from_disk(
        self, session_id: str, fmt: StreamFormat, frames: int, digest: str, finished: bool
    ) -> streamer_pb2.GetStreamInfoResponse:
        """A session this process knows from a manifest (finished) or a journal (in progress, not yet
        resumed): its live outputs, if any, ended with the previous process."""
        live = self.live.get(session_id)
        return streamer_pb2.GetStreamInfoResponse(
            session_id=session_id,
            frames=frames,
            width=fmt.width,
            height=fmt.height,
            fps=fmt.fps,
            finished=finished,
            frames_sha256=digest,
            live=live.to_proto() if live is not None else streamer_pb2.LiveStats(),
        )

    async def GetRecording(
        self, request: streamer_pb2.GetRecordingRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[streamer_pb2.GetRecordingResponse]:
        try:
            path = self.recording(request.session_id)
        except StreamerError as error:
            await _abort(context, error)
        with path.open("rb") as file:
            while chunk := await asyncio.to_thread(file.read, self.config.chunk_bytes):
                yield streamer_pb2.GetRecordingResponse(chunk=chunk)

    async def Link(
        self, request_iterator: AsyncIterator[streamer_pb2.LinkRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[streamer_pb2.LinkResponse]:
        async for event in self.link.serve(request_iterator):
            yield event

    async def drain(self) -> None:
        """On shutdown: stop the live outputs now, then close every open session's recording and journal
        all its frames (no manifest: those sessions did not end). The next streamer goes on after them.
        From the start it refuses frames and finishes (UNAVAILABLE): a frame pushed after its session was
        finalized here would otherwise be refused as past a finished session, failing the session."""
        self.draining = True
        self.link.close()
        await self.live.shutdown()
        open_sessions = [session for session in self._sessions.values() if not session.finalized]
        if open_sessions:
            log.info("finalizing %d open session(s) before exit", len(open_sessions))
        results = await asyncio.gather(*(self._finish(s, persist=False) for s in open_sessions), return_exceptions=True)
        for session, result in zip(open_sessions, results, strict=True):
            if isinstance(result, BaseException):
                log.error("session %s could not be finalized: %s", session.session_id, result)


def register(server: grpc.aio.Server, service: StreamerService) -> Registration:
    """Add the streamer to `server` (the `register` callback of `inferix.server.run_server`)."""
    config = service.config
    log.info("encoding with %s; recordings go to %s", config.codec, config.data_dir)
    rtmp = config.live.rtmp
    log.info("rtmp push: %s", f"{rtmp.url}/<session> (sessions that ask for it)" if rtmp else "off (no --rtmp-url)")
    streamer_pb2_grpc.add_StreamerServiceServicer_to_server(service, server)
    return Registration([SERVICE_NAME], drain=service.drain)
