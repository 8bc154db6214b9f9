"""Paged KV cache: a pool of fixed-size pages, a page table per session, a host tier."""

from engine.kv.contiguous import ContiguousKVCache
from engine.kv.errors import KVCapacityError, KVOrderError
from engine.kv.pool import KVPool, KVPoolSpec, PagedSessionCache, PoolUsage, SessionUsage
from engine.kv.protocol import SelfAttentionCache

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
