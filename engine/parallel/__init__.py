"""Sequence parallelism for one worker pod: Ulysses, Ring (pass-KV, pass-Q) and their hybrid.

A 14B world model neither fits nor runs in real time on one GPU, so a pod of P ranks splits
every block's tokens over its devices and talks only inside self-attention. See README.md here
for the layout of tokens, heads and KV pages, the cost model and how to run a pod.
"""

from engine.parallel.context import SequenceParallel, ShardedAttentionCache
from engine.parallel.cost import LinkModel, ParallelConfig, PlanChoice, WorkloadShape, choose_plan, predict
from engine.parallel.plan import ParallelConfigError, ParallelPlan
from engine.parallel.pod_driver import PodDriver, PodEngine, VAEDecodeSink, follow

__all__ = [
    "LinkModel",
    "ParallelConfig",
    "ParallelConfigError",
    "ParallelPlan",
    "PlanChoice",
    "PodDriver",
    "PodEngine",
    "SequenceParallel",
    "ShardedAttentionCache",
    "VAEDecodeSink",
    "WorkloadShape",
    "choose_plan",
    "follow",
    "predict",
]
