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

import av

from streamer.packets import EncodedPacket, StreamFormat


class PacketSink(Protocol):
    """Something that consumes a session's H.264 packets."""

    name: str

    def write(self, packet: EncodedPacket) -> None:
        """Take one packet; called on the encoder thread, must not block."""

    def close(self) -> None:
        """The stream ended (all packets written): finalize the output."""


class Mp4Recorder:
    """Muxes the session's packets, unchanged, into an MP4 file.

    The file is written as `<name>.part` and renamed when closed, so a complete-looking `.mp4`
    is always a finalized one. `faststart` moves the index to the front on close, so a browser
    can start playing the download before it has all of it.
    """

    name = "mp4"

    def __init__(self, path: Path, fmt: StreamFormat) -> None:
        self.path = path
        self.format = fmt
        self._partial = path.with_name(path.name + ".part")
        self._container: av.container.OutputContainer | None = None
        self._stream: av.stream.Stream | None = None

    def _open(self) -> tuple[av.container.OutputContainer, av.stream.Stream]:
        self._partial.parent.mkdir(parents=True, exist_ok=True)
        container = av.open(str(self._partial), "w", format="mp4", options={"movflags": "+faststart"})
        # A stream without a codec context: PyAV takes the SPS/PPS (avcC) from the first keyframe.
        stream = container.add_mux_stream(
            "h264", rate=self.format.rate, width=self.format.width, height=self.format.height
        )
        stream.time_base = self.format.time_base
        return container, stream

    def write(self, packet: EncodedPacket) -> None:
        if self._container is None or self._stream is None:
            self._container, self._stream = self._open()
        out = av.Packet(packet.data)
        out.pts = packet.pts
        out.dts = packet.dts
        out.duration = packet.duration
        out.time_base = self.format.time_base
        out.is_keyframe = packet.keyframe
        out.stream = self._stream
        self._container.mux(out)

    def close(self) -> None:
        if self._container is None:
            return  # no packet ever arrived: there is nothing to record
        self._container.close()
        self._container = self._stream = None
        self._partial.replace(self.path)
