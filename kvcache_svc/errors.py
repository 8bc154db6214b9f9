"""Errors of kvcache_svc's logic; the servicer maps each class to one gRPC status code.

They live apart from gRPC so that placement and the registry stay testable without a server.
"""

from __future__ import annotations

from inferix.errors import InferixError


class KVCacheError(InferixError):
    """Base class; the message is sent to the client verbatim, so it says what to do."""


class InvalidRequestError(KVCacheError):
    """The request itself is malformed (INVALID_ARGUMENT)."""


class NotFoundError(KVCacheError):
    """A worker, model or session the request names is unknown (NOT_FOUND)."""


class PreconditionError(KVCacheError):
    """The request is well-formed but conflicts with current state, e.g. a stale heartbeat
    sequence (FAILED_PRECONDITION)."""


class NoCapacityError(KVCacheError):
    """No alive worker has room (RESOURCE_EXHAUSTED): the caller may queue and retry.

    `reason` classifies the refusal for the metrics: "pages" (KV pages), "realtime" (real-time
    streams) or "unavailable" (no worker available at all)."""

    def __init__(self, message: str, reason: str = "pages") -> None:
        super().__init__(message)
        self.reason = reason


class AlreadyCommittedError(KVCacheError):
    """A block index is already committed with different content (ALREADY_EXISTS)."""


class BlocksDroppedError(PreconditionError):
    """The blocks asked for were dropped: the session's anchor snapshot covers them (FAILED_PRECONDITION)."""
