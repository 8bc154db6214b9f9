"""The action module of Matrix-Game 2.0 (README section 8): a mouse branch and a keyboard branch
inserted between cross-attention and the FFN of the action blocks.

Actions come as raw rows, one per pixel frame. Latent frame j sees the `windows_size * 4` rows
before its own last pixel frame, `[4j - 4ws, 4j)`, rows below 0 replaced by row 0 (so the last raw
row of a video is never used). Both branches attend over their own rolling cache of per-frame K/V
(`rolling_cache`), with an action RoPE that rotates only the first `mouse_qk_dim_list[0]` dims of
each 64-dim head by the absolute latent frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.families.matrixgame.config import ActionConfig
from engine.families.matrixgame.rolling_cache import ActionCache
from engine.families.wan.dit import LayerNorm


@dataclass
class ActionInputs:
    """Raw action rows of a video: keyboard [1, N, K] (0/1, multi-hot allowed) and mouse [1, N, 2]
    (None: no mouse branch, e.g. templerun). Row r is pixel frame r."""

    keyboard: Tensor
    mouse: Tensor | None = None

    def __post_init__(self) -> None:
        if self.keyboard.dim() != 3 or self.keyboard.shape[0] != 1:
            raise ValueError(f"keyboard actions must be [1, rows, keys], got {list(self.keyboard.shape)}")
        if self.mouse is not None and (self.mouse.dim() != 3 or self.mouse.shape[:2] != self.keyboard.shape[:2]):
            raise ValueError(
                f"mouse actions must be [1, rows, axes] with the keyboard's {self.keyboard.shape[1]} rows, "
                f"got {list(self.mouse.shape)}"
            )


def window_rows(start_frame: int, frames: int, config: ActionConfig) -> Tensor:
    """Raw row index of every window position [frames, window_rows] (row-0 padding before the video)."""
    ratio, span = config.vae_time_compression_ratio, config.window_rows
    ends = torch.arange(start_frame, start_frame + frames) * ratio
    return (ends.unsqueeze(1) - span + torch.arange(span)).clamp(min=0)


def check_rows(actions: ActionInputs, start_frame: int, frames: int, config: ActionConfig) -> None:
    """The rows must reach the last one the call's windows read."""
    needed = max(1, (start_frame + frames - 1) * config.vae_time_compression_ratio)
    if actions.keyboard.shape[1] < needed:
        raise ValueError(
            f"latent frames [{start_frame}, {start_frame + frames}) read raw action rows up to {needed - 1}; "
            f"got {actions.keyboard.shape[1]} rows"
        )


class ActionRope:
    """(cos, sin) [frames, head_dim] of the action RoPE: fp32, interleaved pairs, theta `rope_theta`;
    only the time axis's first `mouse_qk_dim_list[0]` dims turn (the h / w axes sit at position 0)."""

    def __init__(self, config: ActionConfig) -> None:
        self.config = config
        width = config.mouse_qk_dim_list[0]
        self.freqs = 1.0 / (config.rope_theta ** (torch.arange(0, width, 2)[: width // 2].float() / width))

    def table(self, start_frame: int, frames: int, device: torch.device) -> tuple[Tensor, Tensor]:
        end = start_frame + frames
        if end > self.config.rope_max_positions:
            raise ValueError(
                f"latent frame {end - 1} exceeds the action RoPE table ({self.config.rope_max_positions} frames)"
            )
        angles = torch.outer(torch.arange(start_frame, end, dtype=torch.float32), self.freqs)
        rest = self.config.head_dim - angles.shape[1] * 2
        cos = torch.cat([angles.cos().repeat_interleave(2, dim=1), torch.ones(frames, rest)], dim=1)
        sin = torch.cat([angles.sin().repeat_interleave(2, dim=1), torch.zeros(frames, rest)], dim=1)
        return cos.to(device), sin.to(device)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rot(x) * sin with rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]; x [..., T, heads, D],
    cos / sin [T, D] (one row per frame)."""
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    turned = torch.stack([-odd, even], dim=-1).flatten(-2)
    return x * cos.unsqueeze(-2) + turned * sin.unsqueeze(-2)


class HeadNorm(nn.Module):
    """RMS norm over each head's dims *without* its weight: the reference keeps the weight in the
    checkpoint (so it is a parameter here, to load strictly) but never applies it."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x)


class ActionModule(nn.Module):
    """Mouse then keyboard branch over x [1, T*S, dim] (tokens in (f, s) order); names as the checkpoint."""

    def __init__(self, config: ActionConfig, dim: int) -> None:
        super().__init__()
        self.config = config
        self.heads = config.heads_num
        self.head_dim = config.head_dim
        bias = config.qkv_bias
        if config.enable_mouse:
            mouse_in = dim + config.window_rows * config.mouse_dim_in
            hidden = config.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(
                nn.Linear(mouse_in, hidden),
                nn.GELU(approximate="tanh"),
                nn.Linear(hidden, hidden),
                LayerNorm(hidden, eps=1e-5),
            )
            self.t_qkv = nn.Linear(hidden, 3 * hidden, bias=bias)
            self.proj_mouse = nn.Linear(hidden, dim, bias=bias)
            self.img_attn_q_norm = HeadNorm(self.head_dim)
            self.img_attn_k_norm = HeadNorm(self.head_dim)
        width = config.keyboard_hidden_dim
        self.keyboard_embed = nn.Sequential(
            nn.Linear(config.keyboard_dim_in, config.hidden_size),
            nn.SiLU(),
            nn.Linear(config.hidden_size, config.hidden_size),
        )
        self.mouse_attn_q = nn.Linear(dim, width, bias=bias)
        self.keyboard_attn_kv = nn.Linear(config.hidden_size * config.window_rows, 2 * width, bias=bias)
        self.proj_keyboard = nn.Linear(width, dim, bias=bias)
        self.key_attn_q_norm = HeadNorm(self.head_dim)
        self.key_attn_k_norm = HeadNorm(self.head_dim)
        self.rope = ActionRope(config)

    def forward(self, x: Tensor, start_frame: int, frames: int, actions: ActionInputs, cache: ActionCache) -> Tensor:
        rows = window_rows(start_frame, frames, self.config).to(x.device)
        cos, sin = self.rope.table(start_frame, frames, x.device)
        if actions.mouse is not None and self.config.enable_mouse:
            x = self._mouse(x, start_frame, frames, actions.mouse[0, rows], cache, cos, sin)
        return self._keyboard(x, start_frame, frames, actions.keyboard[0, rows], cache, cos, sin)

    def _heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (-1, self.head_dim))

    def _mouse(
        self, x: Tensor, start: int, frames: int, window: Tensor, cache: ActionCache, cos: Tensor, sin: Tensor
    ) -> Tensor:
        """Per spatial position: temporal attention over [visual | mouse window] features."""
        b, tokens, dim = x.shape
        positions = tokens // frames
        xs = x.view(frames, positions, dim).transpose(0, 1)  # [S, T, dim]
        mouse = window.flatten(1).to(x.dtype)  # [T, rows * axes], time-major
        u = self.mouse_mlp(torch.cat([xs, mouse.unsqueeze(0).expand(positions, -1, -1)], dim=-1))
        q, k, v = self.t_qkv(u).unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)  # [S, T, H, D] each
        q = rotate(self.img_attn_q_norm(q), cos, sin)
        k = rotate(self.img_attn_k_norm(k), cos, sin)
        keys, values = cache.mouse.update(start, k, v)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2))
        attn = attn.transpose(1, 2).flatten(2)  # [S, T, H*D]
        return x + self.proj_mouse(attn.transpose(0, 1).reshape(b, tokens, -1))

    def _keyboard(
        self, x: Tensor, start: int, frames: int, window: Tensor, cache: ActionCache, cos: Tensor, sin: Tensor
    ) -> Tensor:
        """Every token attends to one keyboard-window token per cached latent frame."""
        b, tokens, _ = x.shape
        embedded = self.keyboard_embed(window.to(x.dtype)).flatten(1)  # [T, rows * hidden]
        k, v = self._heads(self.keyboard_attn_kv(embedded)).chunk(2, dim=-2)  # [T, H, D] each
        k = rotate(self.key_attn_k_norm(k), cos, sin)
        q = self._heads(self.mouse_attn_q(x)).view(frames, tokens // frames, self.heads, self.head_dim)
        q = rotate(self.key_attn_q_norm(q).transpose(0, 1), cos, sin)  # [S, T, H, D]
        keys, values = cache.keyboard.update(start, k.unsqueeze(0), v.unsqueeze(0))
        attn = F.scaled_dot_product_attention(
            q.flatten(0, 1).unsqueeze(0).transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        )
        attn = attn.transpose(1, 2).view(tokens // frames, frames, -1).transpose(0, 1).reshape(b, tokens, -1)
        return x + self.proj_keyboard(attn)
