"""The block loop: determinism, regeneration by recompute, prompt changes, windows, bad input."""

from __future__ import annotations

import pytest
import torch

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.pipeline import ReplayBlock, WanPipeline
from engine.kv import ContiguousKVCache, KVCapacityError, KVPool
from engine.noise import SeededNoise, draw_seed
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_dit, tiny_pipeline

ROLLING = BlockConfig(num_frame_per_block=2, local_attn_size=5, sink_size=1)


def run(pipeline: WanPipeline, blocks: int, seed: int = 7, **kwargs) -> list[torch.Tensor]:
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=seed, num_blocks=blocks, **kwargs) as s:
        return [b.latents for b in s]


def test_same_seed_same_video_and_noise_keyed_by_block_and_step() -> None:
    a = run(tiny_pipeline(ROLLING), 4)
    b = run(tiny_pipeline(ROLLING), 4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    c = run(tiny_pipeline(ROLLING), 4, seed=8)
    assert not torch.equal(a[0], c[0])
    assert len({draw_seed(7, blk, step) for blk in range(3) for step in range(-1, 3)}) == 12
    noise = SeededNoise(7)
    assert torch.equal(noise.renoise(2, 1, (1, 2, 3)), SeededNoise(7).renoise(2, 1, (1, 2, 3)))


@pytest.mark.parametrize("block", [BlockConfig(num_frame_per_block=2), ROLLING], ids=["global", "rolling"])
def test_block_regenerated_alone_from_stored_latents_equals_the_full_run(block: BlockConfig) -> None:
    pipeline = tiny_pipeline(block)
    embeds = prompt(0)
    with pipeline.open_session(embeds, LATENT_H, LATENT_W, seed=3, num_blocks=5) as session:
        full = list(session)
    k = 4
    committed = [ReplayBlock(b.start_frame, b.latents, embeds) for b in full[:k]]
    fresh = tiny_pipeline(block)
    with fresh.open_session(embeds, LATENT_H, LATENT_W, seed=3, num_blocks=5) as session:
        session.replay(committed, next_block_index=k)
        regenerated = session.generate_block()
    assert regenerated.index == k and regenerated.start_frame == full[k].start_frame
    assert torch.equal(regenerated.latents, full[k].latents)


def test_a_replay_in_chunks_equals_the_replay_at_once() -> None:
    """A worker replays a long history one page at a time: the chunks continue each other exactly."""
    pipeline = tiny_pipeline(ROLLING)
    embeds = prompt(0)
    with pipeline.open_session(embeds, LATENT_H, LATENT_W, seed=3, num_blocks=7) as session:
        full = list(session)
    committed = [ReplayBlock(b.start_frame, b.latents, embeds) for b in full[:6]]
    with tiny_pipeline(ROLLING).open_session(embeds, LATENT_H, LATENT_W, seed=3, num_blocks=7) as session:
        session.generate_block()  # whatever ran before is dropped by the first chunk
        for first, chunk in ((0, committed[:1]), (1, committed[1:4]), (4, committed[4:])):
            session.replay(chunk, next_block_index=first + len(chunk), from_start=first == 0)
        regenerated = session.generate_block()
    assert regenerated.index == 6 and torch.equal(regenerated.latents, full[6].latents)


def test_paged_cache_equals_the_contiguous_reference_layout_through_the_dit() -> None:
    pipeline = tiny_pipeline(ROLLING)
    paged = run(pipeline, 5)
    dit = pipeline.dit
    tokens = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
    ref_cache = ContiguousKVCache(
        TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, tokens, 10, window_frames=5, sink_frames=1
    )
    text = dit.encode_prompt(prompt(0))
    noise = SeededNoise(7)
    sched = pipeline.schedule
    steps = pipeline.timesteps
    with torch.no_grad():
        for blk in range(5):
            x = noise.initial(blk, (1, 2, 16, LATENT_H, LATENT_W))
            for i, t_value in enumerate(steps):
                t = torch.full((1, 2), float(t_value))
                x0 = sched.x0_from_flow(x, dit(x, t, text, ref_cache, 2 * blk), t)
                if i + 1 < len(steps):
                    eps = noise.renoise(blk, i, x0.shape)
                    x = sched.add_noise(x0, eps, torch.full((1, 2), float(steps[i + 1])))
            dit(x0, torch.zeros(1, 2), text, ref_cache, 2 * blk)
            torch.testing.assert_close(x0, paged[blk], rtol=0, atol=1e-5)


def test_euler_solver_integrates_the_flow_ode_without_fresh_noise() -> None:
    steps = (1000, 750, 500, 250)
    euler = PipelineConfig(block=ROLLING, sampling=SamplingConfig(denoising_steps=steps, solver="euler"))
    pipeline = WanPipeline(tiny_dit(), euler)
    generated = run(pipeline, 3)
    dit, sched = pipeline.dit, pipeline.schedule
    tokens = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
    ref_cache = ContiguousKVCache(
        TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, tokens, 10, window_frames=5, sink_frames=1
    )
    text = dit.encode_prompt(prompt(0))
    sigmas = [float(sched.sigma(torch.tensor([float(t)]))) for t in pipeline.timesteps] + [0.0]
    with torch.no_grad():
        for blk in range(3):
            x = SeededNoise(7).initial(blk, (1, 2, 16, LATENT_H, LATENT_W))
            for i, t_value in enumerate(pipeline.timesteps):  # x <- x + (sigma_next - sigma) * flow
                flow = dit(x, torch.full((1, 2), float(t_value)), text, ref_cache, 2 * blk)
                x = x + (sigmas[i + 1] - sigmas[i]) * flow
            dit(x, torch.zeros(1, 2), text, ref_cache, 2 * blk)
            torch.testing.assert_close(x, generated[blk], rtol=0, atol=1e-5)
    renoised = run(tiny_pipeline(ROLLING, steps=steps), 3)
    assert not torch.allclose(renoised[0], generated[0], atol=1e-3)
    with pytest.raises(ValueError, match="solver must be 'renoise' or 'euler'"):
        SamplingConfig(solver="ddim")  # type: ignore[arg-type]


def test_prompt_change_applies_at_the_next_block_and_keeps_the_cache() -> None:
    pipeline = tiny_pipeline(ROLLING)
    base = run(pipeline, 4)
    pipeline = tiny_pipeline(ROLLING)
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=4) as session:
        first = [session.generate_block().latents for _ in range(2)]
        frames_before = list(session.cache.frames)
        session.set_prompt(prompt(1))
        assert session.cache.frames == frames_before  # nothing happens until the next block
        rest = [b.latents for b in session]
    assert all(torch.equal(a, b) for a, b in zip(first, base[:2], strict=True))
    assert not torch.equal(rest[0], base[2])


def test_recache_rewrites_the_window_under_the_new_prompt_and_keeps_the_global_sink() -> None:
    outputs = {}
    sink_tokens = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
    for recache in (False, True):
        pipeline = tiny_pipeline(ROLLING)
        with torch.no_grad(), pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=4) as session:
            for _ in range(3):
                session.generate_block()
            # Layer 1: its K/V depend on the prompt through layer 0's cross-attention.
            before = session.cache.layer_kv(1)[0].clone()
            session.set_prompt(prompt(1), recache=recache)
            job = session.block_job()
            call = next(job)
            assert (call.kind == "context_pass") == recache  # the re-cache opens the block
            if recache:  # frames 2..5 after the sink frame 0, in one pass
                assert (call.start_frame, call.x.shape[1]) == (2, 4)
                call = job.send(session.dit.forward_batch([call])[0])
                after = session.cache.layer_kv(1)[0]
                assert torch.equal(before[:sink_tokens], after[:sink_tokens])  # the global sink is kept
                assert not torch.equal(before[sink_tokens:], after[sink_tokens:])
            try:
                while True:
                    call = job.send(session.dit.forward_batch([call])[0])
            except StopIteration as done:
                outputs[recache] = done.value.latents
    assert not torch.equal(outputs[False], outputs[True])


def test_video_continuation_from_initial_latents() -> None:
    pipeline = tiny_pipeline(BlockConfig(num_frame_per_block=2))
    reference = run(pipeline, 3)
    pipeline = tiny_pipeline(BlockConfig(num_frame_per_block=2))
    init = torch.cat(reference[:2], dim=1)
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=1, initial_latents=init) as s:
        block = s.generate_block()
    assert block.start_frame == 4 and block.index == 0
    with pytest.raises(ValueError, match="multiple of num_frame_per_block=2"):
        pipeline.open_session(prompt(0), LATENT_H, LATENT_W, num_blocks=1, initial_latents=init[:, :3])


def test_unbounded_session_with_a_window_runs_past_its_pool_size() -> None:
    pipeline = tiny_pipeline(ROLLING)
    pool = KVPool(pipeline.pool_spec(LATENT_H, LATENT_W, frames=5))
    pipeline.pool = pool
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W, seed=1) as session:
        for expected, block in zip(range(12), session, strict=False):
            assert block.index == expected
        assert session.cache.frames == [0, 20, 21, 22, 23]
        assert pool.usage().used_pages == 5


def test_global_session_stops_with_a_clear_error_when_the_pool_is_full() -> None:
    pipeline = tiny_pipeline(BlockConfig(num_frame_per_block=2))
    pipeline.pool = KVPool(pipeline.pool_spec(LATENT_H, LATENT_W, frames=4))
    with pipeline.open_session(prompt(0), LATENT_H, LATENT_W) as session:
        session.generate_block()
        session.generate_block()
        with pytest.raises(KVCapacityError, match="out of pages"):
            session.generate_block()


def test_rope_table_exhaustion_is_a_clear_error() -> None:
    config = WanDiTConfig(**{**TINY_DIT.__dict__, "rope_max_positions": 6})
    torch.manual_seed(0)
    dit = CausalWanDiT(config, attention_backend="sdpa")
    x = torch.zeros(1, 2, 16, LATENT_H, LATENT_W)
    with pytest.raises(ValueError, match="RoPE table exhausted"):
        dit(x, torch.zeros(1, 2), dit.encode_prompt(prompt(0)), None, start_frame=5)


def test_bad_input_names_the_parameter() -> None:
    dit = tiny_dit()
    text = dit.encode_prompt(prompt(0))
    with pytest.raises(ValueError, match="text_dim=16"):
        dit.encode_prompt(torch.zeros(1, 4, 7))
    with pytest.raises(ValueError, match=r"latents \[batch, frames, 16, h, w\]"):
        dit(torch.zeros(1, 2, 8, 4, 6), torch.zeros(1, 2), text)
    with pytest.raises(ValueError, match="timesteps must have shape"):
        dit(torch.zeros(1, 2, 16, 4, 6), torch.zeros(1, 3), text)
    with pytest.raises(ValueError, match="divisible by the patch size"):
        tiny_pipeline().open_session(prompt(0), 5, 6, num_blocks=1)
    with pytest.raises(ValueError, match="num_frame_per_block must be >= 1"):
        BlockConfig(num_frame_per_block=0)
    with pytest.raises(ValueError, match="local_attn_size=3 must be at least"):
        BlockConfig(num_frame_per_block=3, local_attn_size=3, sink_size=1)
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        tiny_pipeline().open_session(prompt(0), LATENT_H, LATENT_W, num_blocks=0)
    with pytest.raises(ValueError, match="unknown attention backend 'xformers'"):
        CausalWanDiT(TINY_DIT, attention_backend="xformers")
    with pytest.raises(ValueError, match="dim=30 must be divisible by num_heads=4"):
        WanDiTConfig(dim=30, num_heads=4)


def test_flash_backend_request_without_flash_attn_is_a_clear_error() -> None:
    from engine.attention.backends import flash_attention_available

    if flash_attention_available():
        assert CausalWanDiT(TINY_DIT, attention_backend="flash").backend.name == "flash"
    else:
        with pytest.raises(ValueError, match="'flash' is unavailable"):
            CausalWanDiT(TINY_DIT, attention_backend="flash")
    assert CausalWanDiT(TINY_DIT, attention_backend="auto").backend.name in ("sdpa", "flash")
