"""MAGI-1 VideoDiT (SandAI), one forward for every pass of its chunk-wise autoregressive pipeline.

Parameter names match the reference `VideoDiTModel` state dict (`videodit_blocks.layers.{i}.self_attention.
linear_qkv.q.weight`, `rope.bands`, `y_embedder.null_caption_embedding`, ...), so a checkpoint loads with
`load_state_dict(strict=True)`; nothing is computed in `__init__` that a load would not replace (build on the
meta device, load with `assign=True`).

The layout follows the reference: latents [N, C, T, H, W], tokens [S, N, D] in (t, h, w) order, K/V rows
[(S*N), G, 2*hd] in (token, batch) order with K after its LayerNorm-1p and RoPE. A call's self-attention keys
are `[prefix rows (a KV cache, shared by the batch) ; this call's fresh rows of the batch element]`; chunk `j`
attends to key rows `kv_ranges[j]` of that sequence and cross-attends to its own caption rows.

Numerics: the reference's fp32 islands (embedders, RoPE, q/k norms, the output projection, gating with the
post-norms, the final norm and linear) are computed in fp32 whatever the weights' dtype; the other matmuls,
LayerNorms and attention run in the weights' dtype. With fp32 weights everything is fp32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inferix.errors import UserError

# Sinusoidal width of the timestep embedding and the reference's x1000 rescale of t in [0, 1].
TIMESTEP_FREQ_DIM = 256
TIMESTEP_RESCALE = 1000.0
# linear_proj's input interleaves self- and cross-attention in 8 groups (the reference's TP8 layout).
PROJ_GROUPS = 8
# RoPE coordinates are rescaled as if the patch grid were 16x16 (the reference's base resolution).
ROPE_BASE_TOKENS = 16 * 16


@dataclass(frozen=True)
class MagiDiTConfig:
    """The `model_config` fields of a MAGI-1 DiT (reference `MagiConfig.model_config`)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    layernorm_epsilon: float
    x_rescale_factor: float
    half_channel_vae: bool
    patch_size: int
    t_patch_size: int
    in_channels: int
    out_channels: int
    cond_hidden_ratio: float
    caption_channels: int
    caption_max_length: int
    xattn_cond_hidden_ratio: float
    cond_gating_ratio: float
    gated_linear_unit: bool

    def __post_init__(self) -> None:
        positive = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups")
        for name in (*positive, "kv_channels", "patch_size", "t_patch_size", "in_channels", "out_channels"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"MAGI-1 DiT config: {name} must be a positive integer, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_query_groups:
            raise UserError(
                f"MAGI-1 DiT config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_query_groups ({self.num_query_groups}) for grouped-query attention"
            )
        if self.kv_channels % 8:
            raise UserError(
                f"MAGI-1 DiT config: kv_channels (head dim, {self.kv_channels}) must be a multiple of 8: RoPE "
                "rotates head_dim // 8 bands on each of the t, h and w axes"
            )
        if self.hidden_size != self.num_attention_heads * self.kv_channels:
            # The reference sizes RoPE from hidden_size // heads but rotates heads of kv_channels dims.
            raise UserError(
                f"MAGI-1 DiT config: hidden_size ({self.hidden_size}) must equal num_attention_heads x kv_channels "
                f"({self.num_attention_heads} x {self.kv_channels})"
            )
        if self.t_patch_size != 1:
            raise UserError(
                f"MAGI-1 DiT config: t_patch_size {self.t_patch_size} is not supported (every MAGI-1 model uses 1)"
            )
        if self.half_channel_vae and (self.in_channels % 2 or self.out_channels % 2):
            raise UserError(
                "MAGI-1 DiT config: half_channel_vae duplicates the latent channels, so in_channels and "
                f"out_channels must be even, got {self.in_channels} / {self.out_channels}"
            )
        if self.gate_dim != self.hidden_size:
            raise UserError(
                f"MAGI-1 DiT config: cond_gating_ratio must be 1.0 (gates scale the hidden state), "
                f"got {self.cond_gating_ratio}"
            )
        if self.cond_dim < 1 or self.xattn_dim < 1:
            raise UserError(
                "MAGI-1 DiT config: cond_hidden_ratio and xattn_cond_hidden_ratio must give at least one channel, "
                f"got {self.cond_hidden_ratio} / {self.xattn_cond_hidden_ratio}"
            )
        if self.layernorm_epsilon <= 0 or self.x_rescale_factor == 0:
            raise UserError(
                "MAGI-1 DiT config: layernorm_epsilon must be > 0 and x_rescale_factor non-zero, "
                f"got {self.layernorm_epsilon} / {self.x_rescale_factor}"
            )
        if self.caption_channels < 1 or self.caption_max_length < 2:
            raise UserError(
                "MAGI-1 DiT config: caption_channels must be >= 1 and caption_max_length >= 2 (the last two null "
                f"caption rows condition adaLN), got {self.caption_channels} / {self.caption_max_length}"
            )

    @classmethod
    def from_reference(cls, model_config: Mapping[str, Any]) -> MagiDiTConfig:
        """From the reference JSON (`magi_config["model_config"]`); model_name, params_dtype etc. are ignored."""
        names = [f.name for f in fields(cls)]
        missing = [name for name in names if name not in model_config]
        if missing:
            raise UserError(f"MAGI-1 DiT config: model_config lacks {', '.join(missing)}")
        if not model_config.get("apply_layernorm_1p", True):
            raise UserError("MAGI-1 DiT config: apply_layernorm_1p false is not supported (every MAGI-1 model uses it)")
        floats = {
            "layernorm_epsilon",
            "x_rescale_factor",
            "cond_hidden_ratio",
            "xattn_cond_hidden_ratio",
            "cond_gating_ratio",
        }
        values: dict[str, Any] = {}
        for name in names:
            value = model_config[name]
            if name in floats:
                values[name] = float(value)
            elif name in ("half_channel_vae", "gated_linear_unit"):
                values[name] = bool(value)
            else:
                values[name] = int(value)
        return cls(**values)

    @property
    def head_dim(self) -> int:
        return self.kv_channels

    @property
    def cond_dim(self) -> int:
        """Width of the timestep / adaLN condition (D/4 for every MAGI-1 model)."""
        return int(self.hidden_size * self.cond_hidden_ratio)

    @property
    def xattn_dim(self) -> int:
        return int(self.hidden_size * self.xattn_cond_hidden_ratio)

    @property
    def gate_dim(self) -> int:
        return int(self.hidden_size * self.cond_gating_ratio)

    @property
    def rope_bands(self) -> int:
        return self.kv_channels // 8


# ---- small layers ---------------------------------------------------------------------------


class LayerNorm1p(nn.Module):
    """The reference FusedLayerNorm with apply_layernorm_1p: gamma = weight + 1 (zero-centred weights)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight + 1, self.bias, self.eps)

    def forward_f32(self, x: Tensor) -> Tensor:
        """In fp32 whatever the weights' dtype (the reference's fp32 islands)."""
        return F.layer_norm(x.float(), self.weight.shape, self.weight.float() + 1, self.bias.float(), self.eps)


def _linear_f32(layer: nn.Linear, x: Tensor) -> Tensor:
    """`layer(x)` in fp32 (a no-op cast with fp32 weights)."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


class _TimestepEmbedder(nn.Module):
    def __init__(self, cond_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIMESTEP_FREQ_DIM, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, t: Tensor) -> Tensor:
        """[M] fp32 timesteps -> [M, cond_dim] fp32."""
        half = TIMESTEP_FREQ_DIM // 2
        # Same expression order as the reference so the fp32 frequencies and angles match bit for bit.
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None] * TIMESTEP_RESCALE
        t_freq = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        first, last = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
        return _linear_f32(last, F.silu(_linear_f32(first, t_freq)))


class _CaptionEmbedder(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.y_proj_xattn = nn.Sequential(nn.Linear(config.caption_channels, config.xattn_dim), nn.SiLU())
        self.y_proj_adaln = nn.Sequential(nn.Linear(config.caption_channels, config.cond_dim))
        self.null_caption_embedding = nn.Parameter(torch.zeros(config.caption_max_length, config.caption_channels))


class Rope(nn.Module):
    """Learnable 3-axis RoPE: `rope(frames, h2, w2)` -> (sin, cos), each [frames*h2*w2, 3*nb] fp32.

    The bands come from the checkpoint (this init is only the reference's default). Tables are kept per grid
    size and bands version when no gradient is recorded (the pipeline asks for the same few grids every call).
    """

    def __init__(self, num_bands: int) -> None:
        super().__init__()
        self.bands = nn.Parameter(1.0 / 10000 ** (torch.arange(num_bands, dtype=torch.float32) / num_bands))
        self._cache: dict[tuple[object, ...], tuple[Tensor, Tensor]] = {}

    def forward(self, frames: int, h2: int, w2: int) -> tuple[Tensor, Tensor]:
        bands = self.bands
        if torch.is_grad_enabled() or bands.device.type == "meta":
            return _rope_grid(bands, frames, h2, w2)
        key = (frames, h2, w2, str(bands.device), bands.data_ptr(), _version(bands))
        if key not in self._cache:
            if len(self._cache) >= 64:
                self._cache.clear()
            self._cache[key] = _rope_grid(bands, frames, h2, w2)
        return self._cache[key]


def _version(t: Tensor) -> int:
    """In-place update counter (inference tensors have none: they cannot change outside inference mode)."""
    return -1 if t.is_inference() else t._version


class _FinalLinear(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        out = config.patch_size * config.patch_size * config.t_patch_size * config.out_channels
        self.linear = nn.Linear(config.hidden_size, out, bias=False)


class _AdaModulate(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(config.cond_dim, 2 * config.gate_dim))

    def forward(self, condition: Tensor) -> tuple[Tensor, Tensor]:
        """Gates (msa, mlp), each [N, R, D] fp32: tanh = the reference's softcap at 1.0."""
        proj = self.proj[0]
        assert isinstance(proj, nn.Linear)
        gate_msa, gate_mlp = torch.tanh(_linear_f32(proj, F.silu(condition.float()))).chunk(2, dim=-1)
        return gate_msa, gate_mlp


class _QKVProjection(nn.Module):
    """The reference CustomLayerNormLinear: one plain LayerNorm feeding four bias-free projections."""

    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        d = config.hidden_size
        q_size = config.num_attention_heads * config.head_dim
        kv_size = config.num_query_groups * config.head_dim
        self.layer_norm = nn.LayerNorm(d, eps=config.layernorm_epsilon)
        self.q = nn.Linear(d, q_size, bias=False)
        self.qx = nn.Linear(d, q_size, bias=False)
        self.k = nn.Linear(d, kv_size, bias=False)
        self.v = nn.Linear(d, kv_size, bias=False)


class MagiParallelHook(Protocol):
    """What the DiT asks of sequence parallelism (`engine.families.magi.parallel.MagiUlysses`).

    Outside attention a rank holds an equal run of every latent frame's tokens; inside it, all tokens of
    `groups` KV groups (from `first_group`) and their `heads` query heads.
    """

    heads: int
    groups: int

    @property
    def size(self) -> int: ...

    @property
    def first_group(self) -> int: ...

    def check_tokens(self, tokens_per_frame: int) -> None: ...

    def shard(self, rows: Tensor, frames: int) -> Tensor: ...

    def unshard(self, rows: Tensor, frames: int) -> Tensor: ...

    def scatter_heads(self, q: Tensor, kv: Tensor, qx: Tensor, frames: int) -> tuple[Tensor, Tensor, Tensor]: ...

    def gather_heads(self, core: Tensor, cross: Tensor, frames: int) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class _CaptionGroup:
    """(batch element, chunk) segments with as many caption rows: one cross-attention call."""

    segments: Tensor | None  # indices b*R + j, or None: every segment, in order
    rows: Tensor | None  # [segments, length] indices into the caption rows, or None: all of them, in order
    length: int


@dataclass(frozen=True)
class _Plan:
    """How one forward's rows attend (shared by every layer)."""

    num_chunks: int  # R
    chunk_tokens: int  # ctn
    # Self-attention: runs of consecutive chunks [j0, j1) sharing one key range [start, end).
    runs: tuple[tuple[int, int, int, int], ...]
    captions: tuple[_CaptionGroup, ...]
    frames: int  # latent frames of x (the token layout of a sequence-parallel rank)
    parallel: MagiParallelHook | None  # None: this process holds every token and head


class _SelfAttention(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        hd = config.head_dim
        self.heads = config.num_attention_heads
        self.groups = config.num_query_groups
        self.head_dim = hd
        self.linear_qkv = _QKVProjection(config)
        self.linear_kv_xattn = nn.Linear(config.xattn_dim, 2 * config.num_query_groups * hd, bias=False)
        self.linear_proj = nn.Linear(2 * config.num_attention_heads * hd, config.hidden_size, bias=False)
        eps = config.layernorm_epsilon
        self.q_layernorm = LayerNorm1p(hd, eps)
        self.q_layernorm_xattn = LayerNorm1p(hd, eps)
        self.k_layernorm = LayerNorm1p(hd, eps)
        self.k_layernorm_xattn = LayerNorm1p(hd, eps)

    def forward(
        self, x: Tensor, sin: Tensor, cos: Tensor, prefix: Tensor | None, y_x: Tensor, plan: _Plan
    ) -> tuple[Tensor, Tensor]:
        """x [S, N, D] -> (linear_proj output [S, N, D] fp32, fresh K|V [S, N, G, 2*hd]).

        Sequence parallel: x holds this rank's tokens and the fresh K|V all tokens of this rank's groups.
        """
        s, n, _ = x.shape
        a = self.linear_qkv.layer_norm(x)
        q = self._rotated(self.linear_qkv.q(a).view(s, n, self.heads, -1), self.q_layernorm, sin, cos)
        k = self._rotated(self.linear_qkv.k(a).view(s, n, self.groups, -1), self.k_layernorm, sin, cos)
        v = self.linear_qkv.v(a).view(s, n, self.groups, -1)
        kv = torch.cat([k.to(v.dtype), v], dim=-1)
        qx = self.q_layernorm_xattn.forward_f32(self.linear_qkv.qx(a).view(s, n, self.heads, -1)).to(v.dtype)
        q = q.to(v.dtype)
        parallel = plan.parallel
        if parallel is not None:  # every token of this rank's KV groups: attention below is unchanged
            q, kv, qx = parallel.scatter_heads(q, kv, qx, plan.frames)
        core = self._core(q, kv, prefix, plan)
        cross = self._cross(qx, y_x, plan)
        if parallel is not None:  # back to this rank's tokens, every head: linear_proj mixes them all
            core, cross = parallel.gather_heads(core, cross, plan.frames)
        # "sq b (n hn hd) -> sq b (hn n hd)", n=2, hn=8: the reference's TP8 interleave of core and cross.
        both = torch.cat([core, cross], dim=-1).view(s, n, 2, PROJ_GROUPS, -1).transpose(2, 3).reshape(s, n, -1)
        return _linear_f32(self.linear_proj, both), kv

    @staticmethod
    def _rotated(x: Tensor, norm: LayerNorm1p, sin: Tensor, cos: Tensor) -> Tensor:
        """LayerNorm-1p over the head dim then RoPE, in fp32; x [S, N, heads, hd], sin/cos [S, 3*nb]."""
        return apply_rope(norm.forward_f32(x), sin[:, None, None], cos[:, None, None])

    def _expand(self, x: Tensor) -> Tensor:
        """[B, G, L, hd] -> [B, H, L, hd]: query head h reads kv group h // (H / G)."""
        return x.repeat_interleave(self.heads // self.groups, dim=1)

    def _core(self, q: Tensor, kv: Tensor, prefix: Tensor | None, plan: _Plan) -> Tensor:
        """Block-causal self-attention -> [S, N, H*hd]; each batch element over [prefix ; its fresh rows]."""
        s, n = q.shape[:2]
        keys = kv.transpose(0, 1)  # [N, S, G, 2hd]
        if prefix is not None and prefix.shape[0]:
            keys = torch.cat([prefix.to(kv.dtype).unsqueeze(0).expand(n, -1, -1, -1), keys], dim=1)
        keys = keys.permute(0, 2, 1, 3)  # [N, G, P+S, 2hd]
        queries = q.permute(1, 2, 0, 3)  # [N, H, S, hd]
        ctn, hd = plan.chunk_tokens, self.head_dim
        outs = []
        for j0, j1, start, end in plan.runs:
            # GQA by repeating only this run's key range (the whole sequence repeated would be H/G times larger).
            k = self._expand(keys[:, :, start:end, :hd])
            v = self._expand(keys[:, :, start:end, hd:])
            outs.append(F.scaled_dot_product_attention(queries[:, :, j0 * ctn : j1 * ctn], k, v))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        return out.permute(2, 0, 1, 3).reshape(s, n, -1)

    def _cross(self, qx: Tensor, y_x: Tensor, plan: _Plan) -> Tensor:
        """Each (batch element, chunk) attends to its own caption rows -> [S, N, H*hd]."""
        s, n, h, hd = qx.shape
        r, ctn = plan.num_chunks, plan.chunk_tokens
        weight, groups = self.linear_kv_xattn.weight, self.groups
        if plan.parallel is not None:  # only this rank's groups (rows g*2hd.. of the projection)
            groups = plan.parallel.groups
            weight = weight[plan.parallel.first_group * 2 * hd : (plan.parallel.first_group + groups) * 2 * hd]
        kvx = F.linear(y_x, weight).view(y_x.shape[0], groups, 2 * hd)
        kx = self.k_layernorm_xattn.forward_f32(kvx[..., :hd]).to(kvx.dtype)
        vx = kvx[..., hd:]
        segments = qx.view(r, ctn, n, h, hd).permute(2, 0, 3, 1, 4).reshape(n * r, h, ctn, hd)
        out = segments if len(plan.captions) == 1 else torch.empty_like(segments)
        for group in plan.captions:
            if group.rows is None:
                k, v = kx.view(-1, group.length, groups, hd), vx.view(-1, group.length, groups, hd)
            else:
                k, v = kx[group.rows], vx[group.rows]
            q = segments if group.segments is None else segments[group.segments]
            o = F.scaled_dot_product_attention(q, self._expand(k.transpose(1, 2)), self._expand(v.transpose(1, 2)))
            if group.segments is None:
                out = o
            else:
                out[group.segments] = o
        return out.view(n, r, h, ctn, hd).permute(1, 3, 0, 2, 4).reshape(s, n, h * hd)


class _MLP(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.gated = config.gated_linear_unit
        fc1_out = 2 * config.ffn_hidden_size if self.gated else config.ffn_hidden_size
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon)
        self.linear_fc1 = nn.Linear(config.hidden_size, fc1_out, bias=False)
        self.linear_fc2 = nn.Linear(config.ffn_hidden_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear_fc1(self.layer_norm(x))
        if self.gated:  # SwiGLU: silu(first half) * second half
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return self.linear_fc2(h)


class _Layer(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.ada_modulate_layer = _AdaModulate(config)
        self.self_attention = _SelfAttention(config)
        self.self_attn_post_norm = LayerNorm1p(config.hidden_size, config.layernorm_epsilon)
        self.mlp = _MLP(config)
        self.mlp_post_norm = LayerNorm1p(config.hidden_size, config.layernorm_epsilon)

    def forward(
        self,
        x: Tensor,
        condition: Tensor,
        sin: Tensor,
        cos: Tensor,
        prefix: Tensor | None,
        y_x: Tensor,
        plan: _Plan,
    ) -> tuple[Tensor, Tensor]:
        """x [S, N, D] -> (x, fresh K|V [S, N, G, 2*hd]); condition [N, R, cond_dim]."""
        gate_msa, gate_mlp = self.ada_modulate_layer(condition)
        attn, kv = self.self_attention(x, sin, cos, prefix, y_x, plan)
        x = _gated_residual(attn, x, gate_msa, self.self_attn_post_norm, plan)
        x = _gated_residual(self.mlp(x), x, gate_mlp, self.mlp_post_norm, plan)
        return x, kv


def _gated_residual(update: Tensor, residual: Tensor, gate: Tensor, post_norm: LayerNorm1p, plan: _Plan) -> Tensor:
    """residual + LN1p(update * gate of the token's chunk), in fp32 ("sandwich": gate before the post-norm)."""
    s, n, d = update.shape
    per_chunk = gate.transpose(0, 1).unsqueeze(1)  # [R, 1, N, D]
    # s // R, not chunk_tokens: a sequence-parallel rank holds s = R * (its run of each chunk) tokens.
    gated = (update.float().view(plan.num_chunks, s // plan.num_chunks, n, d) * per_chunk).view(s, n, d)
    return (post_norm.forward_f32(gated) + residual.float()).to(residual.dtype)


class _Blocks(nn.Module):
    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(config) for _ in range(config.num_layers)])
        self.final_layernorm = LayerNorm1p(config.hidden_size, config.layernorm_epsilon)


def apply_rope(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """flash-attn non-interleaved rotary on the first 2*sin.shape[-1] dims of x; the rest passes through."""
    rot = sin.shape[-1]
    a, b, rest = x[..., :rot], x[..., rot : 2 * rot], x[..., 2 * rot :]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, rest], dim=-1)


# ---- the model --------------------------------------------------------------------------------


class MagiDiT(nn.Module):
    """MAGI-1 VideoDiTModel; `forward` runs one pass (distill, cfg cond / cond_pre / uncond) of a window."""

    def __init__(self, config: MagiDiTConfig) -> None:
        super().__init__()
        self.config = config
        p, pt = config.patch_size, config.t_patch_size
        self.x_embedder = nn.Conv3d(
            config.in_channels, config.hidden_size, kernel_size=(pt, p, p), stride=(pt, p, p), bias=False
        )
        self.t_embedder = _TimestepEmbedder(config.cond_dim)
        self.y_embedder = _CaptionEmbedder(config)
        self.rope = Rope(config.rope_bands)
        self.videodit_blocks = _Blocks(config)
        self.final_linear = _FinalLinear(config)
        self.parallel: MagiParallelHook | None = None

    def set_sequence_parallel(self, hook: MagiParallelHook | None) -> None:
        """Run every forward on this rank's share of tokens and KV groups (None: single process).

        The fresh K|V returned and the prefix expected then hold `kv_group_split`-th of the KV groups."""
        if hook is not None and hook.groups * hook.size != self.config.num_query_groups:
            raise ValueError(
                f"the sequence-parallel hook splits {hook.groups * hook.size} KV groups, the model has "
                f"{self.config.num_query_groups}"
            )
        self.parallel = hook

    @property
    def kv_group_split(self) -> int:
        """Ranks the KV groups are split over (this rank's cache holds num_query_groups / it of them)."""
        return 1 if self.parallel is None else self.parallel.size

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype of the transformer body (its big projections)."""
        layer = self.videodit_blocks.layers[0]
        assert isinstance(layer, _Layer)
        return layer.self_attention.linear_qkv.q.weight.dtype

    def keep_fp32_islands(self) -> MagiDiT:
        """Cast back to fp32 the weights the reference keeps in fp32 when the model runs in bf16.

        The reference's `_high_precision_promoter`: embedders, RoPE bands, final linear and norm, the self-attention
        q/k norms (not the cross-attention ones) and the post-norms. The forward computes those parts in fp32
        either way; this keeps their weights unrounded when fp32 values are loaded into them afterwards
        (`load_state_dict` without assign copies into each parameter's dtype).
        """
        for module in (self.x_embedder, self.y_embedder, self.t_embedder, self.final_linear, self.rope):
            module.float()
        self.videodit_blocks.final_layernorm.float()
        for layer in self.videodit_blocks.layers:
            assert isinstance(layer, _Layer)
            for norm in (layer.self_attention.q_layernorm, layer.self_attention.k_layernorm):
                norm.float()
            layer.self_attn_post_norm.float()
            layer.mlp_post_norm.float()
        return self

    # ---- pieces ---------------------------------------------------------------------------
    def embed(self, x: Tensor) -> Tensor:
        """Latents [N, C, T, H, W] -> tokens [S, N, D] in (t, h, w) order (x_rescale and half_channel_vae included)."""
        cfg = self.config
        x = x.float() * cfg.x_rescale_factor
        if cfg.half_channel_vae:  # the model was trained on a 32-channel VAE: feed the 16 channels twice
            x = torch.cat([x, x], dim=1)
        tokens = F.conv3d(x, self.x_embedder.weight.float(), stride=self.x_embedder.stride)
        return tokens.flatten(2).permute(2, 0, 1).to(self.dtype)

    def condition(self, t: Tensor, caption_dropout: bool, distill_dt: float | None) -> Tensor:
        """adaLN condition [N, R, cond_dim] fp32 from per-chunk timesteps [N, R].

        adaLN never sees the prompt: it uses the null caption's row -1 (caption dropped: cond_pre / uncond) or
        -2 (cond, distill).
        """
        t_flat = t.flatten().float()
        emb = self.t_embedder(t_flat)
        if distill_dt is not None:  # distill models are conditioned on the step size too
            emb = emb + self.t_embedder(torch.full_like(t_flat, distill_dt))
        null = self.y_embedder.null_caption_embedding[-1 if caption_dropout else -2]
        adaln = self.y_embedder.y_proj_adaln[0]
        assert isinstance(adaln, nn.Linear)
        return emb.view(t.shape[0], t.shape[1], -1) + _linear_f32(adaln, null[None])

    def caption_tokens(self, captions: Sequence[Sequence[Tensor]]) -> Tensor:
        """Valid caption rows of every (batch element, chunk), in that order -> SiLU(y_proj_xattn) [rows, D_x]."""
        rows = torch.cat([rows_j for per_b in captions for rows_j in per_b], dim=0)
        proj = self.y_embedder.y_proj_xattn[0]
        assert isinstance(proj, nn.Linear)
        return F.silu(_linear_f32(proj, rows)).to(self.dtype)

    # ---- forward --------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        t: Tensor,
        captions: Sequence[Sequence[Tensor]],
        kv_ranges: Sequence[tuple[int, int]],
        prefix: Sequence[Tensor] | None,
        rope_offset_frames: int,
        caption_dropout: bool,
        distill_dt: float | None,
        capture: dict[str, Tensor] | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """One DiT pass over a window of R chunks (every pass of the distill and cfg pipelines).

        x: latents [N, C, T, H, W], T = R * chunk frames; the chunks are the window's, oldest first (a prepended
            clean chunk first, a distill nearly-clean copy last).
        t: per-chunk timesteps [N, R] (fp32).
        captions: captions[b][j] = the valid caption rows [rows >= 1, caption_channels] (un-projected) that chunk j
            of batch element b cross-attends to (text, null or a mix; the reference's y rows with mask 1).
        kv_ranges: per chunk j, the key rows [start, end) it attends to, counted in the key sequence
            `[prefix rows 0..P) ; this batch element's fresh rows]`, fresh chunk c at rows [P + c*ctn, P + (c+1)*ctn)
            (ctn = tokens per chunk). The same ranges serve every batch element: with N > 1 (cfg uncond, one chunk
            per element, no prefix) each element attends to its own rows only, e.g. [(0, ctn)].
        prefix: per layer cached K|V rows [P, G, 2*hd] shared by the batch (P may be any number of rows: pass
            only the look-back and shift kv_ranges accordingly), or None (no cache).
        rope_offset_frames: latent frames before x on the RoPE time axis (slice_point * chunk frames; 0 for the
            uncond pass); the grid has rope_offset_frames + T frames and x's tokens are its last rows.
        caption_dropout: adaLN from null_caption_embedding[-1] if True (cond_pre, uncond) else [-2] (cond, distill).
        distill_dt: distill models add t_emb(distill_dt) to every chunk's t_emb; None for base models.
        capture: if given, receives embed_x [S,N,D], rope [S, 6*nb] (cat(sin, cos)), condition [N,R,D/4],
            y_xattn_flat [rows, D_x], kv_fresh_l{i}, layer{i}_out [S,N,D] (the golden's names).

        Returns the model output (velocity towards clean) [N, C, T, H, W] fp32 for every chunk in x, and per layer
        the fresh K|V [(S*N), G, 2*hd] in (token, batch) order, K after its LayerNorm-1p and RoPE; the caller
        writes them to its cache.
        """
        cfg = self.config
        n, _, frames, height, width = x.shape
        h2, w2 = height // cfg.patch_size, width // cfg.patch_size
        plan = self._plan(x, t, captions, kv_ranges, prefix, rope_offset_frames)
        if capture is not None and plan.parallel is not None:
            raise ValueError("capture is not supported under sequence parallelism (a rank holds part of each tensor)")
        tokens = self.embed(x)
        s = tokens.shape[0]
        # The grid spans the cached frames too; the current tokens are its last rows.
        sin, cos = self.rope(rope_offset_frames + frames, h2, w2)
        sin, cos = sin[-s:], cos[-s:]
        if plan.parallel is not None:  # this rank's run of every frame (the fresh K|V come back whole)
            tokens, sin, cos = (plan.parallel.shard(rows, frames) for rows in (tokens, sin, cos))
        condition = self.condition(t, caption_dropout, distill_dt)
        y_x = self.caption_tokens(captions)
        if capture is not None:
            capture.update(embed_x=tokens, rope=torch.cat([sin, cos], -1), condition=condition, y_xattn_flat=y_x)
        fresh: list[Tensor] = []
        for i, layer in enumerate(self.videodit_blocks.layers):
            tokens, kv = layer(tokens, condition, sin, cos, None if prefix is None else prefix[i], y_x, plan)
            fresh.append(kv.reshape(s * n, *kv.shape[2:]))
            if capture is not None:
                capture[f"kv_fresh_l{i}"] = fresh[-1]
                capture[f"layer{i}_out"] = tokens
        out = _linear_f32(self.final_linear.linear, self.videodit_blocks.final_layernorm.forward_f32(tokens))
        if plan.parallel is not None:  # every rank integrates the whole velocity
            out = plan.parallel.unshard(out, frames)
        return self._unpatchify(out, frames, h2, w2), fresh

    def _unpatchify(self, out: Tensor, frames: int, h2: int, w2: int) -> Tensor:
        """[S, N, (pt ph pw C)] -> [N, C, T, H, W]; half_channel_vae keeps the first half; undoes x_rescale."""
        cfg = self.config
        p = cfg.patch_size
        n = out.shape[1]
        video = out.view(frames, h2, w2, n, 1, p, p, cfg.out_channels).permute(3, 7, 0, 4, 1, 5, 2, 6)
        video = video.reshape(n, cfg.out_channels, frames, h2 * p, w2 * p)
        if cfg.half_channel_vae:
            video = video[:, : cfg.out_channels // 2]
        return video / cfg.x_rescale_factor

    def _plan(
        self,
        x: Tensor,
        t: Tensor,
        captions: Sequence[Sequence[Tensor]],
        kv_ranges: Sequence[tuple[int, int]],
        prefix: Sequence[Tensor] | None,
        rope_offset_frames: int,
    ) -> _Plan:
        """Validates the inputs and groups the attention segments."""
        cfg = self.config
        if x.dim() != 5:
            raise ValueError(f"x must be latents [N, C, T, H, W], got {list(x.shape)}")
        n, c, frames, height, width = x.shape
        latent_channels = cfg.in_channels // 2 if cfg.half_channel_vae else cfg.in_channels
        if c != latent_channels:
            raise ValueError(f"x must have {latent_channels} channels, got {c}")
        p = cfg.patch_size
        if height % p or width % p or height // p < 2 or width // p < 2:
            # The reference's RoPE rescale asserts an axis of one patch away; H2, W2 must be > 1.
            raise ValueError(f"latent H, W must be multiples of {p} with at least 2 patches each, got {height}x{width}")
        if t.dim() != 2 or t.shape[0] != n or frames % t.shape[1]:
            raise ValueError(f"t must be [N={n}, R] with R dividing T={frames}, got {list(t.shape)}")
        r = t.shape[1]
        ctn = (frames // r) * (height // p) * (width // p)
        if len(captions) != n or any(len(per_b) != r for per_b in captions):
            raise ValueError(f"captions must be [N={n}][R={r}] tensors of caption rows")
        if any(rows.dim() != 2 or rows.shape[1] != cfg.caption_channels for per_b in captions for rows in per_b):
            raise ValueError(f"every caption must be [rows, {cfg.caption_channels}]")
        if rope_offset_frames < 0:
            raise ValueError(f"rope_offset_frames must be >= 0, got {rope_offset_frames}")
        cached = self._check_prefix(prefix)
        total = cached + r * ctn
        if len(kv_ranges) != r or any(not 0 <= a < b <= total for a, b in kv_ranges):
            raise ValueError(f"kv_ranges must be {r} ranges [start, end) within [0, {total}), got {list(kv_ranges)}")
        runs: list[tuple[int, int, int, int]] = []
        for j, (start, end) in enumerate(kv_ranges):
            if runs and runs[-1][2:] == (start, end):
                runs[-1] = (runs[-1][0], j + 1, start, end)
            else:
                runs.append((j, j + 1, int(start), int(end)))
        lengths = [int(rows.shape[0]) for per_b in captions for rows in per_b]
        if min(lengths) == 0:
            raise ValueError("every chunk needs at least one caption row (the null caption has 50)")
        if self.parallel is not None:
            self.parallel.check_tokens((height // p) * (width // p))
        return _Plan(
            num_chunks=r,
            chunk_tokens=ctn,
            runs=tuple(runs),
            captions=_caption_groups(lengths, x.device),
            frames=frames,
            parallel=self.parallel,
        )

    def _check_prefix(self, prefix: Sequence[Tensor] | None) -> int:
        """Rows of the cached prefix (0 without one)."""
        if prefix is None:
            return 0
        cfg = self.config
        shape = (cfg.num_query_groups // self.kv_group_split, 2 * cfg.head_dim)
        if len(prefix) != cfg.num_layers or any(p.dim() != 3 or tuple(p.shape[1:]) != shape for p in prefix):
            raise ValueError(f"prefix must hold {cfg.num_layers} tensors [P, {shape[0]}, {shape[1]}]")
        rows = {p.shape[0] for p in prefix}
        if len(rows) != 1:
            raise ValueError(f"every layer's prefix must have as many rows, got {sorted(rows)}")
        return rows.pop()


def _caption_groups(lengths: list[int], device: torch.device) -> tuple[_CaptionGroup, ...]:
    """Segments grouped by caption length (one attention call each); no index tensors when all are alike."""
    if len(set(lengths)) == 1:
        return (_CaptionGroup(segments=None, rows=None, length=lengths[0]),)
    offsets = [0]
    for length in lengths[:-1]:
        offsets.append(offsets[-1] + length)
    groups = []
    for length in sorted(set(lengths)):
        members = [i for i, n in enumerate(lengths) if n == length]
        starts = torch.tensor([offsets[i] for i in members], device=device)
        rows = starts[:, None] + torch.arange(length, device=device)
        groups.append(_CaptionGroup(torch.tensor(members, device=device), rows, length))
    return tuple(groups)


def _rope_grid(bands: Tensor, frames: int, h2: int, w2: int) -> tuple[Tensor, Tensor]:
    """sin, cos [frames*h2*w2, 3*nb] (axis-major: t bands, h bands, w bands), fp32 like the reference."""
    device = bands.device
    coords = [
        torch.arange(frames, dtype=torch.int64, device=device).to(torch.float32),
        torch.arange(h2, dtype=torch.int64, device=device).to(torch.float32) - (h2 - 1) / 2,
        torch.arange(w2, dtype=torch.int64, device=device).to(torch.float32) - (w2 - 1) / 2,
    ]
    rescale = math.sqrt((h2 * w2) / ROPE_BASE_TOKENS)
    reference = [frames, h2 / rescale, w2 / rescale]
    # Endpoint-aligned rescale; coord / (f - 1) * (ref - 1) is not exactly the identity on time, kept as is.
    sizes = (frames, h2, w2)
    scaled = [c if f == 1 else c / (f - 1) * (ref - 1) for c, f, ref in zip(coords, sizes, reference, strict=True)]
    grid = torch.stack(torch.meshgrid(*scaled, indexing="ij"), dim=-1).unsqueeze(-1)
    pos = grid * bands.float()
    rows = frames * h2 * w2
    return pos.sin().reshape(rows, -1), pos.cos().reshape(rows, -1)
