"""Golden-vector parity under sequence parallelism: the reference cases run sharded over a pod.

The checks of `engine.golden` (two stand-alone DiT calls, then the full block loop with
the recorded noise: x0 of every step, the latents, the final KV cache) run with a sharded DiT:
every DiT call runs on all ranks of the pod and each rank's KV cache holds only its shard; the
shards are gathered to compare with the reference's whole cache. Every rank computes every comparison.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.golden import WanCase, check_dit_forward, check_pipeline
from engine.golden import Comparison
from engine.parallel.context import SequenceParallel
from engine.parallel.cost import ParallelConfig, PlanChoice, WorkloadShape, choose_plan
from inferix.spec.parity import GOLDEN_TOLERANCE


def case_shape(case: WanCase) -> WorkloadShape:
    """The workload of a case's session, for the cost model (fp32, the case's whole video)."""
    pipeline = case.pipeline_config()
    _, frames, _, h, w = case.tensors("inputs")["initial_noise"].shape
    return WorkloadShape.from_config(
        case.dit_config(),
        pipeline.block,
        latent_height=h,
        latent_width=w,
        denoising_steps=len(pipeline.sampling.denoising_steps),
        context_frames=frames if pipeline.block.is_global else None,
        dtype=torch.float32,
    )


def _sharded_dit(case: WanCase, parallel: SequenceParallel) -> CausalWanDiT:
    dit = case.build_dit()
    dit.set_sequence_parallel(parallel)
    return dit


def verify_case_parallel(
    case: WanCase, config: ParallelConfig, tolerance: float = GOLDEN_TOLERANCE
) -> tuple[PlanChoice, list[Comparison]]:
    """Run one case over the whole pod (every rank calls this) with the plan `config` resolves to.

    Raises `ParallelConfigError` on every rank alike when the case's shape cannot be split so.
    """
    choice = choose_plan(config, dist.get_world_size(), case_shape(case))
    parallel = SequenceParallel(choice.plan)
    torch.manual_seed(0)
    results = [
        *check_dit_forward(case, tolerance, dit=_sharded_dit(case, parallel)),
        *check_pipeline(case, tolerance, dit=_sharded_dit(case, parallel), kv_view=parallel.gather_cache_kv),
    ]
    return choice, results


__all__ = ["case_shape", "verify_case_parallel"]
