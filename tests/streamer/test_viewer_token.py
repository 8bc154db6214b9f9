"""Viewer tokens: bound to one session, expiring, unforgeable without the secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferix.errors import UserError
from inferix.viewer_token import InvalidViewerToken, ViewerTokens, bearer_token, load_viewer_tokens

SECRET = b"0123456789abcdef0123456789abcdef"


def test_a_token_opens_its_session_only() -> None:
    tokens = ViewerTokens(SECRET)
    token = tokens.mint("session-a", now=1000.0)
    tokens.verify(token, "session-a", now=1001.0)
    cases = {
        "not valid for this session": lambda: tokens.verify(token, "session-b", now=1001.0),
        "not valid for this session ": lambda: ViewerTokens(b"x" * 32).verify(token, "session-a", now=1001.0),
        "expired": lambda: tokens.verify(token, "session-a", now=1000.0 + tokens.ttl_s + 1),
        "malformed": lambda: tokens.verify("garbage", "session-a"),
        "required": lambda: tokens.verify("", "session-a"),
    }
    for reason, check in cases.items():
        with pytest.raises(InvalidViewerToken, match=reason.strip()):
            check()
    expires, _, signature = token.partition(".")
    with pytest.raises(InvalidViewerToken, match="not valid"):  # a later expiry cannot be grafted on
        tokens.verify(f"{int(expires) + 10**6}.{signature}", "session-a", now=1001.0)


def test_secrets_come_from_a_file_or_the_environment(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("file-secret-0123456789\n")
    assert load_viewer_tokens(tmp_path / "secret", env="") == ViewerTokens(b"file-secret-0123456789")
    assert load_viewer_tokens(None, env="env-secret-0123456789") == ViewerTokens(b"env-secret-0123456789")
    assert load_viewer_tokens(None, env="") is None
    with pytest.raises(UserError, match="at least 16 bytes"):
        load_viewer_tokens(None, env="short")
    with pytest.raises(UserError, match="cannot read"):
        load_viewer_tokens(tmp_path / "missing", env="")
    assert bearer_token("Bearer abc ") == "abc" and bearer_token("Basic abc") == "" and bearer_token(None) == ""
