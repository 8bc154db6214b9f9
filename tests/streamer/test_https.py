"""The streamer's HTTP server over real TLS (a throwaway CA, tests/tls/certs.py): the viewer page, the API
and WHEP over HTTPS, and a rotated certificate served without a restart. The gRPC port stays plaintext."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import streamer_pb2_grpc
from inferix_cli.mesh.launch import ServiceProcess
from streamer.__main__ import main
from tests.streamer.live import RealtimePusher, SchedulerLink, start_live_streamer
from tests.streamer.media import Video
from tests.streamer.test_viewers import watch
from tests.tls.certs import Authority, install_pair, serial_of, served_serial


@dataclass
class HttpsStreamer:
    process: ServiceProcess
    port: int
    ca: Authority
    folder: Path
    served: tuple[Path, Path]  # the files the streamer serves, rotated in place

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def trusting(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca.cert_path)


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsStreamer]:
    folder = tmp_path_factory.mktemp("https-pki")
    ca = Authority.create(folder, "ca")
    served = (folder / "tls.crt", folder / "tls.key")
    install_pair(*ca.issue(folder, "streamer"), into=served)
    tls = ["--tls-cert", str(served[0]), "--tls-key", str(served[1])]
    process, port = start_live_streamer(tmp_path_factory.mktemp("https"), extra=tls)
    yield HttpsStreamer(process, port, ca, folder, served)
    assert process.stop() == 0, process.log_tail()


def _get(url: str, context: ssl.SSLContext) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        return response.status, response.read().decode()


def test_page_api_and_whep_over_https_grpc_stays_plaintext(https: HttpsStreamer) -> None:
    assert _get(f"{https.base}/healthz", https.trusting()) == (200, "ok\n")
    status, page = _get(f"{https.base}/watch/s1", https.trusting())
    assert status == 200 and "<html" in page.lower()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"{https.base}/healthz", ssl.create_default_context())  # not a public CA: verified, refused
    with pytest.raises((ConnectionError, urllib.error.URLError)):
        urllib.request.urlopen(f"http://127.0.0.1:{https.port}/healthz", timeout=10)  # HTTPS only

    channel = grpc.insecure_channel(https.process.address)  # frames from workers: the mesh's plaintext port
    link = SchedulerLink(channel)
    try:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        video = Video("over-tls", 96, 64, 16.0, (8,) * 6)
        link.announce(video.session_id)
        pusher = RealtimePusher(stub, video).start()
        try:
            watched = asyncio.run(watch(https.base, video.session_id, None, 8, tls=https.trusting()))
        finally:
            pusher.stop()
        assert watched.frames >= 8 and watched.size == (96, 64)
        pusher.join()
    finally:
        link.close()
        channel.close()


def test_rotated_certificate_is_served_without_restart(https: HttpsStreamer) -> None:
    first = serial_of(https.served[0].read_bytes())
    assert served_serial("127.0.0.1", https.port) == first

    rotated = https.ca.issue(https.folder, "rotated")
    install_pair(*rotated, into=https.served)
    assert served_serial("127.0.0.1", https.port) == serial_of(rotated[0].read_bytes())
    assert _get(f"{https.base}/healthz", https.trusting())[0] == 200

    # Half a rotation (a new certificate, the old key) is refused: the last good pair is still served.
    third, _ = https.ca.issue(https.folder, "third")
    shutil.copyfile(third, https.served[0])
    assert served_serial("127.0.0.1", https.port) == serial_of(rotated[0].read_bytes())
    assert _get(f"{https.base}/healthz", https.trusting())[0] == 200
    assert "not reloaded (keeping the current one)" in https.process.log_path.read_text()
    install_pair(*rotated, into=https.served)  # whole again for the next test
    assert https.process.alive()


def test_a_streamer_without_its_certificate_does_not_start(tmp_path: Path) -> None:
    base = ["--data-dir", str(tmp_path / "recordings"), "--http-port", "0"]
    with pytest.raises(SystemExit) as exited:
        main([*base, "--tls-cert", str(tmp_path / "missing.crt"), "--tls-key", str(tmp_path / "missing.key")])
    assert "TLS certificate" in str(exited.value) and "missing.crt" in str(exited.value)
    with pytest.raises(SystemExit) as exited:
        main([*base, "--tls-cert", str(tmp_path / "only.crt")])  # no key: a usage error
    assert exited.value.code == 2
