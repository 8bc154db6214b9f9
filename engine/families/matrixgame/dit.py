"""The Matrix-Game 2.0 causal DiT: the Wan2.1 blocks (reused from `models.wan.dit`) with CLIP image
tokens as the cross-attention context and the action module in the action blocks (README section 7).

Parameter names are the reference `CausalWanModel`'s (`blocks.0.action_model.t_qkv.weight`,
`img_emb.proj.0.weight`, ...). Inputs use the engine layout [B, F, C, h, w], C = 36 channels
(noisy latent | mask | image latent); batch 1 (the reference's action module supports no more).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from engine.attention.backends import AttentionBackend, get_backend
from engine.families.matrixgame.action import ActionInputs, ActionModule, check_rows
from engine.families.matrixgame.config import MatrixGameConfig
from engine.families.matrixgame.rolling_cache import ActionCache
from engine.families.wan.dit import AttentionBlock, CrossAttentionKV, Head, LayerNorm, sinusoidal_embedding
from engine.families.wan.rope import RopeTable
from engine.kv.protocol import SelfAttentionCache

# Named intermediate tensors of one forward (the golden case's per-layer taps).
Capture = dict[str, Tensor]


class ImageProjection(nn.Module):
    """CLIP tokens -> DiT width: LN, Linear, GELU(erf), Linear, LN (both LayerNorms eps 1e-5)."""

    def __init__(self, clip_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            LayerNorm(clip_dim, eps=1e-5),
            nn.Linear(clip_dim, clip_dim),
            nn.GELU(),
            nn.Linear(clip_dim, dim),
            LayerNorm(dim, eps=1e-5),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


@dataclass
class ActionStep:
    """What the action blocks of one forward read: the raw action rows and each action layer's caches."""

    actions: ActionInputs
    caches: list[ActionCache]  # one per action block, in block order


class MatrixGameBlock(AttentionBlock):
    """A Wan block with the action module between cross-attention and the FFN (action blocks only)."""

    def __init__(self, config: MatrixGameConfig, with_action: bool) -> None:
        super().__init__(config.dit)
        self.action_model: ActionModule | None = ActionModule(config.action, config.dit.dim) if with_action else None

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        e: Tensor,
        rotations: Tensor,
        layer: int,
        context: tuple[Tensor, Tensor],
        cache: SelfAttentionCache | None,
        backend: AttentionBackend,
        start_frame: int,
        action: tuple[ActionInputs, ActionCache] | None,
        capture: Capture | None,
    ) -> Tensor:
        """x [1, F*S, dim]; e [1, F, 6, dim] the per-frame modulation (float32)."""
        frames = e.shape[1]
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.modulation.unsqueeze(1) + e).chunk(6, dim=2)

        def per_frame(t: Tensor) -> Tensor:
            return t.unflatten(1, (frames, -1))

        h = (per_frame(self.norm1(x)).float() * (1 + scale1) + shift1).flatten(1, 2).type_as(x)
        y = self.self_attn(h, rotations, layer, cache, backend)
        x = x + (per_frame(y).float() * gate1).flatten(1, 2).type_as(x)
        x = x + self.cross_attn(self.norm3(x), [context], [x.shape[1]], backend)
        if self.action_model is not None and action is not None:
            if capture is not None:
                capture[f"act{layer}_in"] = x
            x = self.action_model(x, start_frame, frames, *action)
            if capture is not None:
                capture[f"act{layer}_out"] = x
        h = (per_frame(self.norm2(x)).float() * (1 + scale2) + shift2).flatten(1, 2).type_as(x)
        x = x + (per_frame(self.ffn(h)).float() * gate2).flatten(1, 2).type_as(x)
        if capture is not None:
            capture[f"blk{layer}_out"] = x
        return x


class MatrixGameDiT(nn.Module):
    """Denoises one block of latent frames against the session's caches; returns the flow."""

    def __init__(self, config: MatrixGameConfig, attention_backend: str = "auto") -> None:
        super().__init__()
        self.config = config
        wan = config.dit
        dim = wan.dim
        self.patch_embedding = nn.Conv3d(wan.in_dim, dim, kernel_size=wan.patch_size, stride=wan.patch_size)
        self.time_embedding = nn.Sequential(nn.Linear(wan.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
        self.img_emb = ImageProjection(config.clip_dim, dim)
        self.blocks = nn.ModuleList([MatrixGameBlock(config, i in config.action.blocks) for i in range(wan.num_layers)])
        self.head = Head(wan)
        self.rope = RopeTable(wan.head_dim, wan.rope_max_positions, wan.rope_theta)
        self.backend = get_backend(attention_backend)

    @property
    def action_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.config.action.blocks))

    def encode_context(self, visual_context: Tensor, capture: Capture | None = None) -> CrossAttentionKV:
        """CLIP tokens [1, L, clip_dim] -> every layer's cross-attention K/V (computed once per video)."""
        weight = self.patch_embedding.weight
        context = self.img_emb(visual_context.to(device=weight.device, dtype=weight.dtype))
        if capture is not None:
            capture["img_emb_out"] = context
        keys, values = [], []
        for block in self.blocks:
            assert isinstance(block, MatrixGameBlock)
            k, v = block.cross_attn.project_context(context)
            keys.append(k)
            values.append(v)
        return CrossAttentionKV(keys, values)

    def forward(
        self,
        x: Tensor,
        timesteps: Tensor,
        context: CrossAttentionKV,
        cache: SelfAttentionCache | None,
        start_frame: int,
        action: ActionStep | None,
        capture: Capture | None = None,
    ) -> Tensor:
        """Flow [1, F, out_dim, h, w] of x [1, F, in_dim, h, w] at per-frame timesteps [1, F].

        `start_frame` is the absolute latent frame of x[:, 0]: the cache slots and both RoPEs use
        it. `action` None skips the action module (a model without actions).
        """
        cfg = self.config.dit
        b, frames, channels, lat_h, lat_w = x.shape
        if b != 1 or channels != cfg.in_dim or timesteps.shape != (1, frames):
            raise ValueError(
                f"x must be [1, frames, {cfg.in_dim}, h, w] with timesteps [1, frames]; got {list(x.shape)}, "
                f"{list(timesteps.shape)}"
            )
        pt, ph, pw = cfg.patch_size
        grid = (frames // pt, lat_h // ph, lat_w // pw)
        if action is not None:
            check_rows(action.actions, start_frame, grid[0], self.config.action)
            if len(action.caches) != len(self.action_layers):
                raise ValueError(f"{len(action.caches)} action caches for {len(self.action_layers)} action layers")
        weight = self.patch_embedding.weight
        e = self.time_embedding(sinusoidal_embedding(cfg.freq_dim, timesteps.flatten()).to(weight.dtype))
        e0 = self.time_projection(e).float().unflatten(1, (6, cfg.dim)).unsqueeze(0)
        rotations = self.rope.rotations(start_frame, *grid, device=weight.device)
        if cache is not None:
            cache.begin(start_frame, grid[0])
        tokens = self.patch_embedding(x.transpose(1, 2).to(weight.dtype)).flatten(2).transpose(1, 2)
        layer_caches = dict(zip(self.action_layers, action.caches, strict=True)) if action is not None else {}
        for i, block in enumerate(self.blocks):
            assert isinstance(block, MatrixGameBlock)
            layer_action = (action.actions, layer_caches[i]) if action is not None and i in layer_caches else None
            kv = (context.keys[i], context.values[i])
            tokens = block(tokens, e0, rotations, i, kv, cache, self.backend, start_frame, layer_action, capture)
        out = self.head(tokens, e.float().unsqueeze(0).unsqueeze(2))
        return self._unpatchify(out, grid).float()

    def _unpatchify(self, x: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """[1, f*h*w, pt*ph*pw*C] -> [1, F, C, H, W] (the last axis is (pt, ph, pw, C), C fastest)."""
        pt, ph, pw = self.config.dit.patch_size
        f, h, w = grid
        c = self.config.dit.out_dim
        x = torch.einsum("bfhwpqrc->bfpchqwr", x.view(x.shape[0], f, h, w, pt, ph, pw, c))
        return x.reshape(x.shape[0], f * pt, c, h * ph, w * pw)
