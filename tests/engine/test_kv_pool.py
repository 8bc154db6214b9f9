"""The paged KV pool: window/sink eviction, fetch paths, host tier, capacity, isolation."""

from __future__ import annotations

import pytest
import torch

from engine.attention.backends import AttentionBackend
from engine.kv import ContiguousKVCache, KVCapacityError, KVOrderError, KVPool, KVPoolSpec

TOKENS = 4  # tokens per frame = page size


def make_pool(pages: int = 16, host_pages: int | None = None) -> KVPool:
    return KVPool(
        KVPoolSpec(num_layers=2, num_heads=2, head_dim=4, page_size=TOKENS, num_pages=pages, host_pages=host_pages)
    )


def frame_kv(frames: list[int], marker: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V whose every value encodes its frame, so the cache content is easy to read back."""
    values = torch.tensor([f + marker for f in frames], dtype=torch.float32)
    k = values.repeat_interleave(TOKENS).view(1, -1, 1, 1).expand(1, -1, 2, 4).contiguous()
    return k, -k


def write(cache, start: int, count: int, marker: float = 0.0) -> None:
    frames = list(range(start, start + count))
    cache.begin(start, count)
    k, v = frame_kv(frames, marker)
    for layer in range(2):
        cache.attend(layer, k[:, :1], k, v, AttentionBackend())


def cached_frames(cache, layer: int = 0) -> list[float]:
    k, _ = cache.layer_kv(layer)
    return k[::TOKENS, 0, 0].tolist()


def test_window_with_sink_evicts_oldest_non_sink_frames_first() -> None:
    pool = make_pool()
    cache = pool.open_session("s", TOKENS, window_frames=7, sink_frames=1)
    for block in range(4):
        write(cache, 3 * block, 3)
    # Window 7 = sink frame 0 + the 6 most recent frames; nothing shifted, order kept.
    assert cache.frames == [0, 6, 7, 8, 9, 10, 11]
    assert cached_frames(cache) == [0, 6, 7, 8, 9, 10, 11]
    assert pool.usage().used_pages == 7


def test_rewriting_the_current_block_overwrites_its_pages() -> None:
    pool = make_pool()
    cache = pool.open_session("s", TOKENS, window_frames=6, sink_frames=3)
    write(cache, 0, 3)
    write(cache, 3, 3)
    write(cache, 6, 3, marker=0.5)  # a denoising step: evicts 3..5
    pages = list(cache.pages)
    write(cache, 6, 3)  # the context pass of the same block: same pages, no eviction
    assert cache.pages == pages
    assert cached_frames(cache) == [0, 1, 2, 6, 7, 8]


def test_frames_out_of_order_are_rejected() -> None:
    cache = make_pool().open_session("s", TOKENS)
    write(cache, 0, 3)
    write(cache, 3, 3)
    with pytest.raises(KVOrderError, match="frames 1..3"):
        cache.begin(1, 3)


def test_range_fetch_is_a_view_and_index_fetch_follows_the_given_order() -> None:
    pool = make_pool()
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 4)
    k_range, _ = pool.fetch_range(0, cache.pages[0], 4)
    assert k_range.data_ptr() == pool.k[0, cache.pages[0]].data_ptr()  # no copy
    order = [cache.pages[2], cache.pages[0]]
    k_index, v_index = pool.fetch_pages(0, order)
    assert k_index[::TOKENS, 0, 0].tolist() == [2.0, 0.0]
    assert torch.equal(v_index, -k_index)


def test_paged_attention_equals_contiguous_reference_when_the_window_rolls() -> None:
    """Window 7 / sink 1 / blocks of 3: the reference really shifts frames here."""
    torch.manual_seed(0)
    backend = AttentionBackend()
    pool = make_pool()
    paged = pool.open_session("s", TOKENS, window_frames=7, sink_frames=1)
    ref = ContiguousKVCache(2, 2, 4, TOKENS, cache_frames=30, window_frames=7, sink_frames=1)
    # Another session interleaves so the paged table is fragmented (index fetch path).
    other = pool.open_session("o", TOKENS)
    for block in range(6):
        if block < 3:
            write(other, block, 1)
        for _ in range(2):  # a denoising step, then the context pass, of the same block
            paged.begin(3 * block, 3)
            ref.begin(3 * block, 3)
            q, k, v = (torch.randn(1, 3 * TOKENS, 2, 4) for _ in range(3))
            for layer in range(2):
                out_paged = paged.attend(layer, q, k, v, backend)
                out_ref = ref.attend(layer, q, k, v, backend)
                torch.testing.assert_close(out_paged, out_ref, rtol=0, atol=1e-6)
    assert ref.local_end == 7 * TOKENS


def test_host_round_trip_is_bit_exact_and_frees_device_pages() -> None:
    pool = make_pool(host_pages=8)
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 3)
    before = [cache.layer_kv(layer) for layer in range(2)]
    used = pool.usage().used_pages
    cache.offload()
    assert cache.tier == "host"
    assert pool.usage().used_pages == used - 3
    assert pool.usage().host_pages_used == 3
    cache.prefetch()
    assert cache.tier == "device"
    assert pool.usage().host_pages_used == 0
    for layer in range(2):
        k, v = cache.layer_kv(layer)
        assert torch.equal(k, before[layer][0]) and torch.equal(v, before[layer][1])
    write(cache, 3, 3)  # continues normally after the round trip
    assert cached_frames(cache) == [0, 1, 2, 3, 4, 5]


def test_offloaded_session_restores_on_its_next_block() -> None:
    pool = make_pool()
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 3)
    cache.offload()
    write(cache, 3, 3)
    assert cache.tier == "device" and cached_frames(cache) == [0, 1, 2, 3, 4, 5]


def test_capacity_errors_leave_every_session_intact() -> None:
    pool = make_pool(pages=5)
    a = pool.open_session("a", TOKENS)
    write(a, 0, 3)
    b = pool.open_session("b", TOKENS)
    with pytest.raises(KVCapacityError, match=r"session 'b' needs 3 page\(s\).*2 of 5 free"):
        write(b, 0, 3)
    assert b.frames == [] and a.frames == [0, 1, 2]
    assert pool.usage().used_pages == 3
    with pytest.raises(KVCapacityError):
        write(a, 3, 3)
    assert cached_frames(a) == [0, 1, 2]


def test_a_pool_smaller_than_one_window_is_refused_when_the_session_opens() -> None:
    """A windowed session takes its whole ring at its first block: a pool that cannot ever hold it
    is refused at open, with the pages the window needs, not deep inside the first forward."""
    pool = make_pool(pages=6)
    with pytest.raises(KVCapacityError, match=r"window of 9 latent frames, 9 KV page\(s\).*6 page\(s\) in all"):
        pool.open_session("w", TOKENS, window_frames=9, sink_frames=3)
    assert pool.session_ids() == []
    pool.open_session("fits", TOKENS, window_frames=6, sink_frames=3)


def test_host_tier_capacity_is_enforced() -> None:
    pool = make_pool(host_pages=2)
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 3)
    with pytest.raises(KVCapacityError, match="host tier full"):
        cache.offload()
    assert cache.tier == "device" and pool.usage().used_pages == 3


def test_two_sessions_share_a_pool_without_interference() -> None:
    pool = make_pool()
    a = pool.open_session("a", TOKENS, window_frames=4, sink_frames=1)
    b = pool.open_session("b", TOKENS)
    for block in range(4):
        write(a, 2 * block, 2, marker=0.25)
        write(b, 2 * block, 2, marker=0.75)
    assert cached_frames(a) == [0.25, 5.25, 6.25, 7.25]
    assert cached_frames(b) == [f + 0.75 for f in range(8)]
    assert set(a.pages).isdisjoint(b.pages)
    usage = pool.usage()
    assert usage.used_pages == 4 + 8 and usage.sessions == 2
    assert a.usage().device_bytes == 4 * pool.spec.page_bytes
    pool.close_session("a")
    assert pool.usage().used_pages == 8 and cached_frames(b) == [f + 0.75 for f in range(8)]


def test_memory_accounting_in_bytes() -> None:
    pool = make_pool(pages=10)
    spec = pool.spec
    assert spec.page_bytes == 2 * 2 * TOKENS * 2 * 4 * 4  # K+V, layers, tokens, heads, dim, fp32
    cache = pool.open_session("s", TOKENS)
    write(cache, 0, 3)
    usage = pool.usage()
    assert (usage.used_bytes, usage.free_bytes) == (3 * spec.page_bytes, 7 * spec.page_bytes)
    assert cache.usage().frames == (0, 1, 2)


def test_page_size_must_divide_the_frame() -> None:
    with pytest.raises(ValueError, match="page_size=4 must divide tokens_per_frame=6"):
        make_pool().open_session("s", 6)


def test_pages_smaller_than_a_frame() -> None:
    pool = KVPool(KVPoolSpec(num_layers=1, num_heads=1, head_dim=2, page_size=2, num_pages=12))
    cache = pool.open_session("s", 4, window_frames=3, sink_frames=1)
    for start in range(0, 5):
        cache.begin(start, 1)
        k = torch.full((1, 4, 1, 2), float(start))
        cache.attend(0, k[:, :1], k, k, AttentionBackend())
    assert cache.frames == [0, 3, 4] and len(cache.pages) == 6
    k, _ = cache.layer_kv(0)
    assert k[::2, 0, 0].tolist() == [0, 0, 3, 3, 4, 4]


def gathered_attention(cache, layer: int, q: torch.Tensor) -> torch.Tensor:
    """Attention over the cached frames gathered in frame order (the layout before the ring)."""
    k, v = cache.layer_kv(layer)
    return AttentionBackend().dense(q, k.unsqueeze(0), v.unsqueeze(0))


def test_a_rolling_window_is_read_as_one_view_of_its_ring() -> None:
    """Window 7 / sink 1 / blocks of 3: once the ring is full, attention reads every page in place."""
    torch.manual_seed(0)
    pool = make_pool()
    other = pool.open_session("o", TOKENS)
    write(other, 0, 2)  # the ring starts after another session's pages
    cache = pool.open_session("s", TOKENS, window_frames=7, sink_frames=1)
    backend = AttentionBackend()
    for block in range(6):
        cache.begin(3 * block, 3)
        q, k, v = (torch.randn(1, 3 * TOKENS, 2, 4) for _ in range(3))
        out = cache.attend(0, q, k, v, backend)
        torch.testing.assert_close(out, gathered_attention(cache, 0, q), rtol=0, atol=1e-6)
        pages = cache.layer_pages(0)[2].tolist()
        assert pages == list(range(pages[0], pages[0] + len(pages)))  # one run: a view, no gather
    assert cache.frames == [0, 12, 13, 14, 15, 16, 17]
    assert pool.usage().used_pages == 2 + 7


def test_a_frames_ring_slot_depends_only_on_its_index() -> None:
    """A session rebuilt from its first frame reads its frames in the same order: same bits."""
    torch.manual_seed(0)
    pool = make_pool(pages=20)
    live = pool.open_session("live", TOKENS, window_frames=5, sink_frames=1)
    for block in range(5):
        write(live, 2 * block, 2, marker=0.5)
    replayed = pool.open_session("replayed", TOKENS, window_frames=5, sink_frames=1)
    write(replayed, 0, 1, marker=0.5)
    for block in range(5):  # other block sizes, same frames
        write(replayed, 1 + 2 * block, 2 if block < 4 else 1, marker=0.5)
    assert replayed.frames == live.frames == [0, 6, 7, 8, 9]
    q = torch.randn(1, 2 * TOKENS, 2, 4)
    for cache in (live, replayed):
        cache.begin(10, 2)
    k, v = frame_kv([10, 11])
    outs = [cache.attend(1, q, k, v, AttentionBackend()) for cache in (live, replayed)]
    assert torch.equal(outs[0], outs[1])


def test_a_block_longer_than_the_rolling_window_is_refused_intact() -> None:
    pool = make_pool()
    cache = pool.open_session("s", TOKENS, window_frames=4, sink_frames=1)
    write(cache, 0, 2)
    with pytest.raises(KVCapacityError, match="writes 4 frames at once.*keeps 3 frames after its 1 sink"):
        cache.begin(2, 4)
    assert cached_frames(cache) == [0, 1]


def test_a_ring_survives_the_host_round_trip() -> None:
    pool = make_pool(host_pages=8)
    cache = pool.open_session("s", TOKENS, window_frames=5, sink_frames=2)
    for block in range(4):
        write(cache, 2 * block, 2)
    before = [cache.layer_kv(layer) for layer in range(2)]
    cache.offload()
    assert pool.usage().used_pages == 0
    write(pool.open_session("o", TOKENS), 0, 1)  # the ring comes back elsewhere
    write(cache, 8, 2)
    assert cached_frames(cache) == [0, 1, 7, 8, 9]
    cache.offload()
    cache.prefetch()
    for layer in range(2):
        k, _ = cache.layer_kv(layer)
        assert torch.equal(k[: 2 * TOKENS], before[layer][0][: 2 * TOKENS])  # the sink, moved intact
    assert cache.usage().device_pages == 5
