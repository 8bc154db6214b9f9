"""Errors of the KV cache."""

from inferix.errors import InferixError


class KVCapacityError(InferixError, RuntimeError):
    """The pool (or its host tier) has no room for the pages a session asked for.

    Raised before anything is written, so the pool and every session stay consistent.
    """


class KVOrderError(InferixError, ValueError):
    """A session wrote frames out of order (neither the next frames nor a rewrite of the last)."""
