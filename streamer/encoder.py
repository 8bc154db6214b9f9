"""H.264 encoding of RGB24 frames with PyAV: libx264 by default, NVENC on request.

The encoder is a bare codec context, not a container stream: it produces each packet once and
the sinks mux (or packetize) copies of it, so adding an output never adds an encode. Settings aim
at live streaming: no B-frames and no lookahead (tune zerolatency / NVENC ultra-low-latency), one
keyframe a second so a viewer or an RTMP server can join within a second, and SPS/PPS repeated
in-band on every keyframe (no global header) so any keyframe is a valid starting point.
"""

from __future__ import annotations

from typing import cast

import av
import numpy as np

from streamer.packets import EncodedPacket, StreamFormat

LIBX264 = "libx264"
NVENC = "h264_nvenc"
AUTO = "auto"
ENCODER_CHOICES = (LIBX264, NVENC, AUTO)

# Per-codec low-latency settings (FFmpeg private options).
_CODEC_OPTIONS: dict[str, dict[str, str]] = {
    LIBX264: {"preset": "ultrafast", "tune": "zerolatency"},
    NVENC: {"preset": "p1", "tune": "ull", "zerolatency": "1", "bf": "0"},
}
KEYFRAME_INTERVAL_S = 1.0


class H264Encoder:
    """One session's encoder: RGB24 frames in, Annex B `EncodedPacket`s out (not thread-safe; one thread uses it)."""

    def __init__(self, fmt: StreamFormat, codec: str = LIBX264) -> None:
        self.format = fmt
        context = cast(av.VideoCodecContext, av.CodecContext.create(codec, "w"))
        context.width = fmt.width
        context.height = fmt.height
        context.pix_fmt = "yuv420p"
        context.time_base = fmt.time_base
        context.framerate = fmt.rate
        context.gop_size = max(1, round(fmt.fps * KEYFRAME_INTERVAL_S))
        context.options = dict(_CODEC_OPTIONS[codec])
        context.open()
        self._context = context

    def encode(self, rgb: bytes, frame_index: int, keyframe: bool = False) -> list[EncodedPacket]:
        """Encode one frame (`width*height*3` bytes); returns the packets the encoder had ready (maybe none).
        `keyframe`: make it an IDR frame (a recording segment starts there), besides the regular ones."""
        fmt = self.format
        pixels = np.frombuffer(rgb, dtype=np.uint8).reshape(fmt.height, fmt.width, 3)
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
        frame.pts = frame_index
        frame.time_base = fmt.time_base
        if keyframe:  # closed GOPs (the default): a forced I frame is an IDR
            frame.pict_type = av.video.frame.PictureType.I
        return self._packets(self._context.encode(frame))

    def flush(self) -> list[EncodedPacket]:
        """Drain the frames the encoder still holds; the encoder cannot be used afterwards."""
        return self._packets(self._context.encode(None))

    @staticmethod
    def _packets(packets: list[av.Packet]) -> list[EncodedPacket]:
        out = []
        for packet in packets:
            assert packet.pts is not None, "libav encoders always stamp their packets"
            dts = packet.dts if packet.dts is not None else packet.pts
            out.append(EncodedPacket(bytes(packet), packet.pts, dts, packet.duration or 1, packet.is_keyframe))
        return out


def probe_encoder(codec: str) -> str | None:
    """Open `codec` on a tiny frame; returns why it cannot be used, or None if it works.

    `h264_nvenc` is compiled into PyAV's FFmpeg everywhere but only opens with an NVIDIA driver and
    an NVENC-capable GPU, so availability can only be learned by trying.
    """
    try:
        H264Encoder(StreamFormat(64, 64, 16.0), codec)
    except (av.FFmpegError, ValueError) as exc:
        return str(exc)
    return None


def resolve_encoder(requested: str) -> str:
    """The codec to use for `--encoder`: `auto` prefers NVENC and falls back to libx264.

    An explicit `h264_nvenc` that cannot open is a configuration error, reported (with FFmpeg's
    reason) at startup rather than on a session's first frame.
    """
    if requested == AUTO:
        return NVENC if probe_encoder(NVENC) is None else LIBX264
    if requested not in _CODEC_OPTIONS:
        raise ValueError(f"unknown encoder {requested!r}; choose one of {', '.join(ENCODER_CHOICES)}")
    problem = probe_encoder(requested)
    if problem is not None:
        raise ValueError(f"encoder {requested} cannot be opened here ({problem}); use --encoder libx264 or auto")
    return requested
