"""Continuous batching: a session's blocks are bit-identical whatever runs beside it.

Sessions of one tiny DiT (window 9 with a sink of 3, a 24-frame RoPE table so that long sessions
re-base) share one KV pool and one `BlockBatcher`, and are compared with the same sessions run
alone, block by block, with `torch.equal`: batching may not change a single bit.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from engine.batching import BlockBatcher, ForwardStats
from engine.families.wan.engine import WanEngine
from engine.families.wan.pipeline import BlockOutput, WanLoop, WanPipeline
from engine.kv import KVPool
from engine.kv.errors import KVCapacityError
from inferix.spec.sampling import BlockConfig
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_pipeline

WINDOW = BlockConfig(num_frame_per_block=3, local_attn_size=9, sink_size=3)
STEPS = (1000, 750, 500, 250)


def pipeline() -> WanPipeline:
    pipe = tiny_pipeline(WINDOW, steps=STEPS, dit_config=dataclasses.replace(TINY_DIT, rope_max_positions=24))
    pipe.pool = KVPool(pipe.pool_spec(LATENT_H, LATENT_W, frames=64))
    return pipe


def open_session(pipe: WanPipeline, n: int, height: int = LATENT_H, width: int = LATENT_W) -> WanLoop:
    return pipe.open_session(prompt(n), height, width, seed=100 + n, session_id=f"s{n}")


def same(a: list[BlockOutput], b: list[BlockOutput]) -> bool:
    return len(a) == len(b) and all(
        x.index == y.index and torch.equal(x.latents, y.latents) for x, y in zip(a, b, strict=True)
    )


class Scenario:
    """Four sessions at different places: A fresh, B 9 blocks in (rolling window, re-based
    positions), C 2 blocks in with a prompt change and re-cache pending, D fresh; each then makes
    `blocks` more blocks."""

    def __init__(self, pipe: WanPipeline) -> None:
        self.sessions = {name: open_session(pipe, n) for n, name in enumerate("ABCD")}
        for name, done in (("B", 9), ("C", 2)):
            for _ in range(done):
                self.sessions[name].generate_block()
        self.sessions["C"].set_prompt(prompt(9), recache=True)


def test_four_sessions_batched_equal_each_alone() -> None:
    blocks = 4
    solo = Scenario(pipeline())
    expected = {name: [s.generate_block() for _ in range(blocks)] for name, s in solo.sessions.items()}

    batched = Scenario(pipeline())
    stats: list[ForwardStats] = []
    batcher = BlockBatcher(batched.sessions["A"].dit, on_forward=stats.append)
    got: dict[str, list[BlockOutput]] = {name: [] for name in batched.sessions}
    # D starts alone and reaches its context pass (after len(STEPS) denoising steps) as A, B and C
    # join: their first calls (C's are its re-cache context passes) share a forward with it.
    jobs = {"D": batcher.add(batched.sessions["D"].block_job())}
    for _ in range(len(STEPS)):
        batcher.step()
    for name in "ABC":
        jobs[name] = batcher.add(batched.sessions[name].block_job())
    while jobs:
        for entry in batcher.step():
            name = next(n for n, job in jobs.items() if job is entry)
            got[name].append(entry.value())
            del jobs[name]
            if len(got[name]) < blocks:  # the session's next block joins at once
                jobs[name] = batcher.add(batched.sessions[name].block_job())

    for name in "ABCD":
        assert same(got[name], expected[name]), f"session {name} differs when batched"
        ours, theirs = batched.sessions[name].cache, solo.sessions[name].cache
        assert ours.frames == theirs.frames and ours.position_offset == theirs.position_offset
        for layer in range(TINY_DIT.num_layers):
            assert all(torch.equal(a, b) for a, b in zip(ours.layer_kv(layer), theirs.layer_kv(layer), strict=True))
    assert max(s.sessions for s in stats) == 4
    assert any(s.kinds == {"denoise_step", "context_pass"} for s in stats)  # D's context pass and C's re-cache


def test_sessions_join_and_leave_mid_stream() -> None:
    """Sessions of different lengths, joining at different steps: each one's blocks are its solo blocks."""
    lengths = {0: 5, 1: 2, 2: 4, 3: 3, 4: 1}
    joins = {0: 0, 1: 0, 2: 3, 3: 7, 4: 12}  # the batcher step at which each session opens
    reference = pipeline()
    expected: dict[int, list[BlockOutput]] = {}
    for n, length in lengths.items():
        session = open_session(reference, n)
        expected[n] = [session.generate_block() for _ in range(length)]
        session.close()

    pipe = pipeline()
    batcher = BlockBatcher(pipe.dit)
    sessions: dict[int, WanLoop] = {}
    jobs: dict[int, object] = {}
    got: dict[int, list[BlockOutput]] = {n: [] for n in lengths}
    concurrency = []
    step = 0
    while step <= max(joins.values()) or jobs:
        for n in [n for n, at in joins.items() if at == step]:
            sessions[n] = open_session(pipe, n)
            jobs[n] = batcher.add(sessions[n].block_job())
        for entry in batcher.step():
            n = next(k for k, job in jobs.items() if job is entry)
            got[n].append(entry.value())
            if len(got[n]) < lengths[n]:
                jobs[n] = batcher.add(sessions[n].block_job())
            else:
                del jobs[n]
                sessions.pop(n).close()  # leaves: its pages go back to the pool
        concurrency.append(batcher.running)
        step += 1
    assert all(same(got[n], expected[n]) for n in lengths)
    assert max(concurrency) >= 3 and pipe.pool is not None and pipe.pool.usage().used_pages == 0


def test_sessions_of_other_sizes_run_in_separate_forwards() -> None:
    pipe = pipeline()
    sizes = [(LATENT_H, LATENT_W), (LATENT_H, LATENT_W), (2 * LATENT_H, LATENT_W)]
    expected = [open_session(pipeline(), n, *size).generate_block() for n, size in enumerate(sizes)]
    stats: list[ForwardStats] = []
    batcher = BlockBatcher(pipe.dit, on_forward=stats.append)
    got = batcher.run([open_session(pipe, n, *size).block_job() for n, size in enumerate(sizes)])
    assert same(got, expected)
    small, large = 3 * 6, 3 * 12  # token rows of one call: 3 frames x (2x3 or 4x3) patches
    assert {s.tokens for s in stats} == {2 * small, large} and all(s.sessions <= 2 for s in stats)


def test_calls_of_few_rows_batched_equal_each_alone() -> None:
    """12-row calls of a DiT 128 wide with a 384-wide FFN. On an AVX512 CPU fp32 GEMMs give 1-5 rows
    other bits alone than inside a larger matrix at 128 wide but 1-15 rows at 384 wide: a probe of the
    DiT's width alone batched these calls, and their FFN outputs differed from the solo ones."""
    config = dataclasses.replace(TINY_DIT, dim=128, ffn_dim=384, num_heads=2, rope_max_positions=24)
    height = width = 4  # 2x2 tokens per latent frame: 12 rows per 3-frame call

    def narrow() -> WanPipeline:
        pipe = tiny_pipeline(WINDOW, steps=STEPS, dit_config=config)
        pipe.pool = KVPool(pipe.pool_spec(height, width, frames=64))
        return pipe

    solo = narrow()
    sessions = [open_session(solo, n, height, width) for n in range(3)]
    expected = [[s.generate_block() for _ in range(2)] for s in sessions]
    pipe = narrow()
    batched = [open_session(pipe, n, height, width) for n in range(3)]
    batcher = BlockBatcher(pipe.dit)
    got: list[list[BlockOutput]] = [[], [], []]
    for _ in range(2):
        for n, block in enumerate(batcher.run([s.block_job() for s in batched])):
            got[n].append(block)
    assert all(same(g, e) for g, e in zip(got, expected, strict=True))


def test_max_tokens_bounds_every_forward_and_keeps_the_numbers() -> None:
    expected = [open_session(pipeline(), n).generate_block() for n in range(5)]
    pipe = pipeline()
    stats: list[ForwardStats] = []
    batcher = BlockBatcher(pipe.dit, max_tokens=40, on_forward=stats.append)  # two calls of 18 rows
    assert same(batcher.run([open_session(pipe, n).block_job() for n in range(5)]), expected)
    assert max(s.tokens for s in stats) == 36 and {s.sessions for s in stats} == {1, 2}
    with pytest.raises(ValueError, match="max_tokens"):
        BlockBatcher(pipe.dit, max_tokens=0)


def test_a_session_without_kv_pages_fails_alone() -> None:
    reference = open_session(tiny_pipeline(WINDOW, steps=STEPS), 0)
    expected = [reference.generate_block() for _ in range(3)]
    pipe = tiny_pipeline(WINDOW, steps=STEPS)
    pipe.pool = KVPool(pipe.pool_spec(LATENT_H, LATENT_W, frames=9))  # one page per frame
    first = open_session(pipe, 0)
    first.generate_block(), first.generate_block()  # 6 pages
    late = open_session(pipe, 1)
    batcher = BlockBatcher(pipe.dit)
    jobs = [batcher.add(first.block_job()), batcher.add(late.block_job())]  # 3 pages left: the first's
    while not all(job.done for job in jobs):
        batcher.step()
    assert torch.equal(jobs[0].value().latents, expected[2].latents)
    with pytest.raises(KVCapacityError, match="out of pages"):
        jobs[1].value()
    assert late.cache.frames == [] and late.next_block_index == 0


def test_toyworld_frames_batched_have_the_sha256_of_each_session_alone() -> None:
    """The product's default model, end to end (DiT, VAE decode, uint8 frames)."""
    engine = WanEngine.load("toyworld")
    args = [("a red ball bouncing", 1), ("two green squares falling", 2), ("a blue ball", 3)]

    def digest(frames: list[bytes]) -> str:
        return hashlib.sha256(b"".join(frames)).hexdigest()

    expected = []
    for text, seed in args:
        with engine.open(text, seed=seed, num_blocks=3) as session:
            expected.append(digest([b.frames.tobytes() for b in session]))
    sessions = [engine.open(text, seed=seed, num_blocks=3) for text, seed in args]
    batcher = engine.batcher()
    frames: list[list[bytes]] = [[] for _ in args]
    for _ in range(3):
        for i, block in enumerate(batcher.run([s.block_job() for s in sessions])):
            frames[i].append(block.frames.tobytes())
    assert [digest(f) for f in frames] == expected


def test_fail_all_ends_every_job_with_the_error() -> None:
    pipe = pipeline()
    batcher = BlockBatcher(pipe.dit)
    running = batcher.add(open_session(pipe, 0).block_job())
    batcher.step()
    queued = batcher.add(open_session(pipe, 1).block_job())
    failure = RuntimeError("device lost")
    assert set(map(id, batcher.fail_all(failure))) == {id(running), id(queued)}
    assert not batcher.busy
    for job in (running, queued):
        with pytest.raises(RuntimeError, match="device lost"):
            job.value()
