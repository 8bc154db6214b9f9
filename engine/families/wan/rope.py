"""3-D rotary position embedding of the Wan DiT (time, height, width).

Pairs are formed from adjacent channels (x0, x1), (x2, x3), ... and split into time / height /
width groups of `c - 2*(c//3), c//3, c//3` pairs (c = head_dim / 2). The time position is the
absolute latent-frame index, less the session's re-basing offset (below); height and width
restart at 0 in every frame.

The tables are built in float64 like the reference's and stored as float32 (cos, sin) pairs. The
reference rotates in complex128; we rotate in float32: the difference is ~1e-7 relative (far inside
the 1e-5 parity bound, and invisible after a cast to bf16) and the float64 path cost more than the
attention on CPU. The rotation is real arithmetic, which `torch.compile` fuses into one kernel;
run eagerly it is the same product as a complex64 multiply over the same memory, and that one
vectorised kernel is 10-20x faster on CPU than the four strided real products, so eager mode
takes it (the bits are the same, see `apply_rope`).

Re-basing (unbounded windowed sessions). An attention score between a query at time position p
and a key at p' depends on p - p' only, so a session may shift all of its time positions down by
D at any point without changing what it computes: it turns every cached key back by D positions
(`rotate_time`) and gives its next blocks positions reduced by D. `RopeRebase` decides when and by
how much from the frame index alone, so a session rebuilt by recompute shifts at the same points.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rope_pair_split(head_dim: int) -> tuple[int, int, int]:
    """Number of complex pairs given to (time, height, width)."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


def _inv_freq(pairs: int, theta: float) -> Tensor:
    """Angle per position of each pair of one axis (float64)."""
    dim = 2 * pairs
    return 1.0 / torch.pow(theta, torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def axis_table(max_positions: int, pairs: int, theta: float) -> Tensor:
    """(cos, sin) [max_positions, pairs, 2] of every position's angles (float64)."""
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), _inv_freq(pairs, theta))
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


class RopeTable:
    """Precomputed rotations (cos, sin) for every (axis, position, pair)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float = 10000.0) -> None:
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        t_pairs, h_pairs, w_pairs = rope_pair_split(head_dim)
        self.time = axis_table(max_positions, t_pairs, theta)
        self.height = axis_table(max_positions, h_pairs, theta)
        self.width = axis_table(max_positions, w_pairs, theta)
        self._cache: dict[tuple[int, int, int, int, torch.device], Tensor] = {}

    def rotations(self, start_frame: int, frames: int, height: int, width: int, device: torch.device) -> Tensor:
        """Rotations [frames*height*width, 1, head_dim/2, 2] (float32 cos, sin of each pair) for
        tokens in (f, h, w) order: one tensor with the tokens first, so a sequence-parallel rank
        takes its tokens' rows.

        `start_frame` is the time position of the first frame (its frame index in a session that
        never re-based).
        """
        end = start_frame + frames
        if start_frame < 0 or end > self.max_positions:
            raise ValueError(
                f"RoPE table exhausted: latent frames [{start_frame}, {end}) exceed rope_max_positions="
                f"{self.max_positions}; raise rope_max_positions in the DiT config, end the session, or use a "
                f"sliding window (windowed sessions re-base their time positions)"
            )
        if height > self.max_positions or width > self.max_positions:
            raise ValueError(f"token grid {height}x{width} exceeds rope_max_positions={self.max_positions}")
        key = (start_frame, frames, height, width, device)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        t = self.time[start_frame:end].view(frames, 1, 1, -1, 2).expand(frames, height, width, -1, 2)
        h = self.height[:height].view(1, height, 1, -1, 2).expand(frames, height, width, -1, 2)
        w = self.width[:width].view(1, 1, width, -1, 2).expand(frames, height, width, -1, 2)
        rot = torch.cat([t, h, w], dim=-2).reshape(frames * height * width, 1, -1, 2)
        rot = rot.to(device=device, dtype=torch.float32)
        if len(self._cache) > 64:
            self._cache.clear()
        self._cache[key] = rot
        return rot

    def rotate_time(self, x: Tensor, positions: int) -> Tensor:
        """`rotate_time` with this table's frequencies (what a re-basing cache turns its keys with)."""
        return rotate_time(x, positions, self.theta)


def apply_rope(x: Tensor, rotations: Tensor) -> Tensor:
    """Rotate x [B, L, H, D] by rotations [L, 1, D/2, 2] (`RopeTable.rotations`); returns x's dtype.

    Each pair (x_2i, x_2i+1) becomes (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos), in float32.
    """
    if torch.compiler.is_compiling():
        return rotate_pairs(x, rotations)
    # Eagerly: the same products as one complex64 multiply over the same memory (see the module doc).
    b, seq, heads, dim = x.shape
    pairs = torch.view_as_complex(x.float().reshape(b, seq, heads, dim // 2, 2))
    return torch.view_as_real(pairs * torch.view_as_complex(rotations)).flatten(3).to(x.dtype)


def rotate_pairs(x: Tensor, rotations: Tensor) -> Tensor:
    """`apply_rope` in real arithmetic (what a compiled forward runs: inductor has no complex type)."""
    even, odd = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = rotations.unbind(-1)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(3).to(x.dtype)


def rotate_time(x: Tensor, positions: int, theta: float = 10000.0) -> Tensor:
    """Keys x [..., head_dim] that RoPE already rotated, moved by `positions` time positions.

    Only the time pairs turn (height and width positions do not move). The angles are `positions`
    times the table's float64 frequencies, computed rather than looked up, so any shift works,
    including one that takes a key below position 0 (a re-based sink frame). The rotation is spelt
    out in real arithmetic, one rounding per operation: a key's result does not depend on how many
    keys turn with it, so every cache layout and every rank of a pod gets the same bits.
    """
    pairs = rope_pair_split(x.shape[-1])[0]
    angles = positions * _inv_freq(pairs, theta)
    cos = angles.cos().to(device=x.device, dtype=torch.float32)
    sin = angles.sin().to(device=x.device, dtype=torch.float32)
    re, im = x[..., : 2 * pairs].float().unflatten(-1, (pairs, 2)).unbind(-1)
    time = torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).flatten(-2)
    return torch.cat([time.to(x.dtype), x[..., 2 * pairs :]], dim=-1)
