"""The keyboard branch of an action-conditioned Wan DiT: Matrix-Game 2.0's keyboard attention at
any scale (`KeyboardActionConfig`), stateless across blocks.

Each latent frame g gets one keyboard token: the key rows of frames g - window + 1 .. g, each
embedded (Linear, SiLU, Linear), concatenated and projected to K/V. The video tokens of frame f
attend to the keyboard tokens of frames f - window + 1 .. f, with RoPE over frames on queries and
keys (so only the distance between frames counts). Matrix-Game keeps the keyboard K/V of earlier
frames in a rolling cache; here a call receives the raw key rows it needs (`rows_before` frames
before its first one, zeros before the video: no key held) and recomputes them -- a few hundred
floats, and the session's state stays its key rows, which are stored with every committed block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inferix.spec.architectures import KeyboardActionConfig


class KeyboardBranch(nn.Module):
    """x [B, F*S, dim] (tokens in (frame, position) order) and key rows [B, rows_before + F, keys]
    -> the update [B, F*S, dim] to add to x. The output projection starts at zero, so a branch
    added to a trained text model leaves it unchanged until it is trained."""

    freqs: Tensor

    def __init__(self, config: KeyboardActionConfig, dim: int, eps: float) -> None:
        super().__init__()
        self.config = config
        self.head_dim = config.attn_dim // config.heads
        self.embed = nn.Sequential(
            nn.Linear(config.keys, config.embed_dim), nn.SiLU(), nn.Linear(config.embed_dim, config.embed_dim)
        )
        self.key_value = nn.Linear(config.embed_dim * config.window, 2 * config.attn_dim, bias=False)
        self.query = nn.Linear(dim, config.attn_dim, bias=False)
        self.norm_q = nn.RMSNorm(self.head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(self.head_dim, eps=eps)
        self.out = nn.Linear(config.attn_dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        half = self.head_dim // 2
        freqs = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64) * 2 / self.head_dim))
        self.register_buffer("freqs", freqs.float(), persistent=False)

    def forward(self, x: Tensor, rows: Tensor) -> Tensor:
        cfg = self.config
        batch, tokens, _ = x.shape
        frames = rows.shape[1] - cfg.rows_before
        if frames < 1 or tokens % frames or rows.shape[0] != batch or rows.shape[2] != cfg.keys:
            raise ValueError(
                f"key rows must be [{batch}, {cfg.rows_before} + frames, {cfg.keys}] for {tokens} tokens; "
                f"got {list(rows.shape)}"
            )
        positions = tokens // frames
        heads, width = cfg.heads, self.head_dim
        # Keyboard tokens of frames start - window + 1 .. start + F - 1: G = F + window - 1 of them.
        embedded = self.embed(rows.to(x.dtype))  # [B, R, E]
        windows = embedded.unfold(1, cfg.window, 1).transpose(2, 3).flatten(2)  # [B, G, window * E]
        k, v = self.key_value(windows).unflatten(-1, (2, heads, width)).unbind(2)  # [B, G, H, D]
        q = self.query(x).view(batch, frames, positions, heads, width)
        keyboard_frames = k.shape[1]
        k = self._rotate(self.norm_k(k), torch.arange(keyboard_frames, device=x.device))
        # Frame f of the call sits at keyboard position f + window - 1.
        q_positions = torch.arange(frames, device=x.device) + cfg.window - 1
        q = self._rotate(self.norm_q(q).transpose(1, 2), q_positions)  # [B, S, F, H, D]
        q = q.transpose(1, 2).reshape(batch, tokens, heads, width)
        frame_of = torch.arange(frames, device=x.device).repeat_interleave(positions)  # [F*S]
        offsets = torch.arange(keyboard_frames, device=x.device)
        allowed = (offsets >= frame_of[:, None]) & (offsets < frame_of[:, None] + cfg.window)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed
        )
        return self.out(attended.transpose(1, 2).flatten(2))

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """RoPE over frames on x [..., T, H, D] (interleaved pairs), positions [T]."""
        angles = positions.to(self.freqs.dtype)[:, None] * self.freqs  # [T, D/2]
        cos, sin = angles.cos()[:, None, :].to(x.dtype), angles.sin()[:, None, :].to(x.dtype)
        even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def neutral_rows(config: KeyboardActionConfig, batch: int, frames: int, like: Tensor) -> Tensor:
    """Key rows of a call with no key held, for `frames` latent frames."""
    return torch.zeros(batch, config.rows_before + frames, config.keys, dtype=like.dtype, device=like.device)
