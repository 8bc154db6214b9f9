"""API-key authentication: `authorization: Bearer <key>` metadata, keys from a file or env, each
with its quota (`scheduler.quotas`).

Key file: one key per line, then optionally its name and quota settings; `#` starts a comment::

    key-a-0123456789abcdef alice sessions=4 blocks_per_hour=50000
    sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 bob
    * sessions=8 blocks_per_session=20000      # the defaults of every key

A key may be given as `sha256:<hex digest>` instead of itself, so the file (or Secret) need not
hold usable keys. Keys are kept only as digests in memory. With no keys configured the server is
open (the local default), every caller is the principal "anonymous", and only the stream limits
(`streams`, `commands_per_second`) apply.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from inferix.errors import UserError
from scheduler.quotas import OPEN_SERVER, Quota, Quotas

ANONYMOUS = "anonymous"
HASHED = re.compile(r"sha256:([0-9a-f]{64})")


class Unauthenticated(Exception):
    pass


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class ApiKeys:
    digests: dict[bytes, str]  # sha256 of a key -> principal name
    quotas: Quotas = field(default_factory=Quotas)

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    @property
    def principals(self) -> set[str]:
        return set(self.digests.values())

    @classmethod
    def load(cls, path: Path | None, env: str | None = None) -> ApiKeys:
        digests: dict[bytes, str] = {}
        settings: dict[str, tuple[list[str], str]] = {}
        defaults: tuple[list[str], str] = ([], "")
        if path is not None:
            try:
                lines = path.read_text().splitlines()
            except OSError as exc:
                raise UserError(f"{path}: cannot read the API key file ({exc.strerror})") from exc
            for number, line in enumerate(lines, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                where = f"{path}:{number}"
                if words[0] == "*":
                    defaults = (words[1:], where)
                    continue
                key, rest = words[0], words[1:]
                name = rest.pop(0) if rest and "=" not in rest[0] else f"key{number}"
                digests[_digest_of(key, where)] = name
                settings[name] = (rest, where)
        for i, key in enumerate(filter(None, (env or os.environ.get("INFERIX_API_KEYS", "")).split(","))):
            digests[_digest_of(key.strip(), f"INFERIX_API_KEYS entry {i}")] = f"env{i}"
        try:
            default = Quota.parse(defaults[0], Quota(), defaults[1]) if defaults[1] else Quota()
            limits = {name: Quota.parse(words, default, where) for name, (words, where) in settings.items()}
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return cls(digests, Quotas(limits, default if digests else OPEN_SERVER))

    def principal(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> str:
        """The caller's principal, or Unauthenticated with the reason."""
        if not self.enabled:
            return ANONYMOUS
        header = next((str(v) for k, v in (metadata or ()) if k == "authorization"), None)
        if header is None:
            raise Unauthenticated("missing `authorization: Bearer <api key>` metadata")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("authorization metadata must be `Bearer <api key>`")
        offered = key_digest(token.strip())
        for digest, name in self.digests.items():
            if hmac.compare_digest(digest, offered):
                return name
        raise Unauthenticated("unknown API key")


def _digest_of(key: str, where: str) -> bytes:
    hashed = HASHED.fullmatch(key)
    if hashed:
        return bytes.fromhex(hashed.group(1))
    if key.startswith("sha256:"):
        raise UserError(f"{where}: a hashed key is sha256: and 64 lowercase hex digits")
    if len(key) < 16:
        raise UserError(f"{where}: API keys must be at least 16 characters")
    return key_digest(key)
