"""STUN / TURN servers for WebRTC viewers behind NAT (`--ice-server`, `INFERIX_TURN_SECRET`).

WebRTC media flows from the streamer to the browser over UDP. Without help it only connects where
the browser can reach the streamer's own addresses (host candidates); behind NAT a TURN server
relays it. The streamer hands the servers to each viewer in WHEP's way (RFC 9725, section 4.6):
`Link: <turn:...>; rel="ice-server"; username=...; credential=...` headers on an authorised
`OPTIONS` of the WHEP endpoint (before the offer, so the browser gathers relay candidates) and on the
201 answer; it uses the same servers for its own side of the connection.

TURN credentials are never static: each viewer gets a time-limited pair in the TURN REST scheme
that coturn checks with `use-auth-secret` / `static-auth-secret` (username `<expiry>:<label>`,
password base64 HMAC-SHA1 of the username under the shared secret), so a credential copied out of a
page stops working after `ttl_s`, and the secret itself never leaves the streamer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

from aiortc import RTCIceServer

SCHEMES = ("stun:", "stuns:", "turn:", "turns:")
DEFAULT_TTL_S = 3600


class IceConfigError(ValueError):
    """A bad --ice-server list or TURN secret; the message says what to change."""


@dataclass(frozen=True)
class IceServer:
    url: str
    username: str | None = None  # TURN only: time-limited, from the shared secret
    credential: str | None = None

    def link_header(self) -> str:
        """The server as one RFC 9725 `Link` header value."""
        value = f'<{self.url}>; rel="ice-server"'
        if self.username is not None and self.credential is not None:
            value += f'; username="{self.username}"; credential="{self.credential}"; credential-type="password"'
        return value

    def for_aiortc(self) -> RTCIceServer:
        return RTCIceServer(urls=self.url, username=self.username, credential=self.credential)


@dataclass(frozen=True)
class IceServers:
    """The configured servers; `issue` gives a viewer its own short-lived TURN credentials."""

    urls: tuple[str, ...] = ()
    secret: bytes | None = None
    ttl_s: int = DEFAULT_TTL_S

    @classmethod
    def parse(cls, urls: list[str], secret: str | None, ttl_s: int = DEFAULT_TTL_S) -> IceServers:
        for url in urls:
            if not url.startswith(SCHEMES) or len(url) <= len(url.split(":", 1)[0]) + 1:
                raise IceConfigError(
                    f"--ice-server {url!r}: expected a STUN or TURN URL such as turn:turn.example.com:3478"
                    "?transport=udp or stun:stun.example.com:3478"
                )
            if any(c in url for c in '<>"; \n'):
                raise IceConfigError(f"--ice-server {url!r}: the URL may not contain spaces, quotes, ';', '<' or '>'")
        turn = [url for url in urls if url.startswith(("turn:", "turns:"))]
        if turn and not secret:
            raise IceConfigError(
                f"--ice-server {turn[0]}: a TURN server needs its shared secret (env INFERIX_TURN_SECRET or "
                "--turn-secret-file; coturn's static-auth-secret): viewers get short-lived credentials made from it"
            )
        if ttl_s < 60:
            raise IceConfigError(
                f"--turn-credential-ttl-s must be at least 60 (a viewer's connection set-up), got {ttl_s}"
            )
        return cls(tuple(urls), secret.encode() if secret else None, ttl_s)

    def __bool__(self) -> bool:
        return bool(self.urls)

    def issue(self, label: str, now: float | None = None) -> list[IceServer]:
        """The servers with TURN credentials valid for `ttl_s` from `now`, named after `label` (a session id)."""
        expiry = int(now if now is not None else time.time()) + self.ttl_s
        username = f"{expiry}:{label}"
        servers = []
        for url in self.urls:
            if url.startswith(("turn:", "turns:")) and self.secret is not None:
                servers.append(IceServer(url, username, turn_password(self.secret, username)))
            else:
                servers.append(IceServer(url))
        return servers


def turn_password(secret: bytes, username: str) -> str:
    """The TURN REST password of `username`: base64 of HMAC-SHA1 under the shared secret (what coturn checks)."""
    return base64.b64encode(hmac.new(secret, username.encode(), hashlib.sha1).digest()).decode()


__all__ = ["DEFAULT_TTL_S", "IceConfigError", "IceServer", "IceServers", "turn_password"]
