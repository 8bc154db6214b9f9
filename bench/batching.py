"""Continuous batching benchmark: N concurrent sessions on one worker, batched vs one at a time.

Every round, each of N sessions asks for its next block at once. "one-at-a-time" makes the blocks
one after another (what a worker did before batching); "batched" runs them through one
`BlockBatcher`, one forward per denoising step for all N. The two modes alternate round by round
in one process on the same sessions' models, so their ratio is measured side by side. Reported:
aggregate frames/s, the block latency a session sees from the round's start (p50 / p95), and the
ratio. Batched blocks are bit-identical to one-at-a-time ones, checked here on every round.

    python bench/batching.py                       # toyworld (default model) and a mid-size DiT
    python bench/batching.py --model toyworld --realtime   # also: toyworld streams at 16 fps on one core
    python bench/batching.py --threads 1 --profile 8       # where the time goes, per op
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from engine.batching import BlockBatcher
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.engine import WanEngine, WanSession
from engine.families.wan.pipeline import DiTJob, WanLoop, WanPipeline
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig

# The mid-size CPU config of bench/engine_speed.py: dim 384, 6 layers, 448 tokens per latent frame.
MID_DIT = WanDiTConfig(dim=384, ffn_dim=1536, num_heads=6, num_layers=6, freq_dim=256, text_len=64)
MID_LATENT = (28, 64)
MID_BLOCK = BlockConfig(num_frame_per_block=3, local_attn_size=12, sink_size=3)


class Stream(Protocol):
    """One session under test: `step()` makes its next block alone, `job()` is that block as a job;
    both give the block's latents (for the bit-identity check)."""

    frames_per_block: int

    def step(self) -> torch.Tensor: ...

    def job(self) -> DiTJob[torch.Tensor]: ...


class ToyworldStream:
    frames_per_block = 3

    def __init__(self, session: WanSession) -> None:
        self.session = session

    def step(self) -> torch.Tensor:
        return self.session.next_block().latents

    def job(self) -> DiTJob[torch.Tensor]:
        block = yield from self.session.block_job()
        return block.latents


class MidStream:
    frames_per_block = MID_BLOCK.num_frame_per_block

    def __init__(self, session: WanLoop) -> None:
        self.session = session

    def step(self) -> torch.Tensor:
        return self.session.generate_block().latents

    def job(self) -> DiTJob[torch.Tensor]:
        block = yield from self.session.block_job()
        return block.latents


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["toyworld", "mid", "both"], default="both")
    p.add_argument("--sessions", default="1,2,4,8", help="comma-separated N (default 1,2,4,8)")
    p.add_argument("--rounds", type=int, default=0, help="rounds per mode and N (default: 6 toyworld, 1 mid)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--realtime", action="store_true", help="also find how many toyworld streams keep 16 fps")
    p.add_argument(
        "--profile",
        type=int,
        metavar="N",
        default=0,
        help="instead: where the time of one toyworld round of N sessions goes, per op, batched vs one at a time",
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the figures to OUT as JSON")
    return p.parse_args()


def toyworld_streams(engine: WanEngine, n: int) -> list[Stream]:
    streams: list[Stream] = []
    for i in range(n):
        session = engine.open(f"ball number {i} bouncing", seed=i, num_blocks=None)
        session.next_block()  # the window holds a block before measuring
        streams.append(ToyworldStream(session))
    return streams


def mid_streams(pipeline: WanPipeline, n: int) -> list[Stream]:
    streams: list[Stream] = []
    for i in range(n):
        embeds = torch.randn(1, MID_DIT.text_len, MID_DIT.text_dim, generator=torch.Generator().manual_seed(i))
        session = pipeline.open_session(embeds, *MID_LATENT, seed=i)
        session.generate_block()
        streams.append(MidStream(session))
    return streams


def one_at_a_time(streams: list[Stream]) -> tuple[float, list[float], list[torch.Tensor]]:
    began = time.perf_counter()
    latencies, outputs = [], []
    for stream in streams:
        outputs.append(stream.step())
        latencies.append(time.perf_counter() - began)
    return time.perf_counter() - began, latencies, outputs


def batched(batcher: BlockBatcher, streams: list[Stream]) -> tuple[float, list[float], list[torch.Tensor]]:
    began = time.perf_counter()
    entries = [batcher.add(stream.job()) for stream in streams]
    latencies: dict[int, float] = {}
    while len(latencies) < len(entries):
        for entry in batcher.step():
            index = next(i for i, e in enumerate(entries) if e is entry)
            latencies[index] = time.perf_counter() - began
    outputs = [entry.value() for entry in entries]
    return time.perf_counter() - began, [latencies[i] for i in range(len(entries))], outputs


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    name: str, make: Callable[[int], tuple[list[Stream], list[Stream], BlockBatcher]], ns: list[int], rounds: int
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    print(f"\n{name}: {rounds} rounds per mode, alternating")
    print(f"{'N':>3} {'1-at-a-time fps':>16} {'batched fps':>12} {'ratio':>6} "
          f"{'p50/p95 ms (1-at-a-time)':>26} {'p50/p95 ms (batched)':>22}")  # fmt: skip
    for n in ns:
        solo_streams, batch_streams, batcher = make(n)
        frames = sum(s.frames_per_block for s in solo_streams)
        ratios, solo_fps, batch_fps = [], [], []
        solo_lat: list[float] = []
        batch_lat: list[float] = []
        for _ in range(rounds):
            solo_s, lat_a, out_a = one_at_a_time(solo_streams)
            batch_s, lat_b, out_b = batched(batcher, batch_streams)
            if not all(torch.equal(a, b) for a, b in zip(out_a, out_b, strict=True)):
                raise SystemExit(f"{name} N={n}: batched blocks differ from one-at-a-time blocks")
            solo_fps.append(frames / solo_s)
            batch_fps.append(frames / batch_s)
            ratios.append(solo_s / batch_s)
            solo_lat += lat_a
            batch_lat += lat_b
        row = {
            "model": name,
            "sessions": n,
            "one_at_a_time_fps": statistics.median(solo_fps),
            "batched_fps": statistics.median(batch_fps),
            "ratio": statistics.median(ratios),
            "one_at_a_time_p50_ms": 1e3 * percentile(solo_lat, 0.5),
            "one_at_a_time_p95_ms": 1e3 * percentile(solo_lat, 0.95),
            "batched_p50_ms": 1e3 * percentile(batch_lat, 0.5),
            "batched_p95_ms": 1e3 * percentile(batch_lat, 0.95),
        }
        rows.append(row)
        print(f"{n:>3} {row['one_at_a_time_fps']:>16.1f} {row['batched_fps']:>12.1f} {row['ratio']:>5.2f}x "
              f"{row['one_at_a_time_p50_ms']:>12.0f} / {row['one_at_a_time_p95_ms']:<11.0f} "
              f"{row['batched_p50_ms']:>9.0f} / {row['batched_p95_ms']:<9.0f}")  # fmt: skip
    return rows


def realtime_streams(engine: WanEngine, fps: float, rounds: int) -> dict[str, object]:
    """The most toyworld streams one core keeps at `fps` when batched (the median round)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _realtime_streams(engine, fps, rounds)
    finally:
        torch.set_num_threads(threads)


def _realtime_streams(engine: WanEngine, fps: float, rounds: int) -> dict[str, object]:
    best, tried = 0, {}
    n = 1
    batcher = engine.batcher()
    while n <= 64:
        streams = toyworld_streams(engine, n)
        per_stream = statistics.median(3 / batched(batcher, streams)[0] for _ in range(rounds))
        tried[n] = per_stream
        print(f"  {n:>3} streams batched: {per_stream:6.1f} fps each")
        if per_stream < fps:
            break
        best = n
        n += 1 if n < 8 else 4
    return {"realtime_fps": fps, "streams": best, "per_stream_fps": tried}


def profile_ops(engine: WanEngine, n: int, rounds: int = 2, top: int = 12) -> None:
    """Self CPU time per op over `rounds` rounds of `n` toyworld sessions, batched vs one at a time."""
    from torch.profiler import ProfilerActivity, profile

    streams = toyworld_streams(engine, n)
    batcher = engine.batcher()
    batched(batcher, streams)  # warm
    totals = {}
    for mode, run in (
        ("batched", lambda: batched(batcher, streams)),
        ("one-at-a-time", lambda: one_at_a_time(streams)),
    ):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                run()
        totals[mode] = {e.key: e.self_cpu_time_total / 1e3 / rounds for e in prof.key_averages()}
    both, alone = totals["batched"], totals["one-at-a-time"]
    print(f"\ntoyworld, {n} sessions, self CPU ms per round ({torch.get_num_threads()} thread(s), torch.profiler)")
    print(f"{'op':<52} {'1-at-a-time':>12} {'batched':>9} {'ratio':>6}")
    for key in sorted(set(both) | set(alone), key=lambda k: -alone.get(k, 0.0))[:top]:
        a, b = alone.get(key, 0.0), both.get(key, 0.0)
        print(f"{key:<52} {a:>12.1f} {b:>9.1f} {a / b if b else float('inf'):>5.2f}x")
    print(f"{'all ops':<52} {sum(alone.values()):>12.1f} {sum(both.values()):>9.1f} "
          f"{sum(alone.values()) / sum(both.values()):>5.2f}x")  # fmt: skip


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ns = [int(n) for n in args.sessions.split(",")]
    rows: list[dict[str, object]] = []
    result: dict[str, object] = {"threads": torch.get_num_threads(), "rows": rows}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    if args.profile:
        profile_ops(WanEngine.load("toyworld", kv_pages=1024), args.profile)
        return
    if args.model in ("toyworld", "both"):
        engine = WanEngine.load("toyworld", kv_pages=1024)

        def toy(n: int) -> tuple[list[Stream], list[Stream], BlockBatcher]:
            return toyworld_streams(engine, n), toyworld_streams(engine, n), engine.batcher()

        rows += measure("toyworld 64x64 (dim 128, 4 layers, 7+1 calls/block)", toy, ns, args.rounds or 6)
        if args.realtime:
            print("\ntoyworld streams at 16 fps on one core (one torch thread), batched:")
            result["realtime"] = realtime_streams(engine, 16.0, args.rounds or 6)
    if args.model in ("mid", "both"):
        torch.manual_seed(0)
        dit = CausalWanDiT(MID_DIT, attention_backend="sdpa").eval()
        config = PipelineConfig(block=MID_BLOCK, sampling=SamplingConfig(denoising_steps=(1000, 750, 500, 250)))

        def mid(n: int) -> tuple[list[Stream], list[Stream], BlockBatcher]:
            pipeline = WanPipeline(dit, config)
            return mid_streams(pipeline, n), mid_streams(pipeline, n), BlockBatcher(dit)

        rows += measure("mid-size (dim 384, 6 layers, 448 tokens/frame, 4+1 calls/block)", mid, ns, args.rounds or 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
