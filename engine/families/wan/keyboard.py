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

from engine.families.wan.rope import axis_table, rotate_pairs
from inferix.spec.architectures import KeyboardActionConfig


class KeyboardBranch(nn.Module):
    """x [B, F*S, dim] (tokens in (frame, position) order) and key rows [B, rows_before + F, keys]
    -> the update [B, F*S, dim] to add to x. The output projection starts at zero, so a branch
    added to a trained text model leaves it unchanged until it is trained."""

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
        keyboard_frames = k.shape[1]
        # Keyboard token g' sits at position g'; frame f of the call at f + window - 1 (its last token).
        table = axis_table(keyboard_frames, width // 2, cfg.rope_theta).float().unsqueeze(1).to(x.device)
        k = rotate_pairs(self.norm_k(k), table)
        frame_of = torch.arange(frames, device=x.device).repeat_interleave(positions)  # [F*S]
        q = self.norm_q(self.query(x).view(batch, tokens, heads, width))
        q = rotate_pairs(q, table[frame_of + cfg.window - 1])
        offsets = torch.arange(keyboard_frames, device=x.device)
        allowed = (offsets >= frame_of[:, None]) & (offsets < frame_of[:, None] + cfg.window)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed
        )
        return self.out(attended.transpose(1, 2).flatten(2))


def neutral_rows(config: KeyboardActionConfig, batch: int, frames: int, like: Tensor) -> Tensor:
    """Key rows of a call with no key held, for `frames` latent frames."""
    return torch.zeros(batch, config.rows_before + frames, config.keys, dtype=like.dtype, device=like.device)
