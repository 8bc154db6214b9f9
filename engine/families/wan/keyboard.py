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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.families.wan.rope import axis_table, rotate_pairs
from inferix.spec.architectures import KeyboardActionConfig


@dataclass(frozen=True)
class KeyboardTokens:
    """What the key rows of a call give its queries: the keyboard tokens' K/V, the queries' rotations
    and which tokens each query sees. The same for every call of a block (its denoising steps and its
    context pass hold the same key rows), so the branch keeps the last one and computes it again only
    for other rows: the same operations on the same inputs, so the same bits."""

    rows: Tensor
    shape: torch.Size  # of the call's x
    dtype: torch.dtype
    k: Tensor
    v: Tensor
    query_rotations: Tensor
    allowed: Tensor

    def serves(self, x: Tensor, rows: Tensor) -> bool:
        return (
            x.shape == self.shape
            and x.dtype == self.dtype
            and rows.device == self.rows.device
            and rows.shape == self.rows.shape
            and bool(torch.equal(rows, self.rows))
        )


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
        self._keyboard: KeyboardTokens | None = None

    def forward(self, x: Tensor, rows: Tensor) -> Tensor:
        cfg = self.config
        batch, tokens, _ = x.shape
        frames = rows.shape[1] - cfg.rows_before
        if frames < 1 or tokens % frames or rows.shape[0] != batch or rows.shape[2] != cfg.keys:
            raise ValueError(
                f"key rows must be [{batch}, {cfg.rows_before} + frames, {cfg.keys}] for {tokens} tokens; "
                f"got {list(rows.shape)}"
            )
        keyboard = self._keyboard
        if torch.compiler.is_compiling():
            # Compiled (`--compile`), the tokens are made in the graph every call: the kept ones' Python
            # state and `torch.equal` would break it at every keyboard layer.
            keyboard = self._keyboard_tokens(x, rows, frames)
        elif keyboard is None or not keyboard.serves(x, rows):
            keyboard = self._keyboard = self._keyboard_tokens(x, rows, frames)
        q = self.norm_q(self.query(x).view(batch, tokens, cfg.heads, self.head_dim))
        q = rotate_pairs(q, keyboard.query_rotations)
        attended = F.scaled_dot_product_attention(
            q.transpose(1, 2), keyboard.k.transpose(1, 2), keyboard.v.transpose(1, 2), attn_mask=keyboard.allowed
        )
        return self.out(attended.transpose(1, 2).flatten(2))

    def _keyboard_tokens(self, x: Tensor, rows: Tensor, frames: int) -> KeyboardTokens:
        cfg = self.config
        positions = x.shape[1] // frames
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
        offsets = torch.arange(keyboard_frames, device=x.device)
        allowed = (offsets >= frame_of[:, None]) & (offsets < frame_of[:, None] + cfg.window)
        # A copy of the rows: a caller that changed its tensor in place must not find them equal.
        return KeyboardTokens(rows.clone(), x.shape, x.dtype, k, v, table[frame_of + cfg.window - 1], allowed)


def neutral_rows(config: KeyboardActionConfig, batch: int, frames: int, like: Tensor) -> Tensor:
    """Key rows of a call with no key held, for `frames` latent frames."""
    return torch.zeros(batch, config.rows_before + frames, config.keys, dtype=like.dtype, device=like.device)
