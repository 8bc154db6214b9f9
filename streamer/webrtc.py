"""WebRTC viewers of one session (aiortc), negotiated WHEP-style: SDP offer in, SDP answer out.

**No second encode for H.264 viewers.** A viewer's track hands aiortc the session's already-encoded
H.264 access units (`av.Packet`); aiortc only packetizes them into RTP (`H264Encoder.pack`: FU-A /
STAP-A, packetization-mode 1). The encoder's output is Constrained Baseline with SPS/PPS in-band on
every keyframe (one a second), which is what browsers negotiate (profile-level-id 42e01f/42001f),
and a viewer joins at the next keyframe. So one encode serves the MP4, the RTMP push and every
H.264 viewer. aiortc cannot force a keyframe into a shared stream (a PLI from one viewer cannot
restart the encoder for all), so a viewer that loses packets beyond NACK repair recovers at the
next keyframe, within a second.

**VP8 fallback.** A browser that offers no H.264 (e.g. a Firefox without the OpenH264 plugin) gets
VP8: the hub decodes the session's H.264 once (one decoder, shared by all VP8 viewers, on its own
thread) and aiortc encodes VP8 per such viewer (with its own PLI / bandwidth handling). That costs
a decode plus an encode per VP8 viewer; H.264 is therefore preferred whenever the offer allows it.

**Timing.** Packets come from the pacer when they are due; their RTP timestamps are the pacer's live
timeline (90 kHz), so the browser's jitter buffer sees a steady source. Each viewer has a small
bounded queue: a viewer that cannot keep up drops for itself only (and resumes at a keyframe).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import av
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecCapability
from aiortc.sdp import SessionDescription

from streamer import metrics
from streamer.errors import StreamerError
from streamer.ice import IceServers
from streamer.pacing import KeyframeGate, LiveStats
from streamer.packets import LivePacket

log = logging.getLogger("inferix.streamer.webrtc")

RTP_TIME_BASE = Fraction(1, 90000)  # the RTP video clock
H264 = "H264"
VP8 = "VP8"
_QUEUE_S = 1.0  # per-viewer buffer of packets before it drops (H.264)
_VP8_QUEUE_FRAMES = 3  # decoded frames are independent: a short queue, drop the oldest
_CONNECT_TIMEOUT_S = 30.0  # a viewer that never connects (ICE failed) is closed after this
_LINGER_S = 5.0  # viewers stay connected this long after the video ends, then are hung up


class BadOffer(StreamerError):
    """The SDP offer cannot be answered (malformed, no video, no codec in common); the message says why."""


class TooManyViewers(StreamerError):
    """The session has its maximum of viewers."""


def _codec_preferences() -> list[RTCRtpCodecCapability]:
    """H.264 packetization-mode 1 first (no re-encode), then VP8, each with its RTX for retransmission."""
    codecs = RTCRtpSender.getCapabilities("video").codecs

    def rank(codec: RTCRtpCodecCapability) -> int:
        name = codec.mimeType.split("/")[1].upper()
        if name == H264 and codec.parameters.get("packetization-mode") == "1":
            return 0 if codec.parameters.get("profile-level-id") == "42e01f" else 1
        return {VP8: 2, "RTX": 3}.get(name, 9)

    return sorted((c for c in codecs if rank(c) < 9), key=rank)


def without_mdns_candidates(sdp: str) -> str:
    """The offer without its mDNS (`<uuid>.local`) host candidates.

    Browsers hide their host addresses behind mDNS names; aiortc resolves each one before it answers,
    waiting a second per name where multicast does not get through (containers, many servers). The
    browser is the side that reaches us: its connectivity checks arrive at our host candidates and
    aiortc learns its address from them (a peer-reflexive candidate), so the names are not needed.
    """
    lines = sdp.splitlines(keepends=True)
    kept = [line for line in lines if not (line.startswith("a=candidate:") and ".local " in line)]
    return "".join(kept)


def parse_offer(sdp: str) -> SessionDescription:
    """Check an offer before any WebRTC state is created; raises `BadOffer` with the reason."""
    if not sdp.strip():
        raise BadOffer("the request body must be an SDP offer (Content-Type: application/sdp); it is empty")
    if not sdp.lstrip().startswith("v=0"):
        raise BadOffer("the SDP offer must start with 'v=0'")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadOffer(f"the SDP offer could not be parsed: {type(exc).__name__}: {exc}") from exc
    if not any(media.kind == "video" for media in parsed.media):
        raise BadOffer("the SDP offer has no video section; add a recvonly video transceiver")
    if not any(
        c.name.upper() in (H264, VP8) for media in parsed.media if media.kind == "video" for c in media.rtp.codecs
    ):
        raise BadOffer("the SDP offer has no codec this server sends: H.264 (packetization-mode=1) or VP8")
    return parsed


class ViewerTrack(MediaStreamTrack):
    """The video track of one viewer: `recv` returns the next packet (H.264) or frame (VP8) handed to it."""

    kind = "video"

    def __init__(self, codec: str, fps: float) -> None:
        super().__init__()
        self.codec = codec
        capacity = max(2, round(_QUEUE_S * fps)) if codec == H264 else _VP8_QUEUE_FRAMES
        self.gate = KeyframeGate(capacity)
        self._queue: collections.deque[av.Packet | av.VideoFrame] = collections.deque()
        self._ready = asyncio.Event()
        self._finished = False

    def put_packet(self, packet: av.Packet, keyframe: bool) -> bool:
        """Queue an H.264 access unit; False when dropped (queue full, or waiting for a keyframe)."""
        if self._finished or not self.gate.admit(keyframe, len(self._queue)):
            return False
        self._queue.append(packet)
        self._ready.set()
        return True

    def put_frame(self, frame: av.VideoFrame) -> bool:
        """Queue a decoded frame (VP8 viewers); when full the oldest goes. False when a frame was dropped."""
        if self._finished:
            return False
        dropped = len(self._queue) >= self.gate.capacity
        if dropped:
            self._queue.popleft()
        self._queue.append(frame)
        self._ready.set()
        return not dropped

    def finish(self) -> None:
        self._finished = True
        self._ready.set()

    async def recv(self) -> av.Packet | av.VideoFrame:
        while not self._queue:
            if self._finished or self.readyState != "live":
                raise MediaStreamError
            self._ready.clear()
            await self._ready.wait()
        return self._queue.popleft()


@dataclass
class Viewer:
    """One connected (or connecting) browser."""

    viewer_id: str
    pc: RTCPeerConnection
    track: ViewerTrack
    codec: str
    connected: bool = False


class _SharedDecoder:
    """Decodes the session's H.264 once for every VP8 viewer, on a thread of its own."""

    def __init__(self, session_id: str) -> None:
        self._context = av.CodecContext.create("h264", "r")
        self._gate = KeyframeGate(capacity=64)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vp8-decode-{session_id}")

    def decode(self, packet: LivePacket) -> asyncio.Future[list[av.VideoFrame]] | None:
        if not self._gate.admit(packet.packet.keyframe, 0):
            return None
        return asyncio.get_running_loop().run_in_executor(self._executor, self._decode, packet)

    def _decode(self, packet: LivePacket) -> list[av.VideoFrame]:
        frames = []
        for frame in self._context.decode(av.Packet(packet.packet.data)):
            assert isinstance(frame, av.VideoFrame)
            frame.pts = round(packet.live_s / RTP_TIME_BASE)
            frame.time_base = RTP_TIME_BASE
            frames.append(frame)
        return frames

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class ViewerHub:
    """All WebRTC viewers of one session: a `LiveConsumer` of the pacer and the WHEP endpoint's backend."""

    name = "webrtc"

    def __init__(
        self, session_id: str, stats: LiveStats, max_viewers: int, fps: float = 16.0, ice: IceServers | None = None
    ) -> None:
        self.session_id = session_id
        self.ice = ice or IceServers()
        self.stats = stats
        self.max_viewers = max_viewers
        self.fps = fps  # sizes the viewers' queues; set from the stream format once frames arrive
        self.viewers: dict[str, Viewer] = {}
        self.ended = False
        self._decoder: _SharedDecoder | None = None
        self._preferences = _codec_preferences()
        self._hang_up: asyncio.Task[None] | None = None

    # ---- signalling ----------------------------------------------------------------------------
    async def add_viewer(self, offer_sdp: str) -> tuple[Viewer, str]:
        """Answer a WHEP offer: returns the new viewer and the SDP answer (ICE candidates included)."""
        parse_offer(offer_sdp)
        if len(self.viewers) >= self.max_viewers:
            raise TooManyViewers(f"session {self.session_id!r} already has {self.max_viewers} viewers (--max-viewers)")
        # The streamer's side uses the viewers' STUN / TURN servers too: relayed at both ends when needed.
        servers = [server.for_aiortc() for server in self.ice.issue(self.session_id)]
        pc = RTCPeerConnection(RTCConfiguration(iceServers=servers))
        track = ViewerTrack(H264, self.fps)  # the codec is fixed below, once negotiated
        try:
            transceiver = pc.addTransceiver(track, direction="sendonly")
            transceiver.setCodecPreferences(self._preferences)
            try:
                offer = RTCSessionDescription(sdp=without_mdns_candidates(offer_sdp), type="offer")
                await pc.setRemoteDescription(offer)
            except Exception as exc:
                raise BadOffer(f"the SDP offer cannot be answered: {type(exc).__name__}: {exc}") from exc
            await pc.setLocalDescription(await pc.createAnswer())
        except BaseException:
            await pc.close()
            raise
        answer = pc.localDescription.sdp
        codec = _sent_codec(answer)
        if codec == VP8:
            track.codec = VP8
            track.gate = KeyframeGate(_VP8_QUEUE_FRAMES)
        viewer = Viewer(uuid.uuid4().hex[:16], pc, track, codec)
        self.viewers[viewer.viewer_id] = viewer
        metrics.VIEWERS.inc()
        self._watch(viewer)
        log.info("session %s: viewer %s joined (%s)", self.session_id, viewer.viewer_id, codec)
        if self.ended:
            track.finish()
        return viewer, answer

    def _watch(self, viewer: Viewer) -> None:
        @viewer.pc.on("connectionstatechange")
        async def on_state() -> None:
            state = viewer.pc.connectionState
            if state == "connected":
                viewer.connected = True
            elif state in ("failed", "closed"):
                await self.remove(viewer.viewer_id)

        async def expire() -> None:
            await asyncio.sleep(_CONNECT_TIMEOUT_S)
            if not viewer.connected:
                log.info("session %s: viewer %s never connected; closing", self.session_id, viewer.viewer_id)
                await self.remove(viewer.viewer_id)

        asyncio.get_running_loop().create_task(expire())

    async def remove(self, viewer_id: str) -> bool:
        viewer = self.viewers.pop(viewer_id, None)
        if viewer is None:
            return False
        metrics.VIEWERS.dec()
        viewer.track.finish()
        await viewer.pc.close()
        log.info("session %s: viewer %s left", self.session_id, viewer_id)
        if self._decoder is not None and not any(v.codec == VP8 for v in self.viewers.values()):
            self._decoder.close()
            self._decoder = None
        return True

    # ---- LiveConsumer --------------------------------------------------------------------------
    def offer(self, packet: LivePacket) -> None:
        if not self.viewers:
            return
        rtp = av.Packet(packet.packet.data)
        rtp.pts = rtp.dts = round(packet.live_s / RTP_TIME_BASE)
        rtp.time_base = RTP_TIME_BASE
        wants_frames = False
        for viewer in list(self.viewers.values()):
            if viewer.codec == VP8:
                wants_frames = True
                continue
            track = viewer.track
            dropped_before = track.gate.dropped
            if track.put_packet(rtp, packet.packet.keyframe):
                self.stats.count_sent(self.name)
            self.stats.count_drop(self.name, track.gate.dropped - dropped_before)
        if wants_frames:
            self._decode_for_vp8(packet)

    def _decode_for_vp8(self, packet: LivePacket) -> None:
        if self._decoder is None:
            self._decoder = _SharedDecoder(self.session_id)
        future = self._decoder.decode(packet)
        if future is None:
            return

        def deliver(done: asyncio.Future[list[av.VideoFrame]]) -> None:
            if done.cancelled() or done.exception() is not None:
                log.warning("session %s: decoding for VP8 viewers failed: %s", self.session_id, done.exception())
                return
            for frame in done.result():
                for viewer in list(self.viewers.values()):
                    if viewer.codec == VP8:
                        if viewer.track.put_frame(frame):
                            self.stats.count_sent(self.name)
                        else:
                            self.stats.count_drop(self.name)

        future.add_done_callback(deliver)

    def end(self) -> None:
        """The session's video is over: every viewer's track ends (the browser sees the stream stop),
        and the connections are closed a little later (the page learns the end from the status API)."""
        self.ended = True
        for viewer in self.viewers.values():
            viewer.track.finish()

        async def hang_up() -> None:
            await asyncio.sleep(_LINGER_S)
            for viewer_id in list(self.viewers):
                await self.remove(viewer_id)

        self._hang_up = asyncio.get_running_loop().create_task(hang_up())

    async def close(self) -> None:
        """Disconnect everyone (shutdown)."""
        if not self.ended:
            self.end()
        if self._hang_up is not None:
            self._hang_up.cancel()
        for viewer_id in list(self.viewers):
            await self.remove(viewer_id)
        if self._decoder is not None:
            self._decoder.close()
            self._decoder = None


def _sent_codec(answer_sdp: str) -> str:
    """The codec the answer will send: the first one of its video section."""
    for media in SessionDescription.parse(answer_sdp).media:
        if media.kind == "video" and media.rtp.codecs:
            return media.rtp.codecs[0].name.upper()
    raise BadOffer("no video codec could be negotiated")
