"""API-key authentication: `authorization: Bearer <key>` metadata, keys from a file or env.

Key file: one key per line, optionally `key name`; `#` starts a comment. With no keys configured
the server is open (the local default) and every caller is the principal "anonymous".
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from inferix.errors import UserError

ANONYMOUS = "anonymous"


class Unauthenticated(Exception):
    pass


@dataclass(frozen=True)
class ApiKeys:
    keys: dict[str, str]  # key -> principal name

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    @classmethod
    def load(cls, path: Path | None, env: str | None = None) -> ApiKeys:
        keys: dict[str, str] = {}
        if path is not None:
            try:
                lines = path.read_text().splitlines()
            except OSError as exc:
                raise UserError(f"{path}: cannot read the API key file ({exc.strerror})") from exc
            for number, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                key, _, name = line.partition(" ")
                if len(key) < 16:
                    raise UserError(f"{path}:{number}: API keys must be at least 16 characters")
                keys[key] = name.strip() or f"key{number}"
        for i, key in enumerate(filter(None, (env or os.environ.get("INFERIX_API_KEYS", "")).split(","))):
            keys[key.strip()] = f"env{i}"
        return cls(keys)

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
        for key, name in self.keys.items():
            if hmac.compare_digest(key.encode(), token.strip().encode()):
                return name
        raise Unauthenticated("unknown API key")
