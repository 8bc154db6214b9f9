"""Downloading a session's MP4 from the streamer's HTTP(S) server (`https://.../recordings/<id>.mp4#token=...`).

The scheduler hands out that URL when the streamer serves the viewer page: the fragment is the
session's viewer token, sent as a Bearer token (never in the URL a server sees), and the download
goes over HTTPS whenever the page does, checked against the client's CA (`--ca`) or the system's roots.
"""

from __future__ import annotations

import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

CHUNK_BYTES = 1 << 20


class RecordingError(Exception):
    """The recording could not be fetched; the message says why and what to do. `server_away`: no
    answer from the server (refused, reset, 502-504 from a proxy): a restart may fix it by itself."""

    def __init__(self, message: str, server_away: bool = False) -> None:
        super().__init__(message)
        self.server_away = server_away


_RESTARTING_STATUS = (502, 503, 504)  # a proxy or ingress in front of a streamer that is away


def is_http(mp4_url: str) -> bool:
    return mp4_url.startswith(("http://", "https://"))


def download_http(mp4_url: str, path: Path, ca: bytes | None, timeout: float) -> Path:
    """GET the recording into `path` (through `path`.part, so a failed download leaves no partial file)."""
    url, _, fragment = mp4_url.partition("#")
    token = parse_qs(fragment).get("token", [""])[0]
    if not token:
        raise RecordingError(f"{url}: the recording URL carries no #token=... (use the URL the scheduler returned)")
    context = None
    if urlsplit(url).scheme == "https":
        context = ssl.create_default_context(cadata=ca.decode()) if ca else ssl.create_default_context()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    tmp = path.with_suffix(path.suffix + ".part")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response, tmp.open("wb") as out:
            shutil.copyfileobj(response, out, CHUNK_BYTES)
    except urllib.error.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        reason = exc.read().decode(errors="replace").strip() or exc.reason
        raise RecordingError(f"{url}: HTTP {exc.code}: {reason}", exc.code in _RESTARTING_STATUS) from None
    except (urllib.error.URLError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        away = isinstance(why, ConnectionError)  # refused, reset, aborted: the server is not (yet) there
        raise RecordingError(f"{url}: cannot download the recording: {why}", away) from None
    tmp.replace(path)
    return path


__all__ = ["RecordingError", "download_http", "is_http"]
