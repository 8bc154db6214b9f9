"""kvcache_svc: where sessions run and where their state lives -- placement, KV tiers, committed blocks.

It owns three things: placement (the worker registry and admission: which worker has room for a
session), the KV tiers (when a session's pages go to host memory and back: the offload decisions;
workers do the copying), and committed-block storage (the clean latents another worker rebuilds a
session from). KV pages themselves stay in the workers' pools.

Workers register their KV pool and heartbeat its usage; the scheduler asks `Admit` for a worker
with room for a session and `Release`s it when the session ends; workers commit each block's
clean latents so another worker can rebuild a session's KV cache by recompute after a failure.
All state lives in an `inferix.store.Store` (memory by default, Redis with `--redis-url`), so a
restarted kvcache_svc on the same Redis continues where the previous one stopped.

    python -m kvcache_svc --port 50053 --redis-url redis://127.0.0.1:6379/0
"""
