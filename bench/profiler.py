"""Profiler overhead: the same generation with the profiler off and on (full), interleaved.

"On" means everything `inferix generate --profile` does during generation: regions in the engine,
per-block records and the background monitor thread (CPU, RSS, KV gauge). Writing the report
happens after the run and is not part of the timing.

On a shared machine two runs of the same generation differ by far more than 1%, so the A/B
comparison alone cannot show a 1% overhead. The benchmark therefore also measures the profiler's
own costs directly -- one region (enabled and disabled), one block record, one monitor sample --
counts how many of each a block of the real run makes, and reports the resulting overhead
fraction of the measured block time.

    python bench/profiler.py [--blocks 6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from engine.families.wan.engine import WanEngine
from engine.families.wan.loader import load_wan_model
from inferix.profiling import Profiler, profile
from inferix.profiling.monitors import ProcessMonitor


def generate(generator: WanEngine, blocks: int, enabled: bool) -> float:
    profiler = Profiler(enabled=enabled, fps=generator.model.fps, label="bench")
    started = time.perf_counter()
    with generator.open("a red ball", seed=0, num_blocks=blocks) as video, profiler.session():
        profiler.add_gauge("kv_pages", lambda: float(video.kv_usage().device_pages))
        for index in range(blocks):
            with profiler.block(index) as scope:
                scope.pixel_frames = video.next_block().frames.shape[0]
    elapsed = time.perf_counter() - started
    if enabled:  # the report is written after the run, as `generate --profile` does: not timed
        with tempfile.TemporaryDirectory() as out:
            profiler.write(out)
    return elapsed


def per_call_seconds(fn: Callable[[], None], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def direct_costs(calls: int) -> dict[str, float]:
    """Seconds per region (profiler on / off), per block record, per monitor sample."""

    def region() -> None:
        with profile("bench_region"):
            pass

    costs = {"region_off": per_call_seconds(region, calls)}
    profiler = Profiler(fps=16, label="cost", sample_interval_s=None)
    with profiler.session():
        costs["region_on"] = per_call_seconds(region, calls)
        counter = iter(range(10**9))

        def block() -> None:
            with profiler.block(next(counter)) as scope:
                scope.pixel_frames = 12

        costs["block_record"] = per_call_seconds(block, calls // 10)
    monitor = ProcessMonitor()
    costs["monitor_sample"] = per_call_seconds(lambda: None if monitor.sample() else None, 1000)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = WanEngine(load_wan_model("tiny"))
    generate(generator, 1, True)  # warm-up (imports, allocator)
    off, on = [], []
    for _ in range(args.repeats):
        off.append(generate(generator, args.blocks, False))
        on.append(generate(generator, args.blocks, True))
    ratio = statistics.median(on) / statistics.median(off)
    pairs = statistics.median(b / a for a, b in zip(off, on, strict=True))
    print(f"tiny model, {args.blocks} blocks, {args.repeats} interleaved repeats, 1 torch thread")
    print(f"profiler off: median {statistics.median(off):.3f} s   runs {[round(t, 3) for t in off]}")
    print(f"profiler on:  median {statistics.median(on):.3f} s   runs {[round(t, 3) for t in on]}")
    print(f"end to end on/off: {ratio:.4f}x (ratio of medians), {pairs:.4f}x (median of paired ratios)")

    costs = direct_costs(calls=100_000)
    steps = generator.denoising_steps
    regions_per_block = steps + 2  # denoise steps, context pass, VAE decode (text encode: per prompt)
    block_s = statistics.median(off) / args.blocks
    samples_per_block = block_s / 0.2  # the monitor thread samples every 0.2 s
    extra_s = (
        regions_per_block * (costs["region_on"] - costs["region_off"])
        + costs["block_record"]
        + samples_per_block * costs["monitor_sample"]
    )
    print(
        f"direct costs: region {costs['region_on'] * 1e6:.1f} us on / {costs['region_off'] * 1e6:.2f} us off, "
        f"block record {costs['block_record'] * 1e6:.1f} us, monitor sample {costs['monitor_sample'] * 1e6:.1f} us"
    )
    print(
        f"per block ({block_s * 1e3:.0f} ms): {regions_per_block} regions + 1 record + {samples_per_block:.1f} "
        f"samples = {extra_s * 1e6:.0f} us -> overhead {100 * extra_s / block_s:.3f}% of block time"
    )


if __name__ == "__main__":
    main()
