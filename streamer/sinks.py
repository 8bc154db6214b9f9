"""Outputs of an encoded stream: the `PacketSink` protocol and the MP4 recorder.

A sink receives every packet of a session after it was attached, in order, on the session's
encoder thread. `write` must return quickly: the live pacer (which feeds the RTMP push and the
WebRTC viewers) only hands packets over to the event loop, and each network output has its own
bounded queue and drops, rather than blocks, when it falls behind — a slow output never stalls the
encoder, and therefore never stalls generation. A sink
that joins mid-stream starts at the next packet; one that needs a decodable start waits for
`packet.keyframe` (SPS/PPS travel in-band with every keyframe).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from inferix.media import Mp4Writer
from streamer.packets import EncodedPacket, StreamFormat


class PacketSink(Protocol):
    """Something that consumes a session's H.264 packets."""

    name: str

    def write(self, packet: EncodedPacket) -> None:
        """Take one packet; called on the encoder thread, must not block."""

    def close(self) -> None:
        """The stream ended (all packets written): finalize the output."""


class Mp4Recorder:
    """Records the session's packets, unchanged, into an MP4 file (`inferix.media.Mp4Writer`).

    The file is written as `<name>.part` and renamed when closed, so a complete-looking `.mp4`
    is always a finalized one. `faststart` moves the index to the front on close, so a browser
    can start playing the download before it has all of it. A session that never had a packet
    leaves no file.
    """

    name = "mp4"

    def __init__(self, path: Path, fmt: StreamFormat) -> None:
        self.path = path
        self.format = fmt
        self._writer = Mp4Writer.for_packets(path, fmt.width, fmt.height, fmt.rate, partial=True, faststart=True)

    def write(self, packet: EncodedPacket) -> None:
        self._writer.write_packet(packet.data, packet.pts, packet.dts, packet.duration, packet.keyframe)

    def close(self) -> None:
        self._writer.close()
