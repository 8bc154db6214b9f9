"""Streams and sessions in-process: one encode fanned out to sinks, failing outputs isolated, one span per block.

The collecting sink here is the shape of a later RTMP or WebRTC output: it only sees `EncodedPacket`s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferix.api.v1 import streamer_pb2
from inferix.telemetry import BLOCK_INDEX_ATTR, SESSION_ID_ATTR
from streamer.encoder import LIBX264
from streamer.errors import EncoderFailed
from streamer.ingest import Admission, IngestState
from streamer.packets import EncodedPacket, StreamFormat
from streamer.session import StreamSession
from streamer.stream import EncodedStream, RawFrame
from tests.streamer.media import pattern


@dataclass
class CollectingSink:
    name: str = "collector"
    packets: list[EncodedPacket] = field(default_factory=list)
    closed: bool = False

    def write(self, packet: EncodedPacket) -> None:
        self.packets.append(packet)

    def close(self) -> None:
        self.closed = True


@dataclass
class BrokenSink:
    name: str = "broken"
    writes: int = 0

    def write(self, packet: EncodedPacket) -> None:
        self.writes += 1
        raise ConnectionResetError("viewer went away")

    def close(self) -> None:
        raise AssertionError("a dropped sink is not closed")


def test_one_encode_feeds_every_sink_and_each_block_gets_a_span() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("test")
    fmt = StreamFormat(64, 48, 8.0)
    blocks = [(0, range(0, 5)), (1, range(5, 12)), (2, range(12, 20))]
    first, second, broken = CollectingSink("first"), CollectingSink("second"), BrokenSink()

    async def run() -> None:
        stream = EncodedStream("s1", fmt, queue_frames=4, tracer=tracer)  # a queue smaller than a block
        stream.attach(first)
        stream.attach(broken)
        with tracer.start_as_current_span("push"):
            for block, indices in blocks:
                if block == 1:
                    stream.attach(second)  # joins while the stream runs (when exactly depends on the encoder)
                for index in indices:
                    data = pattern(index, fmt.width, fmt.height).tobytes()
                    await stream.put(RawFrame(index, block, data, otel_context.get_current()))
        await stream.close()
        await stream.close()  # idempotent
        assert stream.error is None
        assert stream.sink_errors == {"broken": "ConnectionResetError: viewer went away"}
        with pytest.raises(EncoderFailed, match="the stream has ended"):
            stream.attach(CollectingSink("late"))

    asyncio.run(run())

    assert broken.writes == 1
    assert first.closed and second.closed
    assert [p.pts for p in first.packets] == list(range(20))  # no B-frames: one packet per frame, in order
    assert all(p.dts == p.pts and p.duration == 1 for p in first.packets)
    assert [p.pts for p in first.packets if p.keyframe] == [0, 8, 16]  # a keyframe a second at 8 fps
    assert first.packets[0].data.startswith(b"\x00\x00\x00\x01") and first.packets[0].data[4] & 0x1F == 7  # SPS
    # the sink that joined later got the very same packets (no second encode), from some point on
    assert second.packets and second.packets == first.packets[-len(second.packets) :]

    finished = spans.get_finished_spans()
    (push,) = [s for s in finished if s.name == "push"]
    encode_spans = sorted((s for s in finished if s.name == "streamer.encode"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {}).get(BLOCK_INDEX_ATTR) for s in encode_spans] == [0, 1, 2]
    assert {(s.attributes or {}).get(SESSION_ID_ATTR) for s in encode_spans} == {"s1"}
    assert [(s.attributes or {}).get("inferix.frames") for s in encode_spans] == [5, 7, 8]
    for span in encode_spans:
        assert span.parent is not None and span.parent.span_id == push.context.span_id
        assert span.status.status_code != trace_api.StatusCode.ERROR


def test_a_recording_that_cannot_be_written_is_reported_and_the_stream_goes_on(tmp_path: Path) -> None:
    fmt = StreamFormat(64, 48, 16.0)

    async def run() -> StreamSession:
        session = StreamSession.open(IngestState("s2", fmt), tmp_path, LIBX264, queue_frames=8, segment_frames=64)
        (tmp_path / "s2.segments" / "0000000000.mp4.part").mkdir(parents=True)  # the segment cannot be created
        viewer = CollectingSink("viewer")
        session.stream.attach(viewer)
        for index in range(3):
            data = pattern(index, fmt.width, fmt.height).tobytes()
            frame = streamer_pb2.VideoFrame(
                session_id="s2",
                frame_index=index,
                width=64,
                height=48,
                fps=16.0,
                data=data,
                format=streamer_pb2.PIXEL_FORMAT_RGB24,
            )
            assert await session.push(frame) is Admission.NEW
        assert await session.finish() == 3
        assert [p.pts for p in viewer.packets] == [0, 1, 2]  # the other output kept receiving
        return session

    session = asyncio.run(run())
    with pytest.raises(EncoderFailed, match="recording failed: IsADirectoryError"):
        session.recording()
