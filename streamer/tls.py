"""HTTPS for the streamer's HTTP server (viewer page, WHEP, page API), following rotated certificate files.

The listening context's SNI callback runs at the start of every handshake (with or without SNI): it
compares the files' (inode, size, mtime) and, when they changed, loads the pair into a fresh context
that this and every later handshake use, so a rotated certificate (a Kubernetes Secret update swaps a
symlink) is served without a restart. A pair that does not load (half-written, key not matching) is
not taken: the last good one stays, with one warning per bad pair, as the scheduler does.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

log = logging.getLogger("inferix.streamer.tls")

Stamp = tuple[tuple[int, int, int], ...]


class ReloadingTls:
    """The server SSLContext for `cert`/`key`; SystemExit when they do not load at startup."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self._refused: Stamp | None = None
        try:
            self._stamp = self._stat()
            self._current = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"error: TLS certificate {cert} / key {key}: {exc}") from None
        # The listening context: its callback hands each handshake `_current` (its own pair is the first one).
        self.context = self._load()
        self.context.sni_callback = self._on_hello

    def _stat(self) -> Stamp:
        stats = (os.stat(self.cert), os.stat(self.key))  # follows symlinks: the files as served
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def refresh(self) -> ssl.SSLContext:
        """The context new handshakes use: reloaded when the files changed and the new pair loads."""
        try:
            stamp = self._stat()
            if stamp in (self._stamp, self._refused):
                return self._current
            self._refused = stamp
            self._current = self._load()
            self._stamp = stamp
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "TLS certificate %s / key %s not reloaded (keeping the current one): %s", self.cert, self.key, exc
            )
            return self._current
        log.info("TLS certificate reloaded from %s", self.cert)
        return self._current

    def _on_hello(self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        connection.context = self.refresh()
