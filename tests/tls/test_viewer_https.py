"""The viewer page plays over HTTPS in headless Chromium (Debian's, driven by Playwright as in
tests/mesh/test_viewer.py), served by a TLS streamer with a certificate of the test CA.

Chromium trusts the throwaway CA's certificate by pinning its public key
(`--ignore-certificate-errors-spki-list=<base64 SHA-256 of the SPKI>`; Playwright gives every launch a
--user-data-dir, which the flag needs) rather than through an NSS database: certutil (libnss3-tools)
is not part of the test image. The pin covers this one key only; without it the page is refused.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from tests.mesh.test_viewer import CHROMIUM, CHROMIUM_FLAGS, viewer, wait_for
from tests.streamer.live import playing, start_live_streamer
from tests.streamer.media import Video
from tests.streamer.test_viewers import TOKENS
from tests.tls.certs import spki_pin
from tests.tls.conftest import Pki


def test_viewer_page_plays_over_https_in_chromium(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> None:
    cert, key = pki.issue("viewer")
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    streamer, port = start_live_streamer(tmp_path_factory.mktemp("viewer-https"), extra=tls)
    video = Video("https-page", 160, 96, 16.0, (8,) * 40)
    page_url = f"https://127.0.0.1:{port}/watch/{video.session_id}#token={TOKENS.mint(video.session_id)}"
    with playing(streamer, video), sync_playwright() as playwright:
        untrusting = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
            untrusting.new_page().goto(page_url)
        untrusting.close()

        pinned = [*CHROMIUM_FLAGS, f"--ignore-certificate-errors-spki-list={spki_pin(cert)}"]
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=pinned, headless=True)
        page = browser.new_page()
        page.goto(page_url)
        assert page.evaluate("location.protocol") == "https:"
        wait_for(page, "inferixViewer.framesDecoded >= 8", timeout=30_000)
        first = viewer(page)
        assert first["codec"] in ("video/H264", "video/VP8") and first["error"] in (None, ""), first
        wait_for(page, f"inferixViewer.framesDecoded >= {int(first['decoded']) + 8}", timeout=30_000)
        browser.close()
