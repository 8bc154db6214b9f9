"""Bytes per block each sequence-parallel strategy communicates, measured against the cost model.

    python bench/parallel.py                      # 1.3B and 14B shapes, world sizes 2 4 8
    python bench/parallel.py --world-size 2 4

What is measured, honestly: for every model shape, world size and valid plan, a real pod of
forked CPU ranks (gloo over 127.0.0.1) runs the engine's own self-attention path -- the Ulysses
all-to-alls, the paged KV shard, the Ring hops and all-to-alls -- once, at the real tensor sizes
(bf16, one block of 3 x 1560 tokens against a 21-frame context, full head count and head_dim),
plus the output gather, with every collective wrapped by the byte counter. Two things are not
run for real: the attention math is replaced by a kernel that returns zeros (the bytes moved do
not depend on the values, and the real fp32 math at these sizes takes minutes on a shared CPU),
and only one layer and one forward are issued, with the store-only layer that ends a context
pass; the per-block figure is that layer's bytes x (num_layers x forwards_per_block - 1) + the
store-only layer + the gather x denoising steps (a context pass gathers no output). Every other
layer and forward issues the same collectives -- the multi-rank tests check the complete
per-block count against the cost model on whole tiny models. Timings on CPU loopback say nothing
about NVLink, so only bytes are reported, with the cost model's predicted time on its link model.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.kv.pool import KVPool, KVPoolSpec
from engine.parallel.comm import CommCounter
from engine.parallel.context import SequenceParallel
from engine.parallel.cost import LinkModel, ParallelConfig, WorkloadShape, choose_plan, predict
from engine.parallel.plan import ParallelConfigError, candidate_plans
from inferix.spec.architectures import WAN21_T2V_1_3B, WAN21_T2V_14B
from inferix.spec.sampling import BlockConfig

DTYPE = torch.bfloat16
MiB = 2**20


def shapes(context_frames: int) -> dict[str, WorkloadShape]:
    """Wan2.1 at 480x832 (60x104 latents: 1560 tokens/frame), 3-frame blocks, 4 steps + context pass."""
    return {
        name: WorkloadShape.from_config(
            dit,
            BlockConfig(num_frame_per_block=3),
            latent_height=60,
            latent_width=104,
            denoising_steps=4,
            context_frames=context_frames,
            dtype=DTYPE,
        )
        for name, dit in (("1.3B", WAN21_T2V_1_3B), ("14B", WAN21_T2V_14B))
    }


def zero_partials(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Stands in for the attention math: the right shapes and dtypes, no FLOPs."""
    return q.new_zeros(q.shape, dtype=torch.float32), q.new_zeros(q.shape[:-1], dtype=torch.float32)


class ZeroAttention(AttentionBackend):
    """The same stand-in for the Ulysses-only path (which attends with the DiT's own backend)."""

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return torch.zeros_like(q)


@dataclass
class Measured:
    model: str
    world: int
    plan: str
    bytes_per_block: int
    by_phase: dict[str, int]
    operations_per_block: int


def measure_rank(rank: int, world: int, port: int, out: Path, context_frames: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    results: list[Measured] = []
    for model, shape in shapes(context_frames).items():
        for plan in candidate_plans("auto", world):
            try:
                plan.check(shape.num_heads, shape.tokens_per_frame)
            except ParallelConfigError:
                continue
            counter = CommCounter()
            parallel = SequenceParallel(plan, counter, kernel=zero_partials)
            heads, page = parallel.cache_layout(shape.num_heads, shape.tokens_per_frame)
            spec = KVPoolSpec(1, heads, shape.head_dim, page, shape.context_frames, dtype=DTYPE)
            cache = KVPool(spec).open_session("bench", page)
            history = shape.context_frames - shape.frames_per_block
            cache.begin(0, history)  # the block's context: pages allocated, contents irrelevant
            attention = parallel.attention_cache(cache)
            attention.begin(history, shape.frames_per_block)
            local = shape.block_tokens // plan.world_size
            q, k, v = (torch.zeros(1, local, shape.num_heads, shape.head_dim, dtype=DTYPE) for _ in range(3))
            attention.attend(0, q, k, v, ZeroAttention())
            layer = dict(counter.bytes_sent)
            layer_ops = counter.total_operations
            counter.reset()
            attention.store(0, k, v)  # the context pass's last layer
            stored, stored_ops = dict(counter.bytes_sent), counter.total_operations
            counter.reset()
            parallel.gather(torch.zeros(1, local, shape.out_channels, dtype=DTYPE), shape.frames_per_block)
            gather, gather_ops = counter.bytes_sent["gather"], counter.total_operations
            steps, layers = shape.forwards_per_block - 1, shape.num_layers * shape.forwards_per_block - 1
            phases = {phase: n * layers + stored.get(phase, 0) for phase, n in layer.items()}
            phases["gather"] = gather * steps
            operations = layer_ops * layers + stored_ops + gather_ops * steps
            results.append(Measured(model, world, plan.name, sum(phases.values()), phases, operations))
            del cache, attention, parallel
    dist.destroy_process_group()
    if rank == 0:
        torch.save(results, out / "measured.pt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--context-frames", type=int, default=21)
    parser.add_argument("--bandwidth-gbps", type=float, default=100.0)
    parser.add_argument("--latency-us", type=float, default=20.0)
    args = parser.parse_args()
    link = LinkModel(args.bandwidth_gbps * 1e9, args.latency_us * 1e-6)
    workloads = shapes(args.context_frames)

    print(
        f"bf16, 3-frame blocks x 1560 tokens, {args.context_frames}-frame context, 4 steps + context pass; "
        f"link {args.bandwidth_gbps:g} GB/s, {args.latency_us:g} us/op. MiB sent per rank per block.\n"
    )
    print(
        "| model | world | plan | measured MiB | predicted MiB | equal | ulysses / ring / gather MiB "
        "| ops measured / predicted | pred. ms |"
    )
    print("|---|---|---|---:|---:|---|---|---|---:|")
    picks = []
    for world in args.world_size:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                measure_rank,
                args=(world, free_port(), Path(tmp), args.context_frames),
                nprocs=world,
                start_method="fork",
            )
            measured: list[Measured] = torch.load(Path(tmp) / "measured.pt", weights_only=False)
        for model, shape in workloads.items():
            choice = choose_plan(ParallelConfig(link=link), world, shape)
            picks.append((model, world, choice))
            by_name = {c.plan.name: c for c in choice.alternatives}
            for m in sorted((m for m in measured if m.model == model), key=lambda m: m.bytes_per_block):
                cost = by_name[m.plan]
                assert predict(cost.plan, shape) == cost
                phases = " / ".join(f"{m.by_phase.get(p, 0) / MiB:.1f}" for p in ("ulysses", "ring", "gather"))
                mark = " **(chosen)**" if m.plan == choice.plan.name else ""
                print(
                    f"| {model} | {world} | {m.plan}{mark} | {m.bytes_per_block / MiB:.1f} | "
                    f"{cost.total_bytes / MiB:.1f} | {m.bytes_per_block == cost.total_bytes} | {phases} | "
                    f"{m.operations_per_block} / {cost.operations} | {cost.seconds(link) * 1e3:.1f} |"
                )
            for name in choice.rejected:
                print(f"| {model} | {world} | {name} | rejected | | | heads not divisible | | |")
    print("\nThe engine's automatic choice:")
    for model, world, choice in picks:
        print(f"  {model:>4} x {world}: {choice.describe()}")


if __name__ == "__main__":
    main()
