"""Causal Wan DiT (Wan2.1 T2V architecture, block-causal inference with a KV cache).

One readable file whose parameter names match the Wan2.1 / Self Forcing / CausVid checkpoints
(`blocks.N.self_attn.q.weight`, ...). Inputs use the pipeline layout [B, F, C, h, w]. Each
latent frame has its own timestep, so every frame gets its own 6-way modulation.

`forward_batch` runs the pending calls of several sessions as one forward (continuous batching):
their token rows are concatenated, so the linear layers, norms and FFN run once over all of them,
while self-attention (each session's own KV pages) and cross-attention (its own prompt) run per
session. Every op is per token row or per session, and on CPU an fp32 matmul gives a row the same
bits whatever other rows it is computed with, so a session's output does not depend on its batch.

Numerics follow the reference: the sinusoidal time embedding and RoPE are computed in float64,
modulation and norms in float32, and x0 is recovered from the flow prediction by the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.attention.backends import AttentionBackend, get_backend
from engine.families.wan.keyboard import KeyboardBranch, neutral_rows
from engine.families.wan.rope import RopeTable, apply_rope
from engine.kv.protocol import PagedAttentionCache, SelfAttentionCache
from inferix.spec.architectures import WanDiTConfig


@dataclass
class CrossAttentionKV:
    """Per-layer cross-attention K/V of one prompt: computed once, reused by every block."""

    keys: list[Tensor]
    values: list[Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class DiTCall:
    """One session's pending DiT forward: latents x [1, F, C, h, w] at per-frame timesteps [1, F].

    `start_frame` / `position_offset` are those of `CausalWanDiT.forward`; `kind` names the call
    for the profiler ("denoise_step" or "context_pass"). `key_rows` [1, rows_before + F, keys]:
    the keys held in and before the call's frames, for a DiT with a keyboard branch (None: none held).
    """

    x: Tensor
    timesteps: Tensor
    prompt: CrossAttentionKV
    cache: SelfAttentionCache | None
    start_frame: int = 0
    position_offset: int = 0
    kind: str = "denoise_step"
    key_rows: Tensor | None = None

    @property
    def cache_only(self) -> bool:
        """A context pass: only the K/V it writes are kept, never its flow (see `denoise_step`)."""
        return self.kind == "context_pass" and self.cache is not None


def _attend_groups(
    queries: Sequence[Tensor],
    groups: Iterable[list[int]],
    attend: Callable[[list[int], Tensor], Tensor],
    out: list[Tensor],
) -> None:
    """One attention call per group of sessions over their stacked queries [n, rows, H, D]; each
    session's result (a batch of one) goes to `out[i]`."""
    for members in groups:
        result = attend(members, torch.cat([queries[i] for i in members]))
        for j, i in enumerate(members):
            out[i] = result[j : j + 1]


def _join(parts: list[Tensor], dim: int = 0) -> Tensor:
    """torch.cat, without the copy when there is one part (a forward of one call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


class PackedSelfAttention:
    """The self-attention cache of a batched forward: each session's rows attend to its own cache.

    Sessions whose caches are paged, with as many query rows and cached pages (the usual case once
    windows are full), attend in one kernel call where the backend says it pays
    (`AttentionBackend.batches_pages`: short caches, or a kernel that reads pages in place); the
    others one by one.
    """

    def __init__(self, caches: list[SelfAttentionCache], rows: list[int]) -> None:
        self.caches = caches
        self.rows = rows
        self.paged = all(isinstance(c, PagedAttentionCache) for c in caches)

    def begin(self, start_frame: int, num_frames: int) -> None:
        raise RuntimeError("the caches of a batched forward are begun one by one (CausalWanDiT.begin)")

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        for cache, ki, vi in zip(self.caches, k.split(self.rows, 1), v.split(self.rows, 1), strict=True):
            cache.store(layer, ki, vi)

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        parts = list(zip(self.caches, q.split(self.rows, 1), k.split(self.rows, 1), v.split(self.rows, 1), strict=True))
        if not self.paged:
            return torch.cat([cache.attend(layer, qi, ki, vi, backend) for cache, qi, ki, vi in parts], dim=1)
        groups: dict[tuple[int, int, int], list[int]] = {}
        tables = []
        out: list[Tensor] = [q] * len(parts)
        for i, (cache, qi, ki, vi) in enumerate(parts):
            paged = cast(PagedAttentionCache, cache)
            k_pages, v_pages, ids = paged.layer_pages(layer)
            tables.append((k_pages, v_pages, ids))
            if backend.batches_pages(qi, k_pages, ids.numel() * k_pages.shape[1]):
                paged.store(layer, ki, vi)
                groups.setdefault((k_pages.data_ptr(), qi.shape[1], ids.numel()), []).append(i)
            else:  # a long cache: read in place (a view of consecutive pages), not gathered
                out[i] = cache.attend(layer, qi, ki, vi, backend)

        def attend(members: list[int], stacked: Tensor) -> Tensor:
            k_pages, v_pages, _ = tables[members[0]]
            return backend.paged_batch(stacked, k_pages, v_pages, [tables[i][2] for i in members])

        _attend_groups([qi for _, qi, _, _ in parts], groups.values(), attend, out)
        return torch.cat(out, dim=1)


class SequenceParallelHook(Protocol):
    """What the DiT asks of sequence parallelism (implemented in `engine.parallel`).

    With a hook set, each rank of a pod holds the same run of every frame's tokens (frame-major)
    from the patch embedding to the head. Everything but self-attention is per token or per frame,
    so only self-attention and the final gather talk to the other ranks. The hook also tells the
    pipeline what one rank's KV cache holds.
    """

    def shard(self, tokens: Tensor, rotations: Tensor, frames: int) -> tuple[Tensor, Tensor]:
        """This rank's tokens [B, F*S/P, dim] of a block and their RoPE rotations."""
        ...

    def attention_cache(self, cache: SelfAttentionCache | None) -> SelfAttentionCache:
        """The cache the self-attention layers call: it runs attention across the ranks."""
        ...

    def gather(self, tokens: Tensor, frames: int) -> Tensor:
        """Every rank's head output, back in (f, h, w) token order [B, F*S, C] on every rank."""
        ...

    def cache_layout(self, num_heads: int, tokens_per_frame: int) -> tuple[int, int]:
        """(heads, tokens of one frame) that this rank's KV cache holds."""
        ...


def sinusoidal_embedding(dim: int, positions: Tensor) -> Tensor:
    """cat[cos(t*w), sin(t*w)] with w_j = 10000^(-j/half), in float64 (as the reference)."""
    half = dim // 2
    pos = positions.to(torch.float64)
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=pos.device).div(half))
    angles = torch.outer(pos, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32, affine parameters included (bf16/fp16 weights stay exact)."""

    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type_as(x)


class _Attention(nn.Module):
    """q/k/v/o projections with RMS-normed q and k over the full dim (the checkpoints' names)."""

    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        dim = config.dim
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q: nn.Module = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()
        self.norm_k: nn.Module = RMSNorm(dim, config.eps) if config.qk_norm else nn.Identity()


class SelfAttention(_Attention):
    def forward(
        self,
        x: Tensor,
        rotations: Tensor,
        layer: int,
        cache: SelfAttentionCache | None,
        backend: AttentionBackend,
    ) -> Tensor:
        k, v = self._keys_values(x, rotations)
        q = apply_rope(self.norm_q(self.q(x)).view(self._heads(x)), rotations).type_as(v)
        out = backend.dense(q, k, v) if cache is None else cache.attend(layer, q, k, v, backend)
        return self.o(out.flatten(2))

    def store(self, x: Tensor, rotations: Tensor, layer: int, cache: SelfAttentionCache) -> None:
        """Only write the K/V of tokens x into the cache (no query, no attention)."""
        cache.store(layer, *self._keys_values(x, rotations))

    def _heads(self, x: Tensor) -> tuple[int, int, int, int]:
        return (x.shape[0], x.shape[1], self.num_heads, self.head_dim)

    def _keys_values(self, x: Tensor, rotations: Tensor) -> tuple[Tensor, Tensor]:
        """Post-RoPE keys and values [B, S, H, D] of tokens x [B, S, dim]."""
        v = self.v(x).view(self._heads(x))
        return apply_rope(self.norm_k(self.k(x)).view(self._heads(x)), rotations).type_as(v), v


class CrossAttention(_Attention):
    def project_context(self, context: Tensor) -> tuple[Tensor, Tensor]:
        b, n, _ = context.shape
        shape = (b, n, self.num_heads, self.head_dim)
        return self.norm_k(self.k(context)).view(shape), self.v(context).view(shape)

    def forward(
        self, x: Tensor, prompts: list[tuple[Tensor, Tensor]], rows: list[int], backend: AttentionBackend
    ) -> Tensor:
        """Rows `rows[i]` of x (in order) attend to prompt K/V `prompts[i]`."""
        b, s, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, s, self.num_heads, self.head_dim)
        if len(prompts) == 1:
            return self.o(backend.dense(q, *prompts[0]).flatten(2))
        # One kernel call for the sessions with as many rows and prompt tokens (the usual case).
        queries = q.split(rows, 1)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (qi, (k, _)) in enumerate(zip(queries, prompts, strict=True)):
            groups.setdefault((qi.shape[1], k.shape[1]), []).append(i)
        out: list[Tensor] = list(queries)

        def attend(members: list[int], stacked: Tensor) -> Tensor:
            keys = torch.cat([prompts[i][0] for i in members])
            return backend.dense(stacked, keys, torch.cat([prompts[i][1] for i in members]))

        _attend_groups(queries, groups.values(), attend, out)
        return self.o(torch.cat(out, 1).flatten(2))


class AttentionBlock(nn.Module):
    def __init__(self, config: WanDiTConfig, layer: int = 0) -> None:
        super().__init__()
        dim = config.dim
        self.norm1 = LayerNorm(dim, config.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(config)
        self.norm3: nn.Module = (
            LayerNorm(dim, config.eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        )
        self.cross_attn = CrossAttention(config)
        self.norm2 = LayerNorm(dim, config.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        action = config.action
        self.keyboard = KeyboardBranch(action, dim, config.eps) if action and layer in action.layers else None

    def forward(
        self,
        x: Tensor,
        e: Tensor,
        rotations: Tensor,
        layer: int,
        prompts: list[tuple[Tensor, Tensor]],
        rows: list[int],
        cache: SelfAttentionCache | None,
        backend: AttentionBackend,
        key_rows: list[Tensor] | None = None,
    ) -> Tensor:
        # x: [B, F*S, dim]; e: [B, F, 6, dim] float32 (one modulation per latent frame). In a batched
        # forward the sessions' frames follow each other (same S), so this layout still holds.
        frames = e.shape[1]
        shift1, scale1, gate1, shift2, scale2, gate2 = self._modulation(e)

        def per_frame(t: Tensor) -> Tensor:
            return t.unflatten(1, (frames, -1))

        h = _modulate(self.norm1(x), shift1, scale1)
        y = self.self_attn(h, rotations, layer, cache, backend)
        x = x + (per_frame(y).float() * gate1).flatten(1, 2).type_as(x)
        x = x + self.cross_attn(self.norm3(x), prompts, rows, backend)
        if self.keyboard is not None and key_rows is not None:  # each call its own keys (rows in order)
            x = x + torch.cat(
                [self.keyboard(part, keys) for part, keys in zip(x.split(rows, 1), key_rows, strict=True)], 1
            )
        y = self.ffn(_modulate(self.norm2(x), shift2, scale2))
        return x + (per_frame(y).float() * gate2).flatten(1, 2).type_as(x)

    def store_kv(self, x: Tensor, e: Tensor, rotations: Tensor, layer: int, cache: SelfAttentionCache) -> None:
        """What `forward` writes into the cache, and nothing else: the self-attention K/V of x."""
        shift1, scale1 = self._modulation(e)[:2]
        self.self_attn.store(_modulate(self.norm1(x), shift1, scale1), rotations, layer, cache)

    def _modulation(self, e: Tensor) -> tuple[Tensor, ...]:
        """(shift, scale, gate) of self-attention, then of the FFN, each [B, F, 1, dim] float32."""
        return (self.modulation.unsqueeze(1) + e).chunk(6, dim=2)


def _modulate(normed: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """Normed tokens [B, F*S, dim] scaled and shifted per frame (shift / scale [B, F, 1, dim]) in float32."""
    frames = shift.shape[1]
    return (normed.unflatten(1, (frames, -1)).float() * (1 + scale) + shift).flatten(1, 2).type_as(normed)


class Head(nn.Module):
    def __init__(self, config: WanDiTConfig) -> None:
        super().__init__()
        out = config.out_dim * math.prod(config.patch_size)
        self.norm = LayerNorm(config.dim, config.eps, elementwise_affine=False)
        self.head = nn.Linear(config.dim, out)
        self.modulation = nn.Parameter(torch.randn(1, 2, config.dim) / config.dim**0.5)

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        # e: [B, F, 1, dim] float32
        frames = e.shape[1]
        shift, scale = (self.modulation.unsqueeze(1) + e).chunk(2, dim=2)
        h = self.norm(x).unflatten(1, (frames, -1)).float() * (1 + scale) + shift
        return self.head(h.flatten(1, 2).type_as(x))


class CausalWanDiT(nn.Module):
    """Wan2.1 DiT for block-causal generation: `forward` denoises one block against a KV cache."""

    def __init__(self, config: WanDiTConfig, attention_backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.blocks = nn.ModuleList([AttentionBlock(config, i) for i in range(config.num_layers)])
        self.head = Head(config)
        self.rope = RopeTable(config.head_dim, config.rope_max_positions, config.rope_theta)
        self.backend = get_backend(attention_backend)
        self.parallel: SequenceParallelHook | None = None
        self._time_cache: dict[tuple[object, ...], tuple[Tensor, Tensor]] = {}
        # `denoise_step` compiled (`engine.compiled.compile_dit`); None: it runs eagerly.
        self.compiled_step: Callable[..., Tensor | None] | None = None

    def set_attention_backend(self, name: str) -> None:
        self.backend = get_backend(name)

    def set_sequence_parallel(self, hook: SequenceParallelHook | None) -> None:
        """Run every forward sharded over a pod's ranks (None: this process alone, the default)."""
        self.parallel = hook

    # ---- prompt -----------------------------------------------------------------------------
    def encode_prompt(self, prompt_embeds: Tensor) -> CrossAttentionKV:
        """Text-encoder output [B, L<=text_len, text_dim] -> per-layer cross-attention K/V.

        Shorter prompts are zero-padded to `text_len`; like the reference, cross-attention then
        attends to all `text_len` positions (padding rows become the embedding's bias).
        """
        cfg = self.config
        if prompt_embeds.dim() != 3 or prompt_embeds.shape[-1] != cfg.text_dim:
            raise ValueError(
                f"prompt_embeds must have shape [batch, tokens<= {cfg.text_len}, text_dim={cfg.text_dim}], "
                f"got {list(prompt_embeds.shape)}"
            )
        if prompt_embeds.shape[1] > cfg.text_len:
            raise ValueError(f"prompt_embeds has {prompt_embeds.shape[1]} tokens; text_len is {cfg.text_len}")
        param = self.patch_embedding.weight
        context = prompt_embeds.to(device=param.device, dtype=param.dtype)
        pad = cfg.text_len - context.shape[1]
        if pad:
            context = torch.cat([context, context.new_zeros(context.shape[0], pad, context.shape[2])], dim=1)
        context = self.text_embedding(context)
        keys, values = [], []
        for block in self.blocks:
            k, v = cast(AttentionBlock, block).cross_attn.project_context(context)
            keys.append(k)
            values.append(v)
        return CrossAttentionKV(keys, values)

    # ---- forward ----------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        timesteps: Tensor,
        prompt: CrossAttentionKV,
        cache: SelfAttentionCache | None = None,
        start_frame: int = 0,
        position_offset: int = 0,
        key_rows: Tensor | None = None,
    ) -> Tensor:
        """Flow prediction for latents x [B, F, C, h, w] with per-frame timesteps [B, F].

        `start_frame` is the absolute latent-frame index of x[:, 0] (the cache slots); its RoPE
        time position is `start_frame - position_offset`, the offset of a session that re-based
        its positions past the table's end (`rope.RopeRebase`; its cache's keys are turned to
        match). Without a cache the block attends only to itself. `key_rows` [B, rows_before + F,
        keys]: the keys held, for a DiT with a keyboard branch (see `DiTCall`).
        """
        call = DiTCall(x, timesteps, prompt, cache, start_frame, position_offset, key_rows=key_rows)
        flow = self.forward_batch([call])[0]
        assert flow is not None  # a denoising step's call
        return flow

    def begin(self, call: DiTCall) -> None:
        """Prepare the call's cache for the frames it writes (`KVCapacityError` when the pool is full)."""
        if call.cache is not None:
            self._grid(call)
            call.cache.begin(call.start_frame, call.x.shape[1] // self.config.patch_size[0])

    def forward_batch(self, calls: list[DiTCall], *, begun: bool = False) -> list[Tensor | None]:
        """The flow predictions of several sessions' calls, computed in one forward (None for each
        call when all of them are context passes: `DiTCall.cache_only`).

        The calls must share the latent size (one token count per frame); with more than one, each
        has a batch of one video and a cache (or none). `begun`: the caller has already called
        `begin` for every call, so that one session's full pool fails that session alone.

        The work is split in two: this eager prologue (validation, `begin`, the time embeddings'
        and RoPE tables' lookups, which keep Python state) and pure tensor code (`denoise_step` for
        a call alone), which is what `engine.compiled.compile_dit` compiles. A batched or
        sequence-parallel forward runs eagerly.
        """
        if not calls:
            return []
        grids = [self._grid(call) for call in calls]
        if len(calls) > 1:
            self._check_batchable(calls, grids)
        weight_dtype = self.patch_embedding.weight.dtype
        cfg = self.config
        b = calls[0].x.shape[0]
        frames = sum(grid[0] for grid in grids)
        # Per call: a few rows each, and BLAS gives small row counts their own kernels (see batching).
        embeddings = [self._time_embedding(c.timesteps, weight_dtype) for c in calls]
        e = _join([e for e, _ in embeddings])
        e0 = _join([e0 for _, e0 in embeddings])
        e0 = e0.float().unflatten(1, (6, cfg.dim)).unflatten(0, (b, frames))
        e_head = e.float().unflatten(0, (b, frames)).unsqueeze(2)
        device = self.patch_embedding.weight.device
        rotations = _join(
            [
                self.rope.rotations(c.start_frame - c.position_offset, *grid, device=device)
                for c, grid in zip(calls, grids, strict=True)
            ]
        )
        key_rows = self._key_rows(calls, grids)
        if len(calls) == 1:
            call = calls[0]
            if self.parallel is not None:
                return [self._sequence_parallel_step(call, e0, e_head, rotations, grids[0], begun)]
            if call.cache is not None and not begun:
                call.cache.begin(call.start_frame, grids[0][0])
            step = self.denoise_step if self.compiled_step is None else self.compiled_step
            args = (call.x, e0, e_head, rotations, call.prompt.keys, call.prompt.values, call.cache)
            if key_rows is None:
                return [step(*args, cache_only=call.cache_only)]
            return [step(*args, key_rows=key_rows[0], cache_only=call.cache_only)]
        if not begun:
            for call in calls:
                self.begin(call)
        rows = [math.prod(grid) for grid in grids]
        tokens = torch.cat([self._embed_patches(c.x) for c in calls], 1)
        prompts = [list(zip(c.prompt.keys, c.prompt.values, strict=True)) for c in calls]
        cache = PackedSelfAttention([cast(SelfAttentionCache, c.cache) for c in calls], rows)
        cache_only = all(c.cache_only for c in calls)
        out = self._blocks_and_head(
            tokens, e0, e_head, rotations, lambda i: [p[i] for p in prompts], rows, cache, key_rows, cache_only
        )
        if out is None:
            return [None] * len(calls)
        return [self._unpatchify(part, grid).float() for part, grid in zip(out.split(rows, 1), grids, strict=True)]

    def _key_rows(self, calls: list[DiTCall], grids: list[tuple[int, int, int]]) -> list[Tensor] | None:
        """Each call's key rows for a DiT with a keyboard branch (a call without: no key held); else None."""
        if self.config.action is None:
            return None
        weight = self.patch_embedding.weight
        return [
            neutral_rows(self.config.action, c.x.shape[0], grid[0], weight) if c.key_rows is None else c.key_rows
            for c, grid in zip(calls, grids, strict=True)
        ]

    def denoise_step(
        self,
        x: Tensor,
        e0: Tensor,
        e_head: Tensor,
        rotations: Tensor,
        keys: list[Tensor],
        values: list[Tensor],
        cache: SelfAttentionCache | None,
        key_rows: Tensor | None = None,
        cache_only: bool = False,
    ) -> Tensor | None:
        """The tensor code of one call's forward, its cache begun: patch embedding, blocks, head,
        unpatchify. No Python state is read but the cache's write and read ranges, so this compiles
        to one graph (`engine.compiled`), one per value of `cache_only`.

        x [B, F, C, h, w]; e0 [B, F', 6, dim] and e_head [B, F', 1, dim] the time modulations of its
        F' patched frames (float32); rotations its tokens' RoPE; keys / values the prompt's
        cross-attention K/V of every layer; key_rows those of a DiT with a keyboard branch. Returns
        the flow [B, F, C, h, w] in float32; with `cache_only` (a context pass) None: the last
        block stops once its K/V are stored (`_blocks_and_head`).
        """
        tokens = self._embed_patches(x)
        rows = [tokens.shape[1]]
        held = None if key_rows is None else [key_rows]
        out = self._blocks_and_head(
            tokens, e0, e_head, rotations, lambda i: [(keys[i], values[i])], rows, cache, held, cache_only
        )
        if out is None:
            return None
        pt, ph, pw = self.config.patch_size
        return self._unpatchify(out, (x.shape[1] // pt, x.shape[3] // ph, x.shape[4] // pw)).float()

    def _sequence_parallel_step(
        self,
        call: DiTCall,
        e0: Tensor,
        e_head: Tensor,
        rotations: Tensor,
        grid: tuple[int, int, int],
        begun: bool,
    ) -> Tensor | None:
        """`denoise_step` on this rank's shard of the tokens; the ranks talk in attention and the gather."""
        assert self.parallel is not None
        if self.config.action is not None:
            raise ValueError("a DiT with a keyboard branch runs in one process (no sequence parallelism)")
        tokens, rotations = self.parallel.shard(self._embed_patches(call.x), rotations, grid[0])
        cache = self.parallel.attention_cache(call.cache)
        if call.cache is not None and not begun:
            cache.begin(call.start_frame, grid[0])
        prompt = call.prompt
        rows = [tokens.shape[1]]
        # Every rank runs the same calls, so all of them skip the last block's collectives alike.
        out = self._blocks_and_head(
            tokens,
            e0,
            e_head,
            rotations,
            lambda i: [(prompt.keys[i], prompt.values[i])],
            rows,
            cache,
            None,
            call.cache_only,
        )
        if out is None:
            return None
        return self._unpatchify(self.parallel.gather(out, grid[0]), grid).float()

    def _embed_patches(self, x: Tensor) -> Tensor:
        """Latents [B, F, C, h, w] -> tokens [B, F'*h'*w', dim] in (f, h, w) order."""
        weight = self.patch_embedding.weight
        return self.patch_embedding(x.transpose(1, 2).to(weight.dtype)).flatten(2).transpose(1, 2)

    def _blocks_and_head(
        self,
        tokens: Tensor,
        e0: Tensor,
        e_head: Tensor,
        rotations: Tensor,
        prompts: Callable[[int], list[tuple[Tensor, Tensor]]],
        rows: list[int],
        cache: SelfAttentionCache | None,
        key_rows: list[Tensor] | None = None,
        cache_only: bool = False,
    ) -> Tensor | None:
        """The attention blocks and the head over token rows `rows[i]` of each call; `prompts(layer)`
        gives each call's cross-attention K/V of that layer, `key_rows[i]` its keys held.

        `cache_only`: the calls are context passes, whose flow nobody reads. The last block's K/V
        depend on the tokens entering it alone, so it stores them and stops there (None): its
        attention, cross-attention and FFN, and the head, are skipped. The cache holds the bits a
        full forward would have written.
        """
        blocks = [cast(AttentionBlock, block) for block in self.blocks]
        last = len(blocks) - 1 if cache_only else len(blocks)
        for i, block in enumerate(blocks[:last]):
            tokens = block(tokens, e0, rotations, i, prompts(i), rows, cache, self.backend, key_rows)
        if cache_only:
            if cache is None:
                raise ValueError("a cache-only forward needs a cache to write")
            blocks[last].store_kv(tokens, e0, rotations, last, cache)
            return None
        return cast(Tensor, self.head(tokens, e_head))

    def _time_embedding(self, timesteps: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Per-frame time embedding [B*F, dim] and its 6-way projection [B*F, 6*dim].

        On a CPU, kept per timestep values: a block's few timesteps recur in every block of every
        session, and there the small matmuls' fixed costs count. The key holds the weights' version
        counters, so loading new weights computes them anew. Not on a GPU (the key would wait for the
        device) nor with gradients (a training step builds its own graph).
        """
        if timesteps.device.type != "cpu" or torch.is_grad_enabled():
            return self._embed_time(timesteps, dtype)
        weights = (*self.time_embedding.parameters(), *self.time_projection.parameters())
        key = (tuple(timesteps.flatten().tolist()), dtype, tuple(w._version for w in weights))
        if key not in self._time_cache:
            if len(self._time_cache) >= 256:
                self._time_cache.clear()
            self._time_cache[key] = self._embed_time(timesteps, dtype)
        return self._time_cache[key]

    def _embed_time(self, timesteps: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        e = self.time_embedding(sinusoidal_embedding(self.config.freq_dim, timesteps.flatten()).to(dtype))
        return e, self.time_projection(e)

    def _grid(self, call: DiTCall) -> tuple[int, int, int]:
        """The call's token grid (frames, h, w) after patching; validates its shapes."""
        cfg = self.config
        x = call.x
        if x.dim() != 5 or x.shape[2] != cfg.in_dim:
            raise ValueError(f"x must be latents [batch, frames, {cfg.in_dim}, h, w], got {list(x.shape)}")
        b, frames, _, lat_h, lat_w = x.shape
        if call.timesteps.shape != (b, frames):
            raise ValueError(
                f"timesteps must have shape [batch, frames] = [{b}, {frames}], got {list(call.timesteps.shape)}"
            )
        pt, ph, pw = cfg.patch_size
        if frames % pt or lat_h % ph or lat_w % pw:
            raise ValueError(
                f"latent block {frames}x{lat_h}x{lat_w} must be divisible by the patch size {cfg.patch_size}"
            )
        return frames // pt, lat_h // ph, lat_w // pw

    def _check_batchable(self, calls: list[DiTCall], grids: list[tuple[int, int, int]]) -> None:
        if self.parallel is not None:
            raise ValueError("a sequence-parallel DiT runs one call per forward")
        if any(c.x.shape[0] != 1 for c in calls) or any(c.cache is None for c in calls):
            raise ValueError("a batched forward takes calls of one video each, every one with its cache")
        sizes = {grid[1:] for grid in grids}
        if len(sizes) > 1:
            raise ValueError(f"a batched forward takes calls of one latent size, got {sorted(sizes)}")

    def _unpatchify(self, x: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """[B, f*h*w, pt*ph*pw*C] -> [B, F, C, H, W] (the last axis is (pt, ph, pw, C), C fastest)."""
        pt, ph, pw = self.config.patch_size
        f, h, w = grid
        c = self.config.out_dim
        x = x.view(x.shape[0], f, h, w, pt, ph, pw, c)
        x = torch.einsum("bfhwpqrc->bfpchqwr", x)
        return x.reshape(x.shape[0], f * pt, c, h * ph, w * pw)
