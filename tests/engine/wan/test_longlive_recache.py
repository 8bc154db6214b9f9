"""LongLive's prompt switch with KV re-cache, beyond the golden case: our paged ring against LongLive's
loop written out literally over the reference cache layout (`ContiguousKVCache(protect_sink=True)`,
LongLive's token index rule), for windows, sinks, block sizes and switch points the golden case does
not have: a switch before the window is full, exactly when it fills, after it rolled, twice in a
row, with global attention; with and without a global sink."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from engine.families.wan.pipeline import ReplayBlock, WanPipeline
from engine.kv import ContiguousKVCache
from engine.noise import SeededNoise
from inferix.spec.sampling import BlockConfig, PipelineConfig, PromptSwitchConfig
from tests.engine.tiny import LATENT_H, LATENT_W, prompt, tiny_pipeline

SEED = 3


def reference_run(
    pipeline: WanPipeline, blocks: int, switches: dict[int, int], global_sink: bool
) -> tuple[Tensor, Tensor]:
    """LongLive 1.0's `InteractiveCausalInferencePipeline.inference` with `_recache_after_switch`:
    returns the latents and layer 1's final cached K, in the reference's layout."""
    dit, block = pipeline.dit, pipeline.config.block
    nf, schedule, steps = block.num_frame_per_block, pipeline.schedule, pipeline.timesteps
    tokens = dit.config.tokens_per_frame(LATENT_H, LATENT_W)
    cache = ContiguousKVCache(
        dit.config.num_layers,
        dit.config.num_heads,
        dit.config.head_dim,
        tokens,
        cache_frames=blocks * nf,
        window_frames=None if block.is_global else block.local_attn_size,
        sink_frames=block.sink_size,
        protect_sink=True,
    )
    noise = SeededNoise(SEED)
    text = dit.encode_prompt(prompt(0))
    output: list[Tensor] = []
    for b in range(blocks):
        start = b * nf
        if b in switches:
            text = dit.encode_prompt(prompt(switches[b]))
            if not global_sink:
                cache.zero()
            if start > 0:
                span = start if block.is_global else min(block.local_attn_size, start)
                recache = torch.cat(output, dim=1)[:, start - span :]
                cache.write_sink = not global_sink
                dit(recache, torch.zeros(1, span, dtype=torch.int64), text, cache, start_frame=start - span)
                cache.write_sink = False
        shape = (1, nf, dit.config.in_dim, LATENT_H, LATENT_W)
        x = noise.initial(b, shape)
        for i, t_value in enumerate(steps):
            t = torch.full((1, nf), float(t_value), dtype=steps.dtype)
            flow = dit(x, t, text, cache, start_frame=start)
            x0 = schedule.x0_from_flow(x, flow, t)
            if i + 1 < len(steps):
                t_next = torch.full((1, nf), float(steps[i + 1]), dtype=steps.dtype)
                x = schedule.add_noise(x0, noise.renoise(b, i, shape), t_next)
        dit(x0, torch.zeros(1, nf, dtype=steps.dtype), text, cache, start_frame=start)
        output.append(x0)
    return torch.cat(output, dim=1), cache.k[1, 0, : cache.local_end]


def engine_run(pipeline: WanPipeline, blocks: int, switches: dict[int, int]) -> tuple[Tensor, Tensor, list[bool]]:
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=SEED, num_blocks=blocks) as session:
        outputs = []
        for b in range(blocks):
            if b in switches:
                session.set_prompt(prompt(switches[b]))
            outputs.append(session.generate_block())
        k = session.cache.layer_kv(1)[0]
    return torch.cat([o.latents for o in outputs], dim=1), k, [o.recached for o in outputs]


CASES = {
    # name: (block, blocks, {block: prompt seed})
    "switch_before_the_window_fills": (BlockConfig(3, 12, 3), 6, {2: 1}),
    "switch_as_the_window_fills": (BlockConfig(3, 12, 3), 6, {4: 1}),
    "switches_after_the_window_rolled": (BlockConfig(3, 9, 3), 8, {4: 1, 5: 2}),
    "sink_not_a_whole_block": (BlockConfig(2, 7, 1), 7, {2: 1, 5: 2}),
    "one_frame_blocks": (BlockConfig(1, 5, 1), 9, {3: 1, 7: 2}),
    "no_sink": (BlockConfig(3, 6, 0), 5, {3: 1}),
    "global_attention": (BlockConfig(3, -1, 0), 4, {2: 1}),
}


@pytest.mark.parametrize("global_sink", [True, False], ids=["global_sink", "no_global_sink"])
@pytest.mark.parametrize("case", CASES)
def test_recache_matches_longlives_loop(case: str, global_sink: bool) -> None:
    block, blocks, switches = CASES[case]
    pipeline = tiny_pipeline(block, steps=(1000, 750, 500))
    config = dataclasses.replace(pipeline.config, prompt_switch=PromptSwitchConfig(True, global_sink))
    pipeline = WanPipeline(pipeline.dit, config)
    with torch.no_grad():
        ref_latents, ref_k = reference_run(pipeline, blocks, switches, global_sink)
        latents, k, recached = engine_run(pipeline, blocks, switches)
    assert recached == [b in switches for b in range(blocks)]
    assert (latents - ref_latents).abs().max() < 1e-4
    assert k.shape == ref_k.shape and (k - ref_k).abs().max() < 1e-4


def test_the_global_sink_is_what_tells_the_variants_apart_after_the_window_rolled() -> None:
    """The two variants differ once frames precede the re-cached window (so the test above can fail)."""
    block, blocks, switches = CASES["switches_after_the_window_rolled"]
    results = []
    for global_sink in (True, False):
        pipeline = tiny_pipeline(block)
        config = dataclasses.replace(pipeline.config, prompt_switch=PromptSwitchConfig(True, global_sink))
        with torch.no_grad():
            results.append(engine_run(WanPipeline(pipeline.dit, config), blocks, switches)[0])
    assert (results[0] - results[1]).abs().max() > 1e-3


def test_a_session_replayed_after_a_switch_continues_bit_identically() -> None:
    """Recovery by recompute: the committed blocks carry whether a switch re-encoded the cache, and
    a replay re-runs the re-cache there (the committed latents of the last window are enough)."""
    block, blocks, switches = CASES["switches_after_the_window_rolled"]
    pipeline = tiny_pipeline(block)
    config = dataclasses.replace(pipeline.config, prompt_switch=PromptSwitchConfig(True, False))
    pipeline = WanPipeline(pipeline.dit, config)
    segment = [0] * blocks
    for b in range(blocks):
        segment[b] = switches.get(b, segment[b - 1] if b else 0)
    with torch.no_grad():
        whole, _, _ = engine_run(pipeline, blocks, switches)
        with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=SEED, num_blocks=blocks) as first:
            made = []
            for b in range(6):
                if b in switches:
                    first.set_prompt(prompt(switches[b]))
                made.append(first.generate_block())
        committed = [ReplayBlock(m.start_frame, m.latents, prompt(segment[m.index]), recached=m.recached) for m in made]
        with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=SEED, num_blocks=blocks) as second:
            second.replay(committed[:3])  # in two chunks, as a worker restores a long history
            second.replay(committed[3:], next_block_index=6, from_start=False)
            rest = [second.generate_block().latents for _ in range(6, blocks)]
    assert torch.equal(torch.cat(rest, dim=1), whole[:, 6 * block.num_frame_per_block :])


def test_a_sink_longer_than_a_block_is_refused_for_longlives_loop() -> None:
    with pytest.raises(ValueError, match="needs sink_size <= num_frame_per_block, got sink_size=2"):
        PipelineConfig(block=BlockConfig(1, 5, 2), prompt_switch=PromptSwitchConfig(recache=True))
