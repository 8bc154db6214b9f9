"""Profiler overhead: the same generation with the profiler off and on (full), interleaved.

"On" means everything `inferix generate --profile` does during generation: regions in the engine,
per-block records and the background monitor thread (CPU, RSS, KV gauge). Writing the report
happens after the run and is not part of the timing.

    python bench/profiler.py [--blocks 6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from inferix.profiling import Profiler
from workers.engine.model_dir import load_model
from workers.engine.video import VideoGenerator


def generate(generator: VideoGenerator, blocks: int, enabled: bool) -> float:
    profiler = Profiler(enabled=enabled, fps=generator.model.fps, label="bench")
    started = time.perf_counter()
    with generator.open("a red ball", seed=0, num_blocks=blocks) as video, profiler.session():
        profiler.add_gauge("kv_pages", lambda: float(video.session.cache.usage().device_pages))
        for index in range(blocks):
            with profiler.block(index) as scope:
                scope.pixel_frames = video.next_block().frames.shape[0]
    elapsed = time.perf_counter() - started
    if enabled:  # the report is written after the run, as `generate --profile` does: not timed
        with tempfile.TemporaryDirectory() as out:
            profiler.write(out)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = VideoGenerator(load_model(None))
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
    print(f"overhead on/off: {ratio:.4f}x (ratio of medians), {pairs:.4f}x (median of paired ratios)")


if __name__ == "__main__":
    main()
