"""Per-session viewer tokens: what lets a web page watch and steer one session, and nothing else.

The scheduler mints a token when it creates a session and puts it in `PlaybackUrls.webrtc_page`
(in the URL fragment, so it never reaches a server log or a Referer header). The viewer page sends
it as `Authorization: Bearer <token>` to the streamer, which checks it with the same secret (no
call to the scheduler, no shared state) and forwards viewer commands to the scheduler with the token
attached, where it is checked again and scoped to that one session. The token is an HMAC over the
session id and an expiry, so it cannot be moved to another session, outlive its expiry or be forged
without the secret; rotating the secret revokes every token.

Format: `<expiry unix seconds>.<base64url HMAC-SHA256(secret, "inferix-viewer-v1|<session>|<expiry>")>`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from pathlib import Path

from inferix.errors import UserError

SECRET_ENV = "INFERIX_VIEWER_SECRET"
MIN_SECRET_BYTES = 16
DEFAULT_TTL_S = 7 * 24 * 3600.0  # a long-running world can be watched for a week with one link
_DOMAIN = b"inferix-viewer-v1"


class InvalidViewerToken(Exception):
    """The token is missing, malformed, expired or for another session; the message says which."""


def _signature(secret: bytes, session_id: str, expires: int) -> str:
    message = b"|".join((_DOMAIN, session_id.encode(), str(expires).encode()))
    digest = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class ViewerTokens:
    """Mints and checks viewer tokens with one secret (shared by the scheduler and the streamer)."""

    secret: bytes
    ttl_s: float = DEFAULT_TTL_S

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_SECRET_BYTES:
            raise UserError(f"the viewer secret must be at least {MIN_SECRET_BYTES} bytes, got {len(self.secret)}")

    def mint(self, session_id: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl_s)
        return f"{expires}.{_signature(self.secret, session_id, expires)}"

    def verify(self, token: str, session_id: str, now: float | None = None) -> None:
        """Return if `token` lets its bearer view `session_id`; raise `InvalidViewerToken` otherwise."""
        if not token:
            raise InvalidViewerToken("a viewer token is required: open the session's webrtc_page URL")
        expires_text, dot, signature = token.partition(".")
        if not dot or not expires_text.isdigit() or not signature:
            raise InvalidViewerToken("the viewer token is malformed")
        expected = _signature(self.secret, session_id, int(expires_text))
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise InvalidViewerToken("the viewer token is not valid for this session")
        if int(expires_text) < (time.time() if now is None else now):
            raise InvalidViewerToken("the viewer token has expired; get the session's webrtc_page URL again")


def bearer_token(header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header ('' when absent or another scheme)."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def load_viewer_tokens(path: Path | None, env: str | None = None) -> ViewerTokens | None:
    """The tokens configured by `--viewer-secret-file` or `$INFERIX_VIEWER_SECRET` (None: viewers are off)."""
    if path is not None:
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise UserError(f"{path}: cannot read the viewer secret ({exc.strerror})") from exc
    else:
        secret = (os.environ.get(SECRET_ENV, "") if env is None else env).strip().encode()
    return ViewerTokens(secret) if secret else None


# gRPC metadata key carrying a viewer token from the streamer to the scheduler (instead of an API key).
METADATA_KEY = "x-inferix-viewer-token"
