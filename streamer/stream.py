"""`EncodedStream`: one session's frames encoded once, off the event loop, fanned out to packet sinks.

Ingest (gRPC handlers on the event loop) only validates and enqueues; a bounded queue carries
frames to one encoder thread per session, so a busy encoder delays its own session's pushes
(backpressure through gRPC flow control) and never the event loop or other sessions. The encoder
thread hands each packet to every attached `PacketSink` — the MP4 recorder and the live pacer
(which feeds the RTMP push and the WebRTC viewers) — so one encode feeds all outputs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from opentelemetry import trace
from opentelemetry.context import Context

from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR
from inferix.telemetry import tracer as get_tracer
from streamer.encoder import LIBX264, H264Encoder
from streamer.errors import EncoderFailed
from streamer.metrics import ENCODE_SECONDS
from streamer.packets import EncodedPacket, SegmentStart, StreamFormat
from streamer.sinks import PacketSink

log = logging.getLogger("inferix.streamer.stream")

# Frames handed to the encoder thread per hop: amortizes the thread hand-off without delaying a
# frame behind more than a block's worth of others.
_MAX_BATCH = 16


@dataclass(frozen=True)
class RawFrame:
    """A validated frame on its way to the encoder."""

    index: int
    block_index: int
    data: bytes
    trace_context: Context  # of the push that delivered it: the parent of its block's encode span
    received_s: float = field(default_factory=time.monotonic)  # when ingest accepted it (anchors live pacing)
    segment: SegmentStart | None = None  # it starts a recording segment: encode it as a keyframe


@dataclass
class _BlockSpan:
    """Encode time of one block, reported as one `streamer.encode` span when the block is complete."""

    block_index: int
    parent: Context
    first_frame: int
    start_ns: int
    end_ns: int = 0
    frames: int = 0
    encode_s: float = 0.0


class EncodedStream:
    """The encoded packet stream of one session. Create, `put` and `close` it on the event loop."""

    def __init__(
        self,
        session_id: str,
        fmt: StreamFormat,
        codec: str = LIBX264,
        queue_frames: int = 48,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.session_id = session_id
        self.format = fmt
        self.codec = codec
        self.error: str | None = None
        self.sink_errors: dict[str, str] = {}  # sink name -> why it was dropped
        self._tracer = tracer or get_tracer("inferix.streamer")
        self._queue: asyncio.Queue[RawFrame | None] = asyncio.Queue(maxsize=queue_frames)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"encode-{session_id}")
        self._sinks: list[PacketSink] = []
        self._sinks_lock = threading.Lock()  # attach() runs on the event loop, delivery on the encoder thread
        self._ended = False
        self._end_queued = False
        self._encoder: H264Encoder | None = None
        self._block: _BlockSpan | None = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"encode-{session_id}")

    def attach(self, sink: PacketSink) -> None:
        """Add an output; it receives every packet produced from now on."""
        with self._sinks_lock:
            if self._ended:
                raise EncoderFailed(f"session {self.session_id!r}: cannot attach {sink.name}, the stream has ended")
            self._sinks.append(sink)

    async def put(self, frame: RawFrame) -> None:
        """Queue a frame for encoding; waits while the queue is full (the encoder sets the pace)."""
        if self.error is not None:
            raise EncoderFailed(f"session {self.session_id!r}: {self.error}")
        assert not self._end_queued, "frames after close() are refused by the session before they get here"
        await self._queue.put(frame)

    async def close(self) -> None:
        """Encode what is queued, flush the encoder and close every sink; safe to call again."""
        if not self._end_queued:
            await self._queue.put(None)
            self._end_queued = True
        await asyncio.shield(self._task)  # a cancelled caller must not abort the finalization
        if self.error is not None:
            raise EncoderFailed(f"session {self.session_id!r}: {self.error}")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            end = False
            while not end:
                batch: list[RawFrame] = []
                item = await self._queue.get()
                while item is not None:
                    batch.append(item)
                    if len(batch) == _MAX_BATCH or self._queue.empty():
                        break
                    item = self._queue.get_nowait()
                end = item is None
                await loop.run_in_executor(self._executor, self._encode, batch, end)
        finally:
            self._executor.shutdown(wait=False)

    # Everything below runs on the encoder thread.

    def _encode(self, frames: list[RawFrame], end: bool) -> None:
        if self.error is None:
            try:
                if self._encoder is None:
                    self._encoder = H264Encoder(self.format, self.codec)
                for frame in frames:
                    self._encode_frame(self._encoder, frame)
                if end:
                    started = time.perf_counter()
                    packets = self._encoder.flush()
                    if self._block is not None:
                        self._block.encode_s += time.perf_counter() - started
                    self._deliver(packets)
            except Exception as exc:  # any encoder failure ends the session, with the reason kept for the caller
                log.exception("session %s: encoding failed", self.session_id)
                self.error = f"{self.codec} encoding failed: {exc}"
        if end:
            self._end_block()
            with self._sinks_lock:
                self._ended = True
                sinks, self._sinks = self._sinks, []
            for sink in sinks:
                self._call(sink, sink.close)

    def _encode_frame(self, encoder: H264Encoder, frame: RawFrame) -> None:
        block = self._block
        if block is None or block.block_index != frame.block_index:
            self._end_block()
            block = self._block = _BlockSpan(frame.block_index, frame.trace_context, frame.index, time.time_ns())
        started = time.perf_counter()
        packets = [
            replace(
                packet,
                block_index=frame.block_index,
                trace_context=frame.trace_context,
                received_s=frame.received_s,
                segment=frame.segment if packet.pts == frame.index else None,
            )
            for packet in encoder.encode(frame.data, frame.index, keyframe=frame.segment is not None)
        ]
        seconds = time.perf_counter() - started
        ENCODE_SECONDS.observe(seconds)
        block.frames += 1
        block.encode_s += seconds
        block.end_ns = time.time_ns()
        self._deliver(packets)

    def _end_block(self) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        span = self._tracer.start_span(
            "streamer.encode",
            context=block.parent,
            start_time=block.start_ns,
            attributes={
                SESSION_ID_ATTR: self.session_id,
                BLOCK_INDEX_ATTR: block.block_index,
                "inferix.first_frame": block.first_frame,
                "inferix.frames": block.frames,
                "inferix.encode_seconds": block.encode_s,
                "inferix.codec": self.codec,
            },
        )
        if self.error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, self.error))
        span.end(end_time=max(block.end_ns, block.start_ns))

    def _deliver(self, packets: list[EncodedPacket]) -> None:
        for packet in packets:
            with self._sinks_lock:
                sinks = list(self._sinks)
            for sink in sinks:
                self._call(sink, sink.write, packet)

    def _call(self, sink: PacketSink, method: Callable[..., None], *args: object) -> None:
        """Run a sink method; a sink that raises is dropped so it cannot take the other outputs down."""
        try:
            method(*args)
        except Exception as exc:
            log.exception("session %s: output %s failed and was dropped", self.session_id, sink.name)
            self.sink_errors[sink.name] = f"{type(exc).__name__}: {exc}"
            with self._sinks_lock:
                if sink in self._sinks:
                    self._sinks.remove(sink)
