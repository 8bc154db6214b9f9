"""WebRTC viewers over WHEP against a real streamer process, with aiortc as the viewer, and the HTTP errors.

aiortc on the test side is a real, independent WebRTC stack (its own ICE, DTLS, SRTP, RTP depacketizer
and decoder), so a frame it decodes went through the whole path. Chromium plays the page in
tests/mesh/test_viewer.py.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import av
import grpc
import pytest
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.viewer_token import ViewerTokens
from inferix_cli.mesh.launch import ServiceProcess
from tests.streamer.live import SECRET, RealtimePusher, SchedulerLink, start_live_streamer, stream_info, wait_until
from tests.streamer.media import Video

TOKENS = ViewerTokens(SECRET.encode())


@dataclass
class Rig:
    streamer: ServiceProcess
    http: str
    stub: streamer_pb2_grpc.StreamerServiceStub
    link: SchedulerLink


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    streamer, http_port = start_live_streamer(tmp_path_factory.mktemp("viewers"))
    channel = grpc.insecure_channel(streamer.address)
    link = SchedulerLink(channel)  # no scheduler address: commands have nowhere to go
    try:
        yield Rig(streamer, f"http://127.0.0.1:{http_port}", streamer_pb2_grpc.StreamerServiceStub(channel), link)
    finally:
        link.close()
        channel.close()
        code = streamer.stop()
    assert code == 0, f"streamer exited with {code}:\n{streamer.log_tail()}"


@dataclass
class Watched:
    codec: str  # what the server said it sends (X-Inferix-Codec)
    frames: int  # frames the viewer decoded
    size: tuple[int, int]
    location: str


async def watch(
    base: str,
    session_id: str,
    codec: str | None,
    min_frames: int,
    timeout: float = 15.0,
    tls: ssl.SSLContext | None = None,
) -> Watched:
    """One aiortc viewer: WHEP offer (optionally offering only `codec`), decode until `min_frames`, hang up;
    `tls` verifies an https:// `base`."""
    pc = RTCPeerConnection()
    transceiver = pc.addTransceiver("video", direction="recvonly")
    if codec is not None:
        capabilities = RTCRtpReceiver.getCapabilities("video")
        assert capabilities is not None
        wanted = (f"video/{codec}", "video/rtx")
        transceiver.setCodecPreferences([c for c in capabilities.codecs if c.mimeType in wanted])
    decoded: list[tuple[int, int]] = []
    got_enough = asyncio.Event()

    async def consume(track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.VideoFrame)
                decoded.append((frame.width, frame.height))
                if len(decoded) >= min_frames:
                    got_enough.set()
        except MediaStreamError:
            got_enough.set()

    pc.on("track", lambda track: asyncio.ensure_future(consume(track)))
    await pc.setLocalDescription(await pc.createOffer())
    headers = {"Authorization": f"Bearer {TOKENS.mint(session_id)}", "Content-Type": "application/sdp"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls or True)) as http:
        async with http.post(f"{base}/whep/{session_id}", data=pc.localDescription.sdp, headers=headers) as reply:
            answer = await reply.text()
            assert reply.status == 201, answer
            location, sent = reply.headers["Location"], reply.headers["X-Inferix-Codec"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        try:
            await asyncio.wait_for(got_enough.wait(), timeout)
        finally:
            async with http.delete(f"{base}{location}", headers=headers) as bye:
                assert bye.status == 200
            await pc.close()
    return Watched(sent, len(decoded), decoded[-1] if decoded else (0, 0), location)


def test_many_viewers_of_one_session_h264_without_reencode_and_vp8_fallback(rig: Rig) -> None:
    video = Video("watched", 160, 96, 16.0, (8,) * 16)
    rig.link.announce(video.session_id)
    pusher = RealtimePusher(rig.stub, video).start()

    async def two_viewers() -> tuple[Watched, Watched]:
        h264, vp8 = await asyncio.gather(
            watch(rig.http, video.session_id, None, 12),  # offers everything: gets H.264
            watch(rig.http, video.session_id, "VP8", 12),  # a browser without H.264
        )
        return h264, vp8

    try:
        h264, vp8 = asyncio.run(two_viewers())
    finally:
        pusher.stop()
    assert (h264.codec, vp8.codec) == ("H264", "VP8")
    assert h264.frames >= 12 and vp8.frames >= 12 and h264.size == vp8.size == (160, 96)
    assert h264.location != vp8.location
    live = stream_info(rig.stub, video.session_id).live
    assert live.frames_sent["webrtc"] >= 24 and live.viewers == 0  # both hung up (DELETE)
    pusher.join()


def request(
    method: str, url: str, token: str | None = None, body: bytes = b"", content_type: str = "application/sdp"
) -> tuple[int, str]:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    call = urllib.request.Request(url, data=body or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_bad_viewer_requests_are_refused_with_the_reason(rig: Rig) -> None:
    video = Video("guarded", 64, 48, 16.0, (4,))
    assert rig.stub.PushFrames(video.block(0), timeout=30).accepted == 4
    whep = f"{rig.http}/whep/{video.session_id}"
    token = TOKENS.mint(video.session_id)
    sdp_audio_only = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    cases: dict[str, tuple[tuple[int, str], int, str]] = {
        "no token": (request("POST", whep, None, b"v=0"), 403, "a viewer token is required"),
        "another session's token": (request("POST", whep, TOKENS.mint("other")), 403, "not valid for this session"),
        "expired token": (
            request("POST", whep, TOKENS.mint(video.session_id, now=time.time() - TOKENS.ttl_s - 60), b"v=0"),
            403,
            "expired",
        ),
        "forged token": (request("POST", whep, "99999999999.AAAA", b"v=0"), 403, "not valid"),
        "unknown session": (request("POST", f"{rig.http}/whep/nope", TOKENS.mint("nope"), b"v=0"), 404, "no session"),
        "not SDP": (request("POST", whep, token, b"hello"), 400, "must start with 'v=0'"),
        "empty offer": (request("POST", whep, token, b""), 400, "it is empty"),
        "garbled SDP": (request("POST", whep, token, b"v=0\r\nm=video x y\r\n"), 400, "could not be parsed"),
        "no video": (request("POST", whep, token, sdp_audio_only.encode()), 400, "no video section"),
        "wrong type": (request("POST", whep, token, b"v=0", "text/plain"), 415, "application/sdp"),
        "trickle ICE": (request("PATCH", f"{whep}/abc", token, b"x"), 405, "trickle ICE is not supported"),
        "unknown viewer": (request("DELETE", f"{whep}/abc", token), 404, "no such viewer"),
        "api without token": (request("GET", f"{rig.http}/api/sessions/{video.session_id}"), 403, "required"),
        "command, no scheduler": (
            request("POST", f"{rig.http}/api/sessions/{video.session_id}/pause", token),
            503,
            "no scheduler is known",
        ),
        "bad prompt body": (
            request("POST", f"{rig.http}/api/sessions/{video.session_id}/prompt", token, b"[1]", "application/json"),
            400,
            '{\\"text\\": ',
        ),
    }
    for name, ((status, body), expected_status, reason) in cases.items():
        assert status == expected_status, (name, status, body)
        assert reason in body, (name, body)

    assert rig.stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=video.session_id), timeout=30).frames == 4
    wait_until(lambda: request("POST", whep, token, b"v=0")[0] == 410, 5, "the live end")
    assert "has ended" in request("POST", whep, token, b"v=0")[1]
    # the stream itself is untouched by all of the above
    info = stream_info(rig.stub, video.session_id)
    assert info.finished and info.frames == 4


def test_viewer_page_and_status_api_are_served(rig: Rig) -> None:
    status, page = request("GET", f"{rig.http}/watch/some-session")
    assert status == 200 and "<video" in page and "/static/viewer.js" in page
    status, script = request("GET", f"{rig.http}/static/viewer.js")
    assert status == 200 and "/whep/" in script and "requestVideoFrameCallback" in script
    assert request("GET", f"{rig.http}/static/../service.py")[0] == 404
    video = Video("status", 64, 48, 16.0, (8,))
    rig.link.announce(video.session_id, created_at=time.time())
    assert rig.stub.PushFrames(video.block(0), timeout=30).accepted == 8
    wait_until(lambda: stream_info(rig.stub, video.session_id).live.frames_out == 8, 5, "the frames out")
    status, body = request("GET", f"{rig.http}/api/sessions/{video.session_id}", TOKENS.mint(video.session_id))
    assert status == 200, body
    stream = json.loads(body)["stream"]
    assert (stream["width"], stream["height"], stream["fps"], stream["frames_in"]) == (64, 48, 16.0, 8)
    assert stream["rtmp"]["state"] == "off" and stream["time_to_first_frame_ms"] is not None
    assert json.loads(body)["session"]["state"] == "unknown"  # no scheduler linked: only the stream part


def _get_bytes(url: str, token: str | None, byte_range: str = "") -> tuple[int, bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if byte_range:
        headers["Range"] = byte_range
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_recording_is_served_over_http_with_the_viewer_token(rig: Rig) -> None:
    video = Video("http-recording", 64, 48, 16.0, (3, 3))
    url = f"{rig.http}/recordings/{video.session_id}.mp4"
    token = TOKENS.mint(video.session_id)
    rig.stub.PushFrames(video.block(0), timeout=30)
    status, body, _ = _get_bytes(url, token)
    assert status == 409 and b"is still going: its recording is ready once it ends" in body
    rig.stub.PushFrames(video.block(1), timeout=30)
    rig.stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=video.session_id), timeout=30)

    status, mp4, headers = _get_bytes(url, token)
    assert status == 200 and headers["Content-Type"] == "video/mp4", (status, mp4[:200])
    over_grpc = b"".join(
        r.chunk for r in rig.stub.GetRecording(streamer_pb2.GetRecordingRequest(session_id=video.session_id))
    )
    assert mp4 == over_grpc  # the same file as GetRecording
    status, part, headers = _get_bytes(url, token, "bytes=0-99")  # a player seeks with ranges
    assert status == 206 and part == mp4[:100] and headers["Content-Range"] == f"bytes 0-99/{len(mp4)}"

    assert _get_bytes(url, None)[0] == 403
    assert _get_bytes(url, TOKENS.mint("another-session"))[0] == 403  # a token is for its own session only
    missing = f"{rig.http}/recordings/never-pushed.mp4"
    assert _get_bytes(missing, TOKENS.mint("never-pushed"))[0] == 404
