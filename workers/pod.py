"""A worker pod: `python -m workers` under torchrun, one rank per device (sequence parallelism).

    torchrun --standalone --nnodes 1 --nproc-per-node 4 -m workers --device cuda --model DIR ...

Every rank joins the pod (`init_distributed`: NCCL on GPUs, gloo on the CPU), loads the same
model, chooses the same plan from the model's native workload (`choose_plan`; rank 0 logs it),
installs it on its DiT and builds its KV pool with its shard's layout (heads / U x tokens / R
per page). An uneven split ends every rank at start-up with the `ParallelConfigError` message.

Rank 0 then runs the ordinary worker service (port file, heartbeats, kvcache_svc registration);
its sessions are pod commands (`PodDriver`). The other ranks follow those commands until rank 0
shuts the pod down on drain, then exit 0. They bind no service port and ignore SIGTERM / SIGINT:
torchrun forwards a stop to every rank, and a follower that left early would strand the block
rank 0 is finishing.

The single-rank worker builds its KV pool with the same `shared_pool`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
from collections.abc import Callable

import torch.distributed as dist

from engine.families.wan.engine import shared_pool
from engine.families.wan.loader import LoadedModel, load_wan_model
from engine.families.wan.pipeline import WanPipeline
from engine.parallel.context import SequenceParallel
from engine.parallel.cost import DEFAULT_CONTEXT_FRAMES, ParallelConfig, PlanChoice, WorkloadShape, choose_plan
from engine.parallel.plan import STRATEGIES
from engine.parallel.pod_driver import PodDriver, PodEngine
from engine.parallel.pod_main import init_distributed, serve_pod
from inferix.spec.sizing import native_latent_size

log = logging.getLogger("inferix.worker.pod")


def world_size() -> int:
    """Ranks of this worker: torchrun's WORLD_SIZE, 1 when started without torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--sp-strategy",
        choices=STRATEGIES,
        default=env("INFERIX_SP_STRATEGY", "auto"),
        help="sequence-parallel strategy of a worker pod under torchrun (default auto: the cost model's "
        "pick; env INFERIX_SP_STRATEGY)",
    )
    degree = env("INFERIX_SP_ULYSSES_DEGREE")
    parser.add_argument(
        "--sp-ulysses-degree",
        type=int,
        default=int(degree) if degree else None,
        help="fix the Ulysses degree of a hybrid or auto split (env INFERIX_SP_ULYSSES_DEGREE)",
    )


def parallel_config(args: argparse.Namespace) -> ParallelConfig:
    return ParallelConfig(strategy=args.sp_strategy, ulysses_degree=args.sp_ulysses_degree)


def native_workload(model: LoadedModel) -> WorkloadShape:
    """What one block of a session at the model's native resolution communicates (plan input)."""
    block = model.pipeline_config.block
    height, width = native_latent_size(model.preset)
    return WorkloadShape.from_config(
        model.preset.dit,
        block,
        latent_height=height,
        latent_width=width,
        denoising_steps=len(model.pipeline_config.sampling.denoising_steps),
        context_frames=DEFAULT_CONTEXT_FRAMES if block.is_global else None,
        dtype=model.dit.patch_embedding.weight.dtype,
    )


def build_worker_pod(model: LoadedModel, parallel: ParallelConfig, kv_pages: int) -> tuple[PodEngine, PlanChoice]:
    """This rank's sharded engine; every rank calls it in the same order (it creates process groups).

    Raises `ParallelConfigError` (the same on every rank) when the split is uneven for this model.
    """
    choice = choose_plan(parallel, dist.get_world_size(), native_workload(model))
    model.dit.set_sequence_parallel(SequenceParallel(choice.plan))
    pipeline = WanPipeline(model.dit, model.pipeline_config, shared_pool(model, kv_pages))
    return PodEngine(pipeline), choice


def ignore_stop_signals() -> None:
    """A follower stops when rank 0 says so (after draining), not when torchrun forwards a signal."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_worker_pod(args: argparse.Namespace, dtype: str, serve: Callable[[LoadedModel, PodDriver], None]) -> None:
    """Run this rank of a worker pod; rank 0 calls `serve(model, driver)` (the gRPC worker service).

    Returns when rank 0 has shut the pod down (on every rank). A `UserError` at start-up (an uneven
    split, a bad model folder) is raised on every rank alike, before rank 0 binds any port.
    """
    device = init_distributed(args.device)
    me = dist.get_rank()
    model = load_wan_model(args.model, dtype=dtype, device=device, quant=args.quant, decoder=args.decoder)
    engine, choice = build_worker_pod(model, parallel_config(args), args.kv_pages)
    if me != 0:
        ignore_stop_signals()  # before the control group exists: rank 0 cannot serve before that
    pool = engine.pipeline.pool
    assert pool is not None
    log.info(
        "rank %d of %d: %s; KV pool of %d pages, %d heads x %d tokens each",
        me,
        dist.get_world_size(),
        choice.plan.name,
        pool.spec.num_pages,
        pool.spec.num_heads,
        pool.spec.page_size,
    )
    serve_pod(engine, lambda driver: serve(model, driver))
    if me != 0:
        log.info("rank %d: rank 0 shut the pod down; exiting", me)
    dist.destroy_process_group()


__all__ = [
    "add_parallel_arguments",
    "build_worker_pod",
    "ignore_stop_signals",
    "native_workload",
    "parallel_config",
    "rank",
    "run_worker_pod",
    "world_size",
]
