"""A context pass stops at the last block's K/V: the cache holds the bits a full forward writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch
from torch import Tensor, nn

from engine.families.wan.dit import AttentionBlock, CausalWanDiT, CrossAttentionKV, DiTCall
from engine.kv import ContiguousKVCache, KVPool, KVPoolSpec, PagedSessionCache, SelfAttentionCache
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_dit

TOKENS = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
FRAMES, WINDOW, SINK, BLOCKS = 2, 5, 1, 5  # blocks 0-1 fill the window, 2-4 roll it


def paged(kv_dtype: str = "auto") -> Callable[[], SelfAttentionCache]:
    spec = KVPoolSpec(TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, TOKENS, 4 * WINDOW, kv_dtype=kv_dtype)
    pool = KVPool(spec)
    names = iter(range(100))
    return lambda: pool.open_session(f"s{next(names)}", TOKENS, WINDOW, SINK)


def contiguous() -> SelfAttentionCache:
    return ContiguousKVCache(
        TINY_DIT.num_layers,
        TINY_DIT.num_heads,
        TINY_DIT.head_dim,
        TOKENS,
        BLOCKS * FRAMES,
        WINDOW,
        SINK,
        torch.float32,
        torch.device("cpu"),
    )


def cached(cache: SelfAttentionCache, layer: int) -> tuple[Tensor, Tensor]:
    if isinstance(cache, ContiguousKVCache):
        return cache.k[layer].clone(), cache.v[layer].clone()
    assert isinstance(cache, PagedSessionCache)
    return cache.layer_kv(layer)


def assert_same_caches(ours: SelfAttentionCache, theirs: SelfAttentionCache) -> None:
    for layer in range(TINY_DIT.num_layers):
        for a, b in zip(cached(ours, layer), cached(theirs, layer), strict=True):
            assert torch.equal(a, b), f"layer {layer}: K/V differ"


def block_calls(
    dit: CausalWanDiT, text: CrossAttentionKV, cache: SelfAttentionCache, block: int, context_kind: str
) -> list[DiTCall]:
    """A block's denoising step and its context pass (as `context_kind`: a full forward when
    "denoise_step"), on latents that depend on the block alone."""
    generator = torch.Generator().manual_seed(block)
    x = torch.randn(1, FRAMES, TINY_DIT.in_dim, LATENT_H, LATENT_W, generator=generator)
    start = block * FRAMES
    return [
        DiTCall(x, torch.full((1, FRAMES), 750.0), text, cache, start),
        DiTCall(x * 0.5, torch.zeros(1, FRAMES), text, cache, start, kind=context_kind),
    ]


@pytest.mark.parametrize(
    "new_cache",
    [paged(), paged("int8"), contiguous],
    ids=["paged", "paged int8", "contiguous"],
)
def test_a_context_pass_writes_the_k_v_of_a_full_forward(new_cache: Callable[[], SelfAttentionCache]) -> None:
    dit = tiny_dit()
    text = dit.encode_prompt(prompt(0))
    cache_only, full = new_cache(), new_cache()
    with torch.no_grad():
        for block in range(BLOCKS):
            step, context = block_calls(dit, text, cache_only, block, "context_pass")
            full_step, full_context = block_calls(dit, text, full, block, "denoise_step")
            assert torch.equal(dit.forward_batch([step])[0], dit.forward_batch([full_step])[0])  # type: ignore[arg-type]
            assert dit.forward_batch([context]) == [None]
            assert dit.forward_batch([full_context])[0] is not None
            assert_same_caches(cache_only, full)


def test_a_context_pass_skips_the_last_block_and_the_head() -> None:
    dit = tiny_dit()
    text = dit.encode_prompt(prompt(0))
    ran: list[str] = []
    last = cast(AttentionBlock, dit.blocks[-1])
    modules: dict[str, nn.Module] = {"last attention": last.self_attn, "last FFN": last.ffn, "head": dit.head}
    for name, module in modules.items():
        module.register_forward_hook(lambda *_, name=name: ran.append(name))
    cache = paged()()
    step, context = block_calls(dit, text, cache, 0, "context_pass")
    with torch.no_grad():
        dit.forward_batch([step])
        assert sorted(ran) == ["head", "last FFN", "last attention"]
        ran.clear()
        dit.forward_batch([context])
    assert ran == []


def test_batched_context_passes_write_the_k_v_of_a_batched_full_forward() -> None:
    dit = tiny_dit()
    text = dit.encode_prompt(prompt(0))
    new_cache = paged()
    cache_only, full = [new_cache(), new_cache()], [new_cache(), new_cache()]
    with torch.no_grad():
        for block in range(BLOCKS):
            for caches, kind in ((cache_only, "context_pass"), (full, "denoise_step")):
                steps, contexts = zip(*(block_calls(dit, text, c, block, kind) for c in caches), strict=True)
                dit.forward_batch(list(steps))
                flows = dit.forward_batch(list(contexts))
                assert [f is None for f in flows] == [kind == "context_pass"] * 2
            for ours, theirs in zip(cache_only, full, strict=True):
                assert_same_caches(ours, theirs)
        # beside a denoising step a context pass runs whole: the step's flow is needed
        step, context = block_calls(dit, text, cache_only[0], BLOCKS, "context_pass")
        other = block_calls(dit, text, cache_only[1], BLOCKS, "context_pass")[0]
        dit.forward_batch([step])
        assert all(f is not None for f in dit.forward_batch([context, other]))
