"""Hostile HTTP clients of the streamer get bounded, named refusals while the session plays on.

A streamer with small limits (flags and INFERIX_STREAMER_* env): huge and trickled bodies, trickled
headers (slowloris), malformed SDP, floods of commands and WHEP offers, one viewer too many, and a
client that never reads its answers.
Meanwhile an aiortc viewer (the session's owner watching) keeps decoding frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from inferix.api.v1 import streamer_pb2_grpc
from inferix_cli.mesh.launch import ServiceProcess
from streamer.limits import COMMANDS, OFFERS, HttpLimits, RateLimiter
from tests.streamer.live import RealtimePusher, SchedulerLink, start_live_streamer
from tests.streamer.media import Video
from tests.streamer.test_viewers import TOKENS, request

MAX_BODY = 4096
IDLE_S = 2.0
FLAGS = [
    "--max-body-bytes",
    str(MAX_BODY),
    "--offers-per-s",
    "1",
    "--body-timeout-s",
    "1",
    "--idle-timeout-s",
    str(IDLE_S),
]
ENV = {"INFERIX_STREAMER_COMMANDS_PER_S": "2", "INFERIX_STREAMER_MAX_VIEWERS": "1"}


@dataclass
class Limited:
    streamer: ServiceProcess
    http_port: int
    stub: streamer_pb2_grpc.StreamerServiceStub
    link: SchedulerLink

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Limited]:
    streamer, http_port = start_live_streamer(tmp_path_factory.mktemp("limits"), extra=FLAGS, env=ENV)
    channel = grpc.insecure_channel(streamer.address)
    link = SchedulerLink(channel)  # no scheduler address: well-formed commands end in 503, after the rate check
    try:
        yield Limited(streamer, http_port, streamer_pb2_grpc.StreamerServiceStub(channel), link)
    finally:
        link.close()
        channel.close()
        code = streamer.stop()
    assert code == 0, f"streamer exited with {code}:\n{streamer.log_tail()}"


class Owner:
    """The session's own viewer: one aiortc peer counting decoded frames until told to stop."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTransceiver("video", direction="recvonly")
        self.frames = 0

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def connect(self, base: str, session_id: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/sdp"}
        offer = await self.offer()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{base}/whep/{session_id}", data=offer, headers=headers) as reply,
        ):
            answer = await reply.text()
            assert reply.status == 201, answer
        self.pc.on("track", lambda track: asyncio.ensure_future(self._consume(track)))
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    async def _consume(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()
                self.frames += 1
        except MediaStreamError:
            return

    async def frames_after(self, count: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while self.frames < count:
            assert time.monotonic() < deadline, f"the owner's viewer stalled at {self.frames} frames"
            await asyncio.sleep(0.05)


async def _post(http: aiohttp.ClientSession, url: str, token: str, body: bytes | str, kind: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": kind}
    async with http.post(url, data=body, headers=headers) as reply:
        return reply.status, await reply.text()


def _raw(port: int, head: bytes, body: bytes) -> bytes:
    """Send `head` and `body` on a fresh connection and return what comes back before it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.split(b"\r\n\r\n", 1)[1]:
                break
        return answer


def test_bodies_over_the_size_or_time_limit_are_refused_by_name(limited: Limited) -> None:
    whep = f"{limited.http}/whep/sized"
    token = TOKENS.mint("sized")
    limited.link.announce("sized")
    huge = b"v=0\r\n" + b"a=x-padding:" + b"x" * (1 << 20) + b"\r\n"
    status, body = request("POST", whep, token, huge)
    assert status == 413 and f"larger than {MAX_BODY} bytes (--max-body-bytes)" in body, (status, body)
    status, body = request("POST", f"{limited.http}/api/sessions/sized/prompt", token, huge, "application/json")
    assert status == 413 and "--max-body-bytes" in body, (status, body)

    # No Content-Length (chunked): aiohttp stops reading at the limit.
    head = (
        f"POST /whep/sized HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/sdp\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = b"x" * 2048
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
    assert b" 413 " in _raw(limited.http_port, head, chunked).split(b"\r\n", 1)[0]

    # A body that never finishes arriving: 408 after --body-timeout-s, naming it.
    head = (
        f"POST /whep/sized HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/sdp\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = _raw(limited.http_port, head, b"v=0\r\n")
    assert b" 408 " in answer.split(b"\r\n", 1)[0] and b"(--body-timeout-s)" in answer, answer
    assert time.monotonic() - started < 5

    status, body = request("POST", whep, token, b"v=0\r\nm=video x y\r\n")
    assert status == 400 and "could not be parsed" in body


def _closed_after(sock: socket.socket, trickle: list[bytes], limit_s: float) -> float | None:
    """Send `trickle` a piece every 0.25 s until the server closes `sock`; seconds until it did (None: never
    within `limit_s`)."""
    started = time.monotonic()
    sock.settimeout(0.25)
    while time.monotonic() - started < limit_s:
        try:
            if trickle:
                sock.sendall(trickle.pop(0))
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
    return None


def test_trickled_headers_and_idle_connections_are_closed(limited: Limited) -> None:
    # Slowloris: a request line, then one header line every 0.25 s, the header never finished.
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as slow:
        lines = [b"GET /healthz HTTP/1.1\r\n"] + [b"X-Pad-%d: y\r\n" % i for i in range(80)]
        closed = _closed_after(slow, lines, 10 * IDLE_S)
        assert closed is not None and IDLE_S - 0.5 <= closed < IDLE_S + 2, closed
        assert request("GET", f"{limited.http}/healthz") == (200, "ok\n")  # others were served meanwhile
    # A keep-alive connection that asks once, then says nothing more.
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as idle:
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        closed = _closed_after(idle, [], 10 * IDLE_S)
        assert closed is not None and closed < IDLE_S + 2, closed
    # A client that keeps asking is not cut off: the deadline runs from its last answer.
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as busy:
        started = time.monotonic()
        while time.monotonic() - started < 2 * IDLE_S:
            busy.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert busy.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(IDLE_S / 4)


def test_floods_and_one_viewer_too_many_leave_the_owner_playing(limited: Limited) -> None:
    video = Video("flooded", 96, 64, 16.0, (8,) * 24)
    limited.link.announce(video.session_id)
    pusher = RealtimePusher(limited.stub, video).start()
    whep = f"{limited.http}/whep/{video.session_id}"
    commands = f"{limited.http}/api/sessions/{video.session_id}/pause"

    async def scenario() -> None:
        owner = Owner()
        await owner.connect(limited.http, video.session_id, TOKENS.mint(video.session_id))
        await owner.frames_after(8)
        flooder = TOKENS.mint(video.session_id, now=time.time() - 5)  # another viewer link to the session
        async with aiohttp.ClientSession() as http:
            answers = [await _post(http, commands, flooder, b"", "application/json") for _ in range(12)]
            limited_ = [body for status, body in answers if status == 429]
            assert len(limited_) >= 9, answers  # bursts of 2, refilling at 2 per second
            assert "at most 2 per second per viewer link (--commands-per-s)" in limited_[0]
            assert {status for status, _ in answers} <= {429, 503}  # the rest went on (no scheduler: 503)

            offers = [await _post(http, whep, flooder, await Owner().offer(), "application/sdp") for _ in range(3)]
            assert offers[0][0] == 503 and "already has 1 viewers (--max-viewers)" in offers[0][1], offers
            assert offers[1][0] == 429 and "(--offers-per-s)" in offers[1][1], offers
            bad = [await _post(http, whep, flooder, b"v=0\r\nm=video x y\r\n", "application/sdp") for _ in range(5)]
            assert all(status == 400 for status, _ in bad), bad  # malformed: refused, never counted as offers
        await owner.frames_after(owner.frames + 16)  # still playing after the floods
        await owner.pc.close()

    try:
        asyncio.run(scenario())
    finally:
        pusher.stop()
    pusher.join()


def _rss_kib(process: ServiceProcess) -> int:
    status = Path(f"/proc/{process.serving_pid or process.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def test_a_client_that_never_reads_does_not_hold_up_others(limited: Limited) -> None:
    token = TOKENS.mint("deaf")
    limited.link.announce("deaf")
    get = f"GET /api/sessions/deaf HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    before = _rss_kib(limited.streamer)
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as deaf:
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.settimeout(0.5)
        sent = 0
        with contextlib.suppress(TimeoutError):  # the server stops reading from it once its answers back up
            for _ in range(20000):  # pipelined requests whose answers are never read
                sent += deaf.send(get * 10)
        assert sent < 20000 * len(get) * 10, "the server read everything a non-reading client sent"
        started = time.monotonic()
        assert request("GET", f"{limited.http}/healthz") == (200, "ok\n")
        assert time.monotonic() - started < 2
        grown = _rss_kib(limited.streamer) - before
        assert grown < 32 * 1024, f"the streamer grew {grown} KiB holding a non-reading client's requests"
    assert limited.streamer.alive()


def test_rate_buckets_refill_per_key_and_stay_bounded() -> None:
    now = [0.0]
    limiter = RateLimiter(HttpLimits(commands_per_s=2, offers_per_s=0.5), clock=lambda: now[0])
    assert [limiter.allow(COMMANDS, "s", "a") for _ in range(3)] == [True, True, False]  # a burst of 2
    assert limiter.allow(COMMANDS, "s", "b") and limiter.allow(OFFERS, "s", "a")  # other keys and kinds: their own
    assert not limiter.allow(OFFERS, "s", "a")  # below 1 per second: one at a time
    now[0] = 0.5
    assert limiter.allow(COMMANDS, "s", "a") and not limiter.allow(COMMANDS, "s", "a")  # 2 per second: 1 per 0.5 s
    assert not limiter.allow(OFFERS, "s", "a")
    now[0] = 2.5
    assert limiter.allow(OFFERS, "s", "a")
    for i in range(10_000):  # many one-off viewer links: idle full buckets are dropped
        now[0] += 1.0
        limiter.allow(COMMANDS, "s", str(i))
    assert len(limiter._buckets) <= 4097
