"""Golden-vector parity under sequence parallelism: the reference cases run sharded over a pod.

The same checks as `workers.engine.golden` (two stand-alone DiT calls, then the full block loop
with the recorded noise: x0 of every step, the latents, the final KV cache), but every DiT call
runs on all ranks of the pod and each rank's KV cache holds only its shard; the shards are
gathered to compare with the reference's whole cache. Every rank computes every comparison.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from workers.engine.flow_match import FlowMatchSchedule
from workers.engine.golden import DEFAULT_TOLERANCE, Comparison, GoldenCase
from workers.engine.kv.pool import KVPool
from workers.engine.models.wan.dit import CausalWanDiT
from workers.engine.noise import RecordedNoise
from workers.engine.parallel.context import SequenceParallel
from workers.engine.parallel.cost import ParallelConfig, PlanChoice, WorkloadShape, choose_plan
from workers.engine.pipeline import BlockDiffusionPipeline


def _diff(ours: Tensor, golden: Tensor) -> float:
    if ours.shape != golden.shape:
        raise AssertionError(f"shape mismatch: ours {list(ours.shape)} vs golden {list(golden.shape)}")
    return float((ours.double() - golden.double()).abs().max()) if ours.numel() else 0.0


def case_shape(case: GoldenCase) -> WorkloadShape:
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


def _sharded_dit(case: GoldenCase, parallel: SequenceParallel) -> CausalWanDiT:
    dit = case.build_dit()
    dit.set_sequence_parallel(parallel)
    return dit


def check_dit_forward(case: GoldenCase, parallel: SequenceParallel, tol: float) -> Iterator[Comparison]:
    """Two stand-alone DiT calls on a fresh sharded cache; the second attends to the first."""
    if not case.has("dit_forward"):
        return
    dit = _sharded_dit(case, parallel)
    pipeline = BlockDiffusionPipeline(dit, case.pipeline_config())
    schedule = FlowMatchSchedule(pipeline.config.sampling.schedule)
    data = case.tensors("dit_forward")
    prompt = dit.encode_prompt(case.tensors("inputs")["prompt_embeds"])
    _, frames, _, h, w = data["dit_fwd_in0"].shape
    block = pipeline.config.block
    pool = KVPool(pipeline.pool_spec(h, w, 2 * frames))
    cache = pool.open_session(
        "dit_forward",
        pipeline.cache_layout(h, w)[1],
        window_frames=None if block.is_global else block.local_attn_size,
        sink_frames=block.sink_size,
    )
    with torch.no_grad():
        for call in (0, 1):
            x, t = data[f"dit_fwd_in{call}"], data[f"dit_fwd_t{call}"]
            flow = dit(x, t, prompt, cache, start_frame=call * frames)
            x0 = schedule.x0_from_flow(x, flow, t)
            yield Comparison(case.name, f"dit_forward.flow{call}", _diff(flow, data[f"dit_fwd_flow{call}"]), tol)
            yield Comparison(case.name, f"dit_forward.x0_{call}", _diff(x0, data[f"dit_fwd_x0_{call}"]), tol)


def check_pipeline(case: GoldenCase, parallel: SequenceParallel, tol: float) -> Iterator[Comparison]:
    """The full block loop with the recorded noise; the KV shards are gathered and compared."""
    inputs, outputs = case.tensors("inputs"), case.tensors("outputs")
    renoise: dict[tuple[int, int], Tensor] = {}
    for name, tensor in inputs.items():
        if name.startswith("renoise_b"):
            block_key, step_key = name.removeprefix("renoise_b").split("_s")
            renoise[(int(block_key), int(step_key))] = tensor
    pipeline = BlockDiffusionPipeline(_sharded_dit(case, parallel), case.pipeline_config())
    _, frames, _, h, w = inputs["initial_noise"].shape
    session = pipeline.open_session(
        inputs["prompt_embeds"],
        h,
        w,
        noise=RecordedNoise(inputs["initial_noise"], renoise),
        num_blocks=frames // pipeline.config.block.num_frame_per_block,
        record_steps=True,
    )
    blocks = list(session)
    for block in blocks:
        for step, x0 in enumerate(block.step_x0):
            key = f"x0_b{block.index}_s{step}"
            yield Comparison(case.name, f"pipeline.{key}", _diff(x0, outputs[key]), tol)
    latents = torch.cat([b.latents for b in blocks], dim=1)
    yield Comparison(case.name, "pipeline.latents", _diff(latents, outputs["latents"]), tol)
    cached_frames = len(session.cache.frames)
    for layer in case.config.get("kv_cache", {}).get("layers_saved", []):
        local_k, local_v = session.cache.layer_kv(layer)
        end_key = f"kv_l{layer}_local_end_index"
        for kind, local in (("k", local_k), ("v", local_v)):
            ours = parallel.gather_cache_kv(local, cached_frames)
            used = int(outputs[end_key][0]) if end_key in outputs else ours.shape[0]
            golden = outputs[f"kv_l{layer}_{kind}"][0, :used]
            yield Comparison(case.name, f"kv_cache.layer{layer}.{kind}", _diff(ours, golden), tol)
    session.close()


def verify_case_parallel(
    case: GoldenCase, config: ParallelConfig, tolerance: float = DEFAULT_TOLERANCE
) -> tuple[PlanChoice, list[Comparison]]:
    """Run one case over the whole pod (every rank calls this) with the plan `config` resolves to.

    Raises `ParallelConfigError` on every rank alike when the case's shape cannot be split so.
    """
    choice = choose_plan(config, dist.get_world_size(), case_shape(case))
    parallel = SequenceParallel(choice.plan)
    torch.manual_seed(0)
    results = [*check_dit_forward(case, parallel, tolerance), *check_pipeline(case, parallel, tolerance)]
    return choice, results


__all__ = ["case_shape", "check_dit_forward", "check_pipeline", "verify_case_parallel"]
