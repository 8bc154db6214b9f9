"""Paged KV cache: a pool of fixed-size pages, a page table per session, a host tier."""

from workers.engine.kv.contiguous import ContiguousKVCache
from workers.engine.kv.errors import KVCapacityError, KVOrderError
from workers.engine.kv.pool import KVPool, KVPoolSpec, PagedSessionCache, PoolUsage, SessionUsage
from workers.engine.kv.protocol import SelfAttentionCache

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
