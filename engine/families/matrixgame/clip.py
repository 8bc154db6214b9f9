"""The CLIP ViT image tower that gives Matrix-Game its cross-attention context (README section 3).

Only the vision tower of the reference's XLM-RoBERTa CLIP is used, and only up to its
second-to-last block (`use_31_block`): no post-norm, no projection head. The last block, the
post-norm and the head are kept as parameters so a released checkpoint loads strictly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import load_into, read_state_dict

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The vision tower's names inside a whole XLM-RoBERTa CLIP checkpoint (text tower: `textual.`).
VISUAL_PREFIX = "visual."


@dataclass(frozen=True)
class CLIPVisionConfig:
    """Defaults: the released ViT-H/14 (257 tokens x 1280)."""

    image_size: int = 224
    patch_size: int = 14
    vision_dim: int = 1280
    vision_heads: int = 16
    vision_layers: int = 32
    vision_mlp_ratio: int = 4
    embed_dim: int = 1024
    norm_eps: float = 1e-5

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CLIPVisionConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        q, k, v = self.to_qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).flatten(2))


class _Block(nn.Module):
    def __init__(self, config: CLIPVisionConfig) -> None:
        super().__init__()
        dim = config.vision_dim
        self.norm1 = nn.LayerNorm(dim, eps=config.norm_eps)
        self.attn = _SelfAttention(dim, config.vision_heads)
        self.norm2 = nn.LayerNorm(dim, eps=config.norm_eps)
        hidden = dim * config.vision_mlp_ratio
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class CLIPVisionEncoder(nn.Module):
    """Image [B, 3, H, W] in [-1, 1] -> tokens [B, 1 + patches, vision_dim] (class token first)."""

    def __init__(self, config: CLIPVisionConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or CLIPVisionConfig()
        dim = cfg.vision_dim
        patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embedding = nn.Conv2d(3, dim, cfg.patch_size, stride=cfg.patch_size, bias=False)
        self.cls_embedding = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, 1 + patches, dim))
        self.pre_norm = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.transformer = nn.Sequential(*[_Block(cfg) for _ in range(cfg.vision_layers)])
        self.post_norm = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.head = nn.Parameter(torch.zeros(dim, cfg.embed_dim))

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, config: CLIPVisionConfig | None = None, device: torch.device | str = "cpu"
    ) -> CLIPVisionEncoder:
        """Load a vision-tower state dict (`patch_embedding.weight`, `transformer.{i}.*`, ...), strictly;
        of a whole CLIP checkpoint (the released `models_clip_*.pth`), its `visual.*` tensors."""
        state = read_state_dict(path, "CLIP checkpoint", "Expected the CLIP vision tower's state dict.")
        if any(name.startswith(VISUAL_PREFIX) for name in state):
            state = {k.removeprefix(VISUAL_PREFIX): v for k, v in state.items() if k.startswith(VISUAL_PREFIX)}
        return load_into(
            lambda: cls(config),
            state,
            path,
            dtype=torch.float32,
            device=device,
            what="CLIP vision encoder",
            hint="check the clip section of the model config (vision_dim, vision_layers, patch_size, image_size)",
        )

    def pixels(self, image: Tensor) -> Tensor:
        """The tower's input: bicubic resize to image_size (no antialias), to [0, 1], CLIP-normalized."""
        size = self.config.image_size
        x = F.interpolate(image.float(), size=(size, size), mode="bicubic", align_corners=False)
        x = x * 0.5 + 0.5
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    def forward(self, pixels: Tensor) -> Tensor:
        """Tokens of `pixels` (see `pixels`), through every block but the last."""
        x = self.patch_embedding(pixels.to(self.pos_embedding.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_embedding.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        x = self.pre_norm(x)
        for block in list(self.transformer)[:-1]:
            x = block(x)
        return x

    def encode(self, image: Tensor) -> Tensor:
        return self(self.pixels(image))
