"""WebRTC viewers through a real TURN server (coturn, started by the test with a REST shared secret).

The streamer hands each viewer short-lived TURN credentials as WHEP `Link` headers; the viewer page
in headless Chromium, told to take relayed paths only (`#transport=relay`), plays the session
through coturn, and coturn refuses credentials made with another secret or past their expiry.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aioice.ice import get_host_addresses
from aioice.stun import TransactionFailed
from aioice.turn import create_turn_endpoint
from playwright.sync_api import sync_playwright

from streamer.__main__ import main
from streamer.ice import IceServers, turn_password
from tests.mesh.test_viewer import CHROMIUM, CHROMIUM_FLAGS, viewer, wait_for
from tests.parallel.pod import free_port
from tests.streamer.live import playing, start_live_streamer
from tests.streamer.media import Video
from tests.streamer.test_viewers import TOKENS

TURNSERVER = "/usr/bin/turnserver"
TURN_SECRET = "test-turn-secret-0123456789"


@dataclass
class Coturn:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"turn:127.0.0.1:{self.port}?transport=udp"


@pytest.fixture(scope="module")
def coturn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Coturn]:
    if shutil.which(TURNSERVER) is None:
        pytest.fail(f"{TURNSERVER} is missing: the TURN test needs Debian's coturn (make system-deps)")
    folder = tmp_path_factory.mktemp("coturn")
    port = free_port()
    # Relayed addresses on the interface the streamer's own (host) candidates use.
    relay_ip = get_host_addresses(use_ipv4=True, use_ipv6=False)[0]
    log = folder / "turnserver.log"
    args = [
        TURNSERVER, "-n", "--listening-ip", "127.0.0.1", "--listening-port", str(port), "--relay-ip", relay_ip,
        "--min-port", "49160", "--max-port", "49400", "--use-auth-secret", "--static-auth-secret", TURN_SECRET,
        "--realm", "inferix.test", "--verbose", "--no-tls", "--no-dtls", "--no-cli", "--fingerprint", "--no-stdout-log",
        "--log-file", str(log), "--simple-log", "--pidfile", str(folder / "turnserver.pid"),
        "--userdb", str(folder / "turndb"),
    ]  # fmt: skip
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:  # its TCP listener on the same port: up once it accepts
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert process.poll() is None, f"turnserver exited: {log.read_text() if log.exists() else ''}"
            assert time.monotonic() < deadline, "turnserver did not start listening within 15 s"
            time.sleep(0.1)
    yield Coturn(process, port, log)
    process.terminate()
    process.wait(10)


async def _allocate(port: int, username: str, password: str) -> tuple[str, int]:
    """A TURN allocation with these credentials; returns the relayed address."""
    transport, _ = await create_turn_endpoint(
        asyncio.DatagramProtocol, ("127.0.0.1", port), username=username, password=password
    )
    try:
        relayed: tuple[str, int] = transport.get_extra_info("sockname")
        return relayed
    finally:
        transport.close()


def test_turn_credentials_are_short_lived_and_bound_to_the_secret(coturn: Coturn) -> None:
    servers = IceServers.parse([coturn.url], TURN_SECRET, ttl_s=600)
    (server,) = servers.issue("session-1")
    assert server.username is not None and server.credential is not None
    assert re.fullmatch(r"\d+:session-1", server.username)
    assert abs(int(server.username.split(":")[0]) - (time.time() + 600)) < 5
    relayed = asyncio.run(_allocate(coturn.port, server.username, server.credential))
    assert relayed[1] >= 49160

    forged = turn_password(b"another-secret", server.username)
    with pytest.raises(TransactionFailed, match="401"):
        asyncio.run(_allocate(coturn.port, server.username, forged))
    (expired,) = servers.issue("session-1", now=time.time() - 3600)  # expired 50 minutes ago
    assert expired.username is not None and expired.credential is not None
    with pytest.raises(TransactionFailed, match="401"):
        asyncio.run(_allocate(coturn.port, expired.username, expired.credential))


def _options(url: str, token: str | None) -> tuple[int, list[str]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, method="OPTIONS", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get_all("Link") or []
    except urllib.error.HTTPError as error:
        return error.code, []


def test_viewer_page_plays_through_turn_only(coturn: Coturn, tmp_path_factory: pytest.TempPathFactory) -> None:
    ice = ["--ice-server", coturn.url, "--turn-credential-ttl-s", "600"]
    streamer, port = start_live_streamer(
        tmp_path_factory.mktemp("turn"), extra=ice, env={"INFERIX_TURN_SECRET": TURN_SECRET}
    )
    video = Video("turn-page", 160, 96, 16.0, (8,) * 40)
    token = TOKENS.mint(video.session_id)
    whep = f"http://127.0.0.1:{port}/whep/{video.session_id}"
    with playing(streamer, video):
        status, links = _options(whep, token)  # WHEP's ICE server discovery, before the offer
        assert status == 204 and len(links) == 1, links
        assert links[0].startswith(f'<{coturn.url}>; rel="ice-server"; username="')
        assert 'credential-type="password"' in links[0] and TURN_SECRET not in links[0]
        assert _options(whep, None) == (204, [])  # a CORS preflight: no servers without the token
        assert _options(whep, "not-a-token")[0] == 403

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/watch/{video.session_id}#token={token}&transport=relay")
            wait_for(page, "inferixViewer.framesDecoded >= 8 && inferixViewer.path !== null", timeout=30_000)
            state = viewer(page)
            assert state["error"] in (None, ""), state
            assert page.evaluate("inferixViewer.path") == "relay"
            assert page.evaluate("inferixViewer.iceServers") == 1
            assert page.text_content("#stat-path") == "relayed (TURN)"
            browser.close()
    log = coturn.log.read_text()
    # coturn saw this session's viewer allocate a relay with its REST credentials
    allocated = rf"user <\d+:{video.session_id}>: incoming packet ALLOCATE processed, success"
    assert re.search(allocated, log), log[-3000:]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ice-server", "turn:turn.example.com:3478"], "a TURN server needs its shared secret"),
        (["--ice-server", "http://turn.example.com"], "expected a STUN or TURN URL"),
        (["--ice-server", "turn:"], "expected a STUN or TURN URL"),
        (["--ice-server", 'stun:a.example.com:3478>; rel="x"'], "may not contain"),
        (["--ice-server", "stun:a.example.com", "--turn-credential-ttl-s", "5"], "at least 60"),
    ],
)
def test_bad_ice_settings_stop_the_streamer_with_the_reason(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INFERIX_TURN_SECRET", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["--data-dir", str(tmp_path), "--http-port", "0", *args])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_stun_servers_need_no_secret_and_get_no_credentials() -> None:
    servers = IceServers.parse(["stun:stun.example.com:3478"], None)
    assert [s.link_header() for s in servers.issue("s1")] == ['<stun:stun.example.com:3478>; rel="ice-server"']
