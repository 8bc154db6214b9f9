"""The Worker service, assembled from its parts (one job each):

- `workers.config`: its settings; `workers.engine_host`: the engine, its lock and its thread;
- `workers.batch_pump`: continuous batching of every session's block jobs;
- `workers.blocks`: a session's blocks as a pipeline (queued, computed, published, committed, answered);
- `workers.publish`: frames to the streamer, backfill of a restarted one;
- `workers.kvcache_link`: commits, committed-block reads, registration and heartbeats;
- `workers.capacity_probe` and `workers.capacity`: the real-time capacity claimed for admission;
- `workers.rpc`: the RPCs, restore, offload and drain.
"""

from workers.config import WorkerConfig
from workers.rpc import SERVICE_NAME, WorkerService, add_to_server, describe_device

__all__ = ["SERVICE_NAME", "WorkerConfig", "WorkerService", "add_to_server", "describe_device"]
