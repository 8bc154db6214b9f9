"""The worker service's settings (from `python -m workers`'s flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class WorkerConfig:
    worker_id: str
    kvcache_address: str
    kv_pages: int
    # How its model folder changes the model's preset (`inferix.spec.served.model_settings`), registered
    # with kvcache_svc so that the scheduler sizes sessions by the preset this worker runs.
    model_settings: str = ""
    heartbeat_interval_s: float = 2.0
    # torch CPU threads of the engine thread, the only thread of the worker with more than one (see
    # `workers.engine_host`; 0: torch's default, every core).
    threads: int = 0
    # Write a profiler report (every block of every session, engine regions) here on shutdown.
    profile_dir: Path | None = None
    # Token rows per batched forward at most (continuous batching across sessions); 0: by device.
    max_batch_tokens: int = 0
    # At startup, measure block latency with 1, 2, 4, ... probe sessions up to this many (0: no probe;
    # the capacity is then learnt from the blocks served).
    capacity_probe_streams: int = 8
    # Claim this many real-time streams per resolution instead of the measured number (0: measured).
    realtime_streams: int = 0
    # Compile the DiT step (torch.compile) and warm it up at the native resolution before serving.
    compile: bool = False
    # Replay the DiT step from CUDA graphs captured at the native resolution before serving.
    cuda_graphs: bool = False
    # KV cache storage: "auto" (the model's dtype), "fp8" or "int8" (see `KVPoolSpec.kv_dtype`).
    kv_dtype: str = "auto"
    # KV snapshots to kvcache_svc every N blocks (`--snapshot-every`, see `workers.snapshots`): None for
    # the cost model's N, 0 for none.
    snapshot_every: int | None = None
    # A snapshot larger than this ships in pieces of this size (under the 64 MiB a gRPC message carries here).
    snapshot_piece_bytes: int = 16 * 2**20
