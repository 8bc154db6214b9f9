"""Paged KV cache: a pool of fixed-size pages, a page table per session, a host tier."""

from engine.kv.contiguous import ContiguousKVCache
from engine.kv.errors import KVCapacityError, KVOrderError
from engine.kv.pool import KVPool, KVPoolSpec, PoolUsage
from engine.kv.protocol import SelfAttentionCache
from engine.kv.session_cache import PagedSessionCache, SessionUsage

__all__ = [
    "ContiguousKVCache",
    "KVCapacityError",
    "KVOrderError",
    "KVPool",
    "KVPoolSpec",
    "PagedSessionCache",
    "PoolUsage",
    "SelfAttentionCache",
    "SessionUsage",
]
