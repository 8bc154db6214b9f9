"""Entry point of a sequence-parallel worker pod: one process per device, started by torchrun.

    torchrun --nproc-per-node 4 -m engine.parallel.pod_main generate --dit-config wan2.1-14b \
        --weights dit.safetensors --prompt-embeds prompt.safetensors --latent-size 60 104 --blocks 7
    torchrun --nproc-per-node 2 -m engine.parallel.pod_main golden tests/golden --strategy ring-pass-q
    python -m engine.parallel.pod_main plan --dit-config wan2.1-1.3b --world-size 2 4 8

`run_pod(spec, serve)` runs on every rank: rank 0 runs `serve(driver)` (driving the pod through
`PodDriver`) while the other ranks follow in lockstep. The worker service (`python -m workers`
under torchrun, see `workers/pod.py`) loads its model its own way and shares `init_distributed`
and `serve_pod` with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.golden import WanCase
from engine.families.wan.pipeline import WanPipeline
from engine.families.wan.vae import WanVAE
from engine.golden import find_cases
from engine.kv.pool import KVPool
from engine.parallel.context import SequenceParallel
from engine.parallel.cost import (
    DEFAULT_CONTEXT_FRAMES,
    LinkModel,
    ParallelConfig,
    PlanChoice,
    WorkloadShape,
    choose_plan,
)
from engine.parallel.golden import verify_case_parallel
from engine.parallel.plan import STRATEGIES, ParallelConfigError
from engine.parallel.pod_driver import BlockSink, ControlChannel, PodDriver, PodEngine, VAEDecodeSink, follow
from inferix.errors import CheckpointError, UserError
from inferix.spec.architectures import DIT_PRESETS, WanDiTConfig
from inferix.spec.parity import GOLDEN_TOLERANCE
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class PodSpec:
    """What every rank of a pod builds: the model, the block loop, the resolution, the split."""

    dit: WanDiTConfig
    pipeline: PipelineConfig
    latent_height: int
    latent_width: int
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    weights: Path | None = None  # flat DiT state dict (.safetensors); None = random init (smoke tests)
    init_seed: int = 0
    dtype: torch.dtype = torch.float32
    attention_backend: str = "auto"
    context_frames: int | None = None  # cost-model horizon of a global-attention session
    pool_frames: int | None = None  # KV pool capacity in latent frames; None = sized by the first session

    def workload(self) -> WorkloadShape:
        block = self.pipeline.block
        context = self.context_frames
        if context is None and block.is_global:
            context = DEFAULT_CONTEXT_FRAMES
        return WorkloadShape.from_config(
            self.dit,
            block,
            latent_height=self.latent_height,
            latent_width=self.latent_width,
            denoising_steps=len(self.pipeline.sampling.denoising_steps),
            context_frames=context,
            dtype=self.dtype,
        )


def init_distributed(device_type: str | None = None) -> torch.device:
    """Join the pod torchrun started (env:// rendezvous): NCCL on GPUs, gloo on CPU.

    `device_type` "cuda" or "cpu" (e.g. a worker's --device); None = cuda when available.
    Returns this rank's device (cuda:LOCAL_RANK, or the CPU).
    """
    cuda = torch.cuda.is_available() if device_type is None else device_type.startswith("cuda")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise UserError(
                "a pod needs torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): "
                "torchrun --nproc-per-node N -m engine.parallel.pod_main ..."
            )
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    return device


def build_pod(spec: PodSpec, device: torch.device) -> tuple[PodEngine, PlanChoice]:
    """This rank's model, sharded pipeline and (optional) KV pool; every rank must call it."""
    choice = choose_plan(spec.parallel, dist.get_world_size(), spec.workload())  # logs the choice
    torch.manual_seed(spec.init_seed)
    dit = CausalWanDiT(spec.dit, attention_backend=spec.attention_backend)
    if spec.weights is not None:
        try:
            dit.load_state_dict(load_file(str(spec.weights)), strict=True)
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"{spec.weights}: cannot load the DiT state dict ({exc})") from exc
    dit = dit.to(device=device, dtype=spec.dtype).eval()
    dit.set_sequence_parallel(SequenceParallel(choice.plan))
    pipeline = WanPipeline(dit, spec.pipeline)
    if spec.pool_frames is not None:
        pipeline.pool = KVPool(pipeline.pool_spec(spec.latent_height, spec.latent_width, spec.pool_frames))
    return PodEngine(pipeline), choice


def serve_pod(engine: PodEngine, serve: Callable[[PodDriver], None], sink: BlockSink | None = None) -> None:
    """Call on every rank once its engine is built: rank 0 runs `serve(driver)`, the others follow.

    Rank 0 shuts the followers down when `serve` returns or fails (after the command in flight), so
    they return from here too. Every rank creates the control group here, after its own groups.
    """
    channel = ControlChannel()
    if dist.get_rank() != 0:
        follow(engine, channel)
        return
    driver = PodDriver(engine, channel, sink)
    try:
        serve(driver)
    finally:
        driver.shutdown()


def run_pod(spec: PodSpec, serve: Callable[[PodDriver], None], sink: BlockSink | None = None) -> None:
    """Run a pod: call on every rank. Rank 0 runs `serve(driver)`; the others follow until it returns.

    `sink` receives every finished block on rank 0 only (the VAE decode / streamer hand-off).
    """
    device = init_distributed()
    engine, _ = build_pod(spec, device)
    serve_pod(engine, serve, sink)


# ---- command line -----------------------------------------------------------------------------
def _dit_config(value: str) -> WanDiTConfig:
    if value in DIT_PRESETS:
        return DIT_PRESETS[value]
    path = Path(value)
    if not path.is_file():
        raise UserError(f"--dit-config {value!r}: not a preset ({', '.join(DIT_PRESETS)}) nor a JSON file")
    data = json.loads(path.read_text())
    return WanDiTConfig.from_dict(data.get("dit", data))


def _parallel_config(args: argparse.Namespace) -> ParallelConfig:
    link = LinkModel(bandwidth_bytes_per_s=args.bandwidth_gbps * 1e9, latency_s=args.latency_us * 1e-6)
    return ParallelConfig(strategy=args.strategy, ulysses_degree=args.ulysses_degree, link=link)


def _add_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto", help="default: the cost model's pick")
    parser.add_argument("--ulysses-degree", type=int, help="fix the Ulysses degree of a hybrid (or auto) split")
    parser.add_argument("--bandwidth-gbps", type=float, default=100.0, help="per-rank link bandwidth, GB/s")
    parser.add_argument("--latency-us", type=float, default=20.0, help="cost of one collective / ring hop, us")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dit-config", default="wan2.1-1.3b", help=f"preset ({', '.join(DIT_PRESETS)}) or JSON")
    parser.add_argument("--latent-size", type=int, nargs=2, default=(60, 104), metavar=("H", "W"))
    parser.add_argument("--frames-per-block", type=int, default=3)
    parser.add_argument("--local-attn-size", type=int, default=-1, help="window in latent frames (-1: global)")
    parser.add_argument("--sink-size", type=int, default=0, help="attention-sink frames of the window")
    parser.add_argument(
        "--context-frames",
        type=int,
        help=f"planning horizon of a global session (default {DEFAULT_CONTEXT_FRAMES})",
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")


def _cmd_plan(args: argparse.Namespace) -> int:
    block = BlockConfig(args.frames_per_block, args.local_attn_size, args.sink_size)
    shape = WorkloadShape.from_config(
        _dit_config(args.dit_config),
        block,
        latent_height=args.latent_size[0],
        latent_width=args.latent_size[1],
        denoising_steps=args.steps,
        context_frames=args.context_frames or (DEFAULT_CONTEXT_FRAMES if block.is_global else None),
        dtype=DTYPES[args.dtype],
    )
    config = _parallel_config(args)
    for world in args.world_size:
        choice = choose_plan(config, world, shape)
        print(f"world {world}: {choice.describe()}")
        for cost in choice.alternatives[1:]:
            mib, ms = cost.total_bytes / 2**20, cost.seconds(config.link) * 1e3
            print(f"    {cost.plan.name:<24} {mib:10.2f} MiB  {ms:8.3f} ms")
        for name, why in choice.rejected.items():
            print(f"    {name:<24} rejected: {why}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    dit = _dit_config(args.dit_config)
    block = BlockConfig(args.frames_per_block, args.local_attn_size, args.sink_size)
    spec = PodSpec(
        dit=dit,
        pipeline=PipelineConfig(block=block, sampling=SamplingConfig(denoising_steps=tuple(args.steps))),
        latent_height=args.latent_size[0],
        latent_width=args.latent_size[1],
        parallel=_parallel_config(args),
        weights=args.weights,
        init_seed=args.init_seed,
        dtype=DTYPES[args.dtype],
        context_frames=args.context_frames,
    )
    if args.prompt_embeds is not None:
        embeds = load_file(str(args.prompt_embeds))["prompt_embeds"]
    else:
        generator = torch.Generator().manual_seed(args.seed)
        embeds = torch.randn(1, min(dit.text_len, 16), dit.text_dim, generator=generator)
    init_distributed()
    sink = VAEDecodeSink(WanVAE.from_checkpoint(args.vae)) if args.vae is not None and dist.get_rank() == 0 else None

    def serve(driver: PodDriver) -> None:
        driver.open_session("cli", embeds, *args.latent_size, seed=args.seed, num_blocks=args.blocks)
        blocks = [driver.generate_block("cli") for _ in range(args.blocks)]
        driver.close_session("cli")
        tensors = {"latents": torch.cat([b.latents for b in blocks], dim=1).float().cpu()}
        if sink is not None:
            tensors["video"] = sink.video("cli")
        if args.out is not None:
            save_file(tensors, str(args.out))
        print(f"{len(blocks)} blocks, {sum(b.timings.total_s for b in blocks):.2f} s")

    run_pod(spec, serve, sink)
    dist.destroy_process_group()
    return 0


def _cmd_golden(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    device = init_distributed()
    rank = dist.get_rank()
    failed = total = 0
    for case in find_cases(args.directory, device):  # on this rank's device: NCCL moves CUDA tensors only
        try:
            choice, comparisons = verify_case_parallel(WanCase.of(case), _parallel_config(args), args.tolerance)
        except ParallelConfigError as exc:
            if rank == 0:
                print(f"n/a  {case.name:<28} {exc}")
            continue
        if rank == 0:
            print(f"plan {case.name:<28} {choice.plan.name}")
        for comparison in comparisons:
            total += 1
            failed += not comparison.passed
            if rank == 0:
                status = "ok  " if comparison.passed else "FAIL"
                print(f"{status} {comparison.case:<28} {comparison.name:<36} {comparison.max_abs_diff:.3e}")
    if rank == 0:
        print(f"{total - failed} passed, {failed} failed")
    dist.destroy_process_group()
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.parallel.pod_main",
        description="Sequence-parallel (Ulysses / Ring / hybrid) worker pod of the Inferix engine. "
        "'generate' and 'golden' run under torchrun, one process per device (NCCL on GPUs, gloo on CPU).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = sub.add_parser("plan", help="print the cost model's choice per world size (no processes)")
    _add_model_args(plan)
    _add_parallel_args(plan)
    plan.add_argument("--world-size", type=int, nargs="+", default=[2, 4, 8])
    plan.add_argument("--steps", type=int, default=4, help="denoising steps per block")
    plan.set_defaults(func=_cmd_plan)

    gen = sub.add_parser("generate", help="generate a video over the pod (rank 0 writes the output)")
    _add_model_args(gen)
    _add_parallel_args(gen)
    gen.add_argument("--weights", type=Path, help="DiT state dict (.safetensors); default: random init")
    gen.add_argument("--init-seed", type=int, default=0, help="seed of the random init without --weights")
    gen.add_argument("--prompt-embeds", type=Path, help="safetensors with 'prompt_embeds' [1, L, text_dim]")
    gen.add_argument("--steps", type=float, nargs="+", default=[1000, 750, 500, 250])
    gen.add_argument("--blocks", type=int, default=7)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--vae", type=Path, help="Wan VAE checkpoint: rank 0 stream-decodes every block")
    gen.add_argument("--out", type=Path, help="safetensors for 'latents' (and 'video' with --vae)")
    gen.set_defaults(func=_cmd_generate)

    golden = sub.add_parser("golden", help="run golden cases through the parallel path and compare")
    golden.add_argument("directory", type=Path, metavar="DIR")
    _add_parallel_args(golden)
    golden.add_argument("--tolerance", type=float, default=GOLDEN_TOLERANCE)
    golden.add_argument("--threads", type=int, default=1)
    golden.set_defaults(func=_cmd_golden)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Rank 0 logs the plan choice and its predicted cost; the followers only warnings.
    level = logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"engine.parallel.pod_main {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
