"""Windowed sessions past the end of the RoPE table: they re-base their time positions.

A tiny DiT whose table holds 24 latent frames, a window of 9 frames with a sink of 3, 3 frames
per block: the block of frames 24..26 (block 8) is the first that would not fit; it re-bases by
18 positions (to 6..8), and so does every 6th block after it. The same DiT with a 1024-frame
table never re-bases: it is the reference. Before the crossing both are bit-identical; after it
they differ only by the rounding of turning cached keys (measured <= 5e-7 in fp32; TOL bounds it).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.families.wan.pipeline import BlockOutput, ReplayBlock, WanPipeline
from engine.families.wan.rope import rotate_time
from engine.kv import ContiguousKVCache, KVPool
from engine.noise import SeededNoise
from inferix.errors import UserError
from inferix.spec.presets import load_preset
from inferix.spec.sampling import BlockConfig, RopeRebase
from inferix.spec.sizing import session_shape
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_pipeline

TABLE = 24
WINDOW = BlockConfig(num_frame_per_block=3, local_attn_size=9, sink_size=3)
FIRST_CROSSING = 8  # frames 24..26
STRIDE = 18  # table - (window - sink)
BLOCKS = 30  # 90 frames: the table 3.75 times, 4 re-bases
TOL = 1e-5


def pipeline(table: int = TABLE, block: BlockConfig = WINDOW) -> WanPipeline:
    """The same weights whatever the table: it is not a parameter."""
    return tiny_pipeline(block, dit_config=dataclasses.replace(TINY_DIT, rope_max_positions=table))


def generate(pipe: WanPipeline, blocks: int, seed: int = 7) -> list[BlockOutput]:
    with pipe.open_session(prompt(0), LATENT_H, LATENT_W, seed=seed, num_blocks=blocks) as session:
        return list(session)


def max_diff(a: list[BlockOutput], b: list[BlockOutput]) -> float:
    return max(float((x.latents - y.latents).abs().max()) for x, y in zip(a, b, strict=True))


def test_a_session_runs_past_the_table_and_matches_a_larger_table() -> None:
    small = pipeline()
    with small.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=BLOCKS) as session:
        rebased, offsets = [], []
        for block in session:
            rebased.append(block)
            offsets.append(session.cache.position_offset)
        frames = list(session.cache.frames)
    reference = generate(pipeline(table=1024), BLOCKS)
    assert offsets == [0] * 8 + [18] * 6 + [36] * 6 + [54] * 6 + [72] * 4
    assert frames == [0, 1, 2, 84, 85, 86, 87, 88, 89]
    before = slice(0, FIRST_CROSSING)
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(rebased[before], reference[before], strict=True))
    after = max_diff(rebased[FIRST_CROSSING:], reference[FIRST_CROSSING:])
    assert 0 < after <= TOL, after


def test_cached_keys_are_the_larger_tables_turned_back_by_the_offset() -> None:
    """Sink and window alike: keys of every layer hold positions frame - offset (the sink's < 0)."""
    sessions = []
    for table in (TABLE, 1024):
        session = pipeline(table).open_session(prompt(0), LATENT_H, LATENT_W, seed=7)
        for _ in range(16):  # two re-bases
            session.generate_block()
        sessions.append(session)
    rebased, reference = sessions
    assert rebased.cache.position_offset == 2 * STRIDE and reference.cache.position_offset == 0
    for layer in range(TINY_DIT.num_layers):
        k, v = rebased.cache.layer_kv(layer)
        k_ref, v_ref = reference.cache.layer_kv(layer)
        torch.testing.assert_close(k, rotate_time(k_ref, -2 * STRIDE), rtol=0, atol=TOL)
        torch.testing.assert_close(v, v_ref, rtol=0, atol=TOL)
    for session in sessions:
        session.close()


def test_replay_across_crossings_continues_bit_identically() -> None:
    embeds = prompt(0)
    full = generate(pipeline(), 18)
    for k in (FIRST_CROSSING, 10, 15):  # at a crossing, between crossings, after the second
        committed = [ReplayBlock(b.start_frame, b.latents, embeds) for b in full[:k]]
        with pipeline().open_session(embeds, LATENT_H, LATENT_W, seed=7, num_blocks=18) as session:
            session.replay(committed, next_block_index=k)
            regenerated = [session.generate_block() for _ in range(3)]
        assert [b.index for b in regenerated] == [k, k + 1, k + 2]
        assert all(torch.equal(a.latents, b.latents) for a, b in zip(regenerated, full[k : k + 3], strict=True))


def test_prompt_changes_with_recache_and_host_offload_across_a_crossing() -> None:
    """Recache re-encodes the sink at its own positions and re-bases again; offload restores first."""

    def scripted(table: int, offload: bool) -> list[BlockOutput]:
        with pipeline(table).open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=16) as session:
            out = []
            for index in range(16):
                if index == 10:
                    session.set_prompt(prompt(1), recache=True)
                if offload and index in (FIRST_CROSSING, 14):
                    session.cache.offload()
                out.append(session.generate_block())
            return out

    rebased = scripted(TABLE, offload=False)
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(scripted(TABLE, True), rebased, strict=True))
    assert max_diff(rebased, scripted(1024, offload=False)) <= TOL


def test_continuation_from_initial_latents_longer_than_the_table() -> None:
    """Prefill re-bases on the way, like replay: both build the same cache."""
    embeds = prompt(0)
    full = generate(pipeline(), 12)
    initial = torch.cat([b.latents for b in full], dim=1)  # 36 frames
    pipe = pipeline()
    with (
        pipe.open_session(embeds, LATENT_H, LATENT_W, seed=7, initial_latents=initial) as prefilled,
        pipe.open_session(embeds, LATENT_H, LATENT_W, seed=7, session_id="replayed") as replayed,
    ):
        replayed.replay([ReplayBlock(b.start_frame, b.latents, embeds) for b in full])
        assert prefilled.next_frame == replayed.next_frame == 36
        assert prefilled.cache.position_offset == replayed.cache.position_offset == STRIDE
        assert prefilled.cache.frames == replayed.cache.frames
        for layer in range(TINY_DIT.num_layers):
            assert torch.equal(prefilled.cache.layer_kv(layer)[0], replayed.cache.layer_kv(layer)[0])
        assert prefilled.generate_block().start_frame == 36


def test_the_contiguous_reference_cache_re_bases_like_the_paged_one() -> None:
    paged = generate(pipeline(), 16)
    pipe = pipeline()
    dit, sched, steps = pipe.dit, pipe.schedule, pipe.timesteps
    tokens = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
    cache = ContiguousKVCache(
        TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, tokens, 9, window_frames=9, sink_frames=3
    )
    text, noise, nf = dit.encode_prompt(prompt(0)), SeededNoise(7), 3
    rule = RopeRebase(TABLE, keep=6)
    with torch.no_grad():
        for blk in range(16):
            start = nf * blk
            offset = rule.offset(start + nf)
            cache.rebase(offset, dit.rope.rotate_time)
            x = noise.initial(blk, (1, nf, 16, LATENT_H, LATENT_W))
            for i, t_value in enumerate(steps):
                t = torch.full((1, nf), float(t_value))
                x0 = sched.x0_from_flow(x, dit(x, t, text, cache, start, position_offset=offset), t)
                if i + 1 < len(steps):
                    x = sched.add_noise(x0, noise.renoise(blk, i, x0.shape), torch.full((1, nf), float(steps[i + 1])))
            dit(x0, torch.zeros(1, nf), text, cache, start, position_offset=offset)
            torch.testing.assert_close(x0, paged[blk].latents, rtol=0, atol=TOL)


def test_a_shared_pool_serves_a_re_basing_session_next_to_a_young_one() -> None:
    pipe = pipeline()
    pipe.pool = KVPool(pipe.pool_spec(LATENT_H, LATENT_W, frames=18))
    reference = generate(pipeline(), 12)
    with (
        pipe.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, session_id="old") as old,
        pipe.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, session_id="young") as young,
    ):
        old_blocks = [old.generate_block() for _ in range(FIRST_CROSSING)]
        young_blocks = []
        for _ in range(4):
            old_blocks.append(old.generate_block())  # re-bases at its block 8: turns only its own pages
            young_blocks.append(young.generate_block())
        assert old.cache.position_offset == STRIDE and young.cache.position_offset == 0
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(old_blocks, reference, strict=True))
    assert all(torch.equal(a.latents, b.latents) for a, b in zip(young_blocks, reference[:4], strict=True))


def test_global_attention_keeps_the_tables_bound() -> None:
    global_attention = pipeline(block=BlockConfig(num_frame_per_block=3))
    with global_attention.open_session(prompt(0), LATENT_H, LATENT_W, seed=7, num_blocks=9) as session:
        for _ in range(FIRST_CROSSING):
            session.generate_block()
        with pytest.raises(ValueError, match="RoPE table exhausted"):
            session.generate_block()


def test_sizing_lets_windowed_sessions_run_any_length_and_bounds_global_ones() -> None:
    toyworld = load_preset("toyworld")  # a window of 6 frames, 3 per block, a table of 16384 frames
    for num_blocks in (None, 5461, 5462, 10**6):
        assert session_shape(toyworld, 64, 64, num_blocks).cache_frames == 6
    short = dataclasses.replace(toyworld, dit=dataclasses.replace(toyworld.dit, rope_max_positions=8))
    with pytest.raises(UserError, match="cannot run windowed sessions: rope_max_positions=8 is too short"):
        session_shape(short, 64, 64, None)
    tiny = load_preset("tiny")  # global attention
    limit = tiny.dit.rope_max_positions // tiny.pipeline.block.num_frame_per_block
    assert session_shape(tiny, 128, 128, limit).cache_frames == limit * tiny.pipeline.block.num_frame_per_block
    with pytest.raises(UserError, match=f"{limit + 1} blocks need .* global attention .* at most {limit} blocks"):
        session_shape(tiny, 128, 128, limit + 1)
    with pytest.raises(UserError, match="global attention: an unbounded session needs a window"):
        session_shape(tiny, 128, 128, None)
