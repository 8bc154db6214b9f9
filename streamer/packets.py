"""The data that crosses from the encoder to the outputs: a stream's format and its packets.

These dataclasses are the whole contract between `EncodedStream` and a `PacketSink`: they are
plain values (no PyAV objects), so a sink can keep them, pass them to another thread or turn them
into whatever its protocol needs (an MP4 sample, an FLV tag, RTP payloads) without caring about
the encoder's buffer lifetimes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from opentelemetry.context import Context

# 1001 covers the NTSC rates (30000/1001); model rates (16, 24) are integers anyway.
_MAX_RATE_DENOMINATOR = 1001


@dataclass(frozen=True)
class StreamFormat:
    """What every frame of a session looks like; fixed by the session's first frame."""

    width: int
    height: int
    fps: float

    @property
    def rate(self) -> Fraction:
        """The frame rate as the exact fraction containers and codecs want."""
        return Fraction(self.fps).limit_denominator(_MAX_RATE_DENOMINATOR)

    @property
    def time_base(self) -> Fraction:
        """One tick per frame, so a frame's pts is its absolute frame index."""
        return 1 / self.rate

    @property
    def frame_bytes(self) -> int:
        """Size of one RGB24 frame."""
        return self.width * self.height * 3


@dataclass(frozen=True)
class SegmentStart:
    """The frame that starts a new recording segment (encoded as a keyframe) and the frames digest
    (`inferix.frames_digest`, hex) of every frame before it."""

    frame_index: int
    digest: str


@dataclass(frozen=True)
class EncodedPacket:
    """One H.264 access unit in Annex B form (start codes; SPS/PPS repeated on every keyframe).

    Timestamps are in `StreamFormat.time_base` ticks, i.e. frame indices. The encoder emits no
    B-frames (low-latency tuning), so `dts == pts` and packets arrive in presentation order.
    `block_index` and `trace_context` say which generated block the frame came from and the trace
    of the push that delivered it, so outputs can report per block (the `streamer.publish` span);
    `received_s` is when ingest accepted the frame, which anchors the live clock (so the encoder's
    start-up time on the first frame is absorbed by the jitter buffer, not added to every frame).
    """

    data: bytes
    pts: int
    dts: int
    duration: int
    keyframe: bool
    block_index: int = 0
    trace_context: Context | None = field(default=None, compare=False, repr=False)
    received_s: float | None = None  # time.monotonic() when ingest accepted the frame
    # Set on the first packet of a recording segment (`streamer.segments`): where it starts and the
    # frames digest before it, which the recording's journal records when the previous segment closes.
    segment: SegmentStart | None = None


@dataclass(frozen=True)
class LivePacket:
    """A packet released by the pacer to the live outputs, with its place on the live timeline.

    `live_s` is the presentation time in seconds since the session's live output started: wall-clock
    based (gaps where generation fell behind) under the `hold` policy, frame-index based under `stall`.
    RTMP turns it into FLV milliseconds and WebRTC into 90 kHz RTP ticks, so every output shows a
    frame when it was released, not when it was generated.
    """

    packet: EncodedPacket
    live_s: float
