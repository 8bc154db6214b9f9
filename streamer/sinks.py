"""Outputs of an encoded stream: the `PacketSink` protocol (the recorder is `streamer.segments`).

A sink receives every packet of a session after it was attached, in order, on the session's
encoder thread. `write` must return quickly: the live pacer (which feeds the RTMP push and the
WebRTC viewers) only hands packets over to the event loop, and each network output has its own
bounded queue and drops, rather than blocks, when it falls behind — a slow output never stalls the
encoder, and therefore never stalls generation. A sink
that joins mid-stream starts at the next packet; one that needs a decodable start waits for
`packet.keyframe` (SPS/PPS travel in-band with every keyframe).
"""

from __future__ import annotations

from typing import Protocol

from streamer.packets import EncodedPacket


class PacketSink(Protocol):
    """Something that consumes a session's H.264 packets."""

    name: str

    def write(self, packet: EncodedPacket) -> None:
        """Take one packet; called on the encoder thread, must not block."""

    def close(self) -> None:
        """The stream ended (all packets written): finalize the output."""
