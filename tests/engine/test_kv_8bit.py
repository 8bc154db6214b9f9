"""8-bit paged KV (`kv_dtype="fp8"` / `"int8"`): accuracy against the full-precision pool, real byte
accounting, host round trip of pages and scales, the ring window, batched attention, bad values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.attention.backends import AttentionBackend
from engine.batching import BlockBatcher
from engine.families.wan.engine import WanEngine
from engine.families.wan.pipeline import WanLoop, WanPipeline
from engine.kv import KVCapacityError, KVPool, KVPoolSpec
from engine.registry import load_engine
from inferix.errors import UserError
from inferix.spec.sampling import BlockConfig
from tests.engine.magi.conftest import make_magi_folder
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_pipeline

WINDOW = BlockConfig(num_frame_per_block=3, local_attn_size=9, sink_size=3)
STEPS = (1000, 750, 500, 250)
BLOCKS = 9  # 27 frames: the window rolls and, at block 8, the session re-bases (RoPE table of 24)
TOKENS = 4  # page size of the hand-built pools
# Relative L2 error of the final latents of a 9-block windowed tiny-DiT session against the
# full-precision pool, measured over seeds 0-2: fp8 <= 7.3e-4, int8 <= 1.6e-4 (a block attends to its
# own K/V unrounded; 1.1e-3 and 2.4e-4 when it read them back through 8 bits).
# fp8 e4m3 keeps 3 mantissa bits (~3% per element), int8 7 bits; attention averages the
# per-element errors out. The bounds leave ~4x margin.
REL_ERROR_BOUND = {"fp8": 5e-3, "int8": 1e-3}


def pipeline(kv_dtype: str, frames: int = 32) -> WanPipeline:
    pipe = tiny_pipeline(WINDOW, steps=STEPS, dit_config=dataclasses.replace(TINY_DIT, rope_max_positions=24))
    pipe.pool = KVPool(pipe.pool_spec(LATENT_H, LATENT_W, frames, kv_dtype))
    return pipe


def video(pipe: WanPipeline, seed: int = 0) -> torch.Tensor:
    with pipe.open_session(prompt(seed), LATENT_H, LATENT_W, seed=seed, num_blocks=BLOCKS) as session:
        latents = torch.cat([session.generate_block().latents for _ in range(BLOCKS)], dim=1)
        assert session.cache.position_offset > 0  # the 8-bit keys were turned (re-based) too
        return latents


def make_pool(kv_dtype: str, pages: int = 16, host_pages: int | None = None) -> KVPool:
    spec = KVPoolSpec(2, 2, 4, TOKENS, pages, host_pages=host_pages, kv_dtype=kv_dtype)
    return KVPool(spec)


def write(cache, start: int, count: int) -> None:  # type: ignore[no-untyped-def]
    """Random K/V for frames [start, start + count) in both layers."""
    cache.begin(start, count)
    for layer in range(2):
        q, k, v = (torch.randn(1, count * TOKENS, 2, 4) for _ in range(3))
        cache.attend(layer, q, k, v, AttentionBackend())


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_an_8bit_pool_runs_the_tiny_dit_close_to_full_precision(kv_dtype: str) -> None:
    reference = video(pipeline("auto"))
    pipe = pipeline(kv_dtype)
    out = video(pipe)
    assert pipe.pool is not None and pipe.pool.kv_read_path == "dequantize-per-page"
    rel = ((out - reference).norm() / reference.norm()).item()
    assert 0 < rel < REL_ERROR_BOUND[kv_dtype], rel


def test_batched_8bit_sessions_equal_each_alone() -> None:
    """Batched attention reads the sessions' pages before storing the call's K/V: the dequantized
    copies it gets must hold the call's K/V too, so batched blocks are the solo blocks, bit for bit."""
    solo_pipe, batched_pipe = pipeline("fp8", 64), pipeline("fp8", 64)
    solo = [
        [s.generate_block().latents for _ in range(3)]
        for s in (solo_pipe.open_session(prompt(n), LATENT_H, LATENT_W, seed=n, session_id=f"s{n}") for n in range(3))
    ]
    sessions = [batched_pipe.open_session(prompt(n), LATENT_H, LATENT_W, seed=n, session_id=f"s{n}") for n in range(3)]
    batcher = BlockBatcher(batched_pipe.dit)
    for block in range(3):
        outputs = batcher.run([s.block_job() for s in sessions])
        for n, output in enumerate(outputs):
            assert torch.equal(output.latents, solo[n][block])


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_host_round_trip_moves_8bit_pages_and_scales_bit_exactly(kv_dtype: str) -> None:
    torch.manual_seed(0)
    pool = make_pool(kv_dtype, host_pages=8)
    cache = pool.open_session("s", TOKENS, window_frames=5, sink_frames=1)
    for block in range(3):
        write(cache, 2 * block, 2)

    def raw() -> list[torch.Tensor]:
        ids = torch.tensor(cache.pages)
        assert pool.k_scale is not None and pool.v_scale is not None
        return [t.index_select(1, ids) for t in (pool.k, pool.v, pool.k_scale, pool.v_scale)]

    before, kv_before = raw(), [cache.layer_kv(layer) for layer in range(2)]
    assert before[0].dtype in (torch.uint8, torch.int8) and before[2].dtype == torch.float32
    cache.offload()
    write(pool.open_session("o", TOKENS), 0, 3)  # overwrites the freed pages: the ring comes back elsewhere
    cache.prefetch()
    assert all(torch.equal(a, b) for a, b in zip(raw(), before, strict=True))
    for layer in range(2):
        assert all(torch.equal(a, b) for a, b in zip(cache.layer_kv(layer), kv_before[layer], strict=True))


def test_page_bytes_are_the_real_bytes() -> None:
    for kv_dtype in ("auto", "fp8", "int8"):
        pool = KVPool(KVPoolSpec(2, 12, 128, 8, 3, dtype=torch.bfloat16, kv_dtype=kv_dtype))
        held = sum(t.numel() * t.element_size() for t in (pool.k, pool.v, pool.k_scale, pool.v_scale) if t is not None)
        assert pool.spec.total_bytes == held == 3 * pool.spec.page_bytes
    # A Wan 1.3B-like page (1560 tokens, 12 heads of 128): 8 bits and the scales are ~half of bf16.
    bf16 = KVPoolSpec(30, 12, 128, 1560, 1, dtype=torch.bfloat16)
    for kv_dtype in ("fp8", "int8"):
        spec = dataclasses.replace(bf16, kv_dtype=kv_dtype)
        assert spec.page_bytes == 2 * 30 * (1560 * 12 * 128 + 12 * 4)  # K and V: 8-bit values + fp32 scales
        assert spec.page_bytes <= 0.52 * bf16.page_bytes


def test_capacity_and_usage_count_8bit_pages() -> None:
    pool = make_pool("int8", pages=6)
    spec = pool.spec
    assert spec.page_bytes == 2 * 2 * (TOKENS * 2 * 4 + 2 * 4)
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 4)
    usage = pool.usage()
    assert usage.page_bytes == spec.page_bytes
    assert (usage.used_bytes, usage.free_bytes) == (4 * spec.page_bytes, 2 * spec.page_bytes)
    assert cache.usage().device_bytes == 4 * spec.page_bytes
    with pytest.raises(KVCapacityError, match="needs 3 page"):
        cache.begin(4, 3)
    assert cache.frames == [0, 1, 2, 3]


@pytest.mark.parametrize("kv_dtype", ["fp8", "int8"])
def test_the_ring_window_works_with_8bit_pages(kv_dtype: str) -> None:
    """Window 7 / sink 1 / blocks of 3: frames land in their ring slots and attention reads the
    dequantized ring (one run of pages) exactly as a gather of the cached frames in slot order,
    with the block's own pages holding its unrounded K/V."""
    torch.manual_seed(0)
    pool = make_pool(kv_dtype)
    write(pool.open_session("o", TOKENS), 0, 2)  # the ring starts after another session's pages
    cache = pool.open_session("s", TOKENS, window_frames=7, sink_frames=1)
    backend = AttentionBackend()
    for block in range(6):
        cache.begin(3 * block, 3)
        q, k, v = (torch.randn(1, 3 * TOKENS, 2, 4) for _ in range(3))
        out = cache.attend(0, q, k, v, backend)
        keys, values = pool.fetch_pages(0, cache.read_pages())
        assert keys.dtype == torch.float32
        # The block's own pages are read in full precision (its K/V as computed), the others dequantized.
        for i, page in enumerate(cache.write_pages()):
            row = cache.read_pages().index(page) * TOKENS
            keys[row : row + TOKENS], values[row : row + TOKENS] = (
                k[0, i * TOKENS : (i + 1) * TOKENS],
                v[0, i * TOKENS : (i + 1) * TOKENS],
            )
        assert torch.equal(out, backend.dense(q, keys.unsqueeze(0), values.unsqueeze(0)))
        # The block just written reads back within the format's rounding.
        written, _ = pool.fetch_pages(0, cache.write_pages())
        torch.testing.assert_close(written, k[0], rtol=0.07 if kv_dtype == "fp8" else 0.01, atol=0.02)
    assert cache.frames == [0, 12, 13, 14, 15, 16, 17]
    assert pool.usage().used_pages == 2 + 7


def test_a_write_must_cover_whole_pages() -> None:
    cache = make_pool("fp8").open_session("s", TOKENS)
    cache.begin(0, 2)
    k = torch.randn(1, 2 * TOKENS - 1, 2, 4)
    with pytest.raises(ValueError, match="stores 7 K/V rows but begin prepared 2 page"):
        cache.store(0, k, k)


def test_an_all_zero_page_stays_zero() -> None:
    cache = make_pool("int8").open_session("s", TOKENS)
    cache.begin(0, 1)
    zeros = torch.zeros(1, TOKENS, 2, 4)
    cache.store(0, zeros, zeros)
    k, v = cache.layer_kv(0)
    assert not k.any() and not v.any() and not k.isnan().any()


def test_unknown_kv_dtypes_are_refused() -> None:
    with pytest.raises(ValueError, match="kv_dtype must be one of 'auto', 'fp8', 'int8', got 'fp16'"):
        KVPoolSpec(1, 1, 1, 1, 1, kv_dtype="fp16")
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        WanPipeline(pipe.dit, pipe.config, kv_dtype="e5m2")
    assert make_pool("auto").kv_read_path == "direct"


def test_the_engine_makes_every_pool_8bit() -> None:
    shared = WanEngine.load("tiny", kv_pages=8, kv_dtype="int8")
    assert shared.pool is not None and shared.pool.spec.kv_dtype == "int8"
    own = WanEngine.load("tiny", kv_dtype="fp8")  # no shared pool: each session's pool is its own
    with own.open("a prompt", num_blocks=1) as session:
        session.next_block()
        assert isinstance(session.loop, WanLoop) and session.loop.pool.spec.kv_dtype == "fp8"
    with pytest.raises(ValueError, match="pass pool or kv_dtype"):
        WanEngine.load("tiny", pool=shared.pool, kv_dtype="fp8")


def test_magi_refuses_8bit_kv(tmp_path: Path) -> None:
    folder = make_magi_folder("magi1_tiny_distill", tmp_path / "magi")
    with pytest.raises(UserError, match="--kv-dtype is not supported for MAGI-1 yet"):
        load_engine(folder, kv_dtype="fp8")
