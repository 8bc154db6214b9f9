"""RoPE in real arithmetic (cos, sin tables) against the complex rotation it replaced."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from engine.families.wan.rope import RopeTable, apply_rope, rope_pair_split, rotate_pairs

CPU = torch.device("cpu")


def complex_rotations(head_dim: int, start: int, frames: int, height: int, width: int, theta: float) -> Tensor:
    """The complex64 rotations [F*h*w, 1, head_dim/2] the engine used before (a reference)."""

    def axis(pairs: int, positions: Tensor) -> Tensor:
        inv_freq = 1.0 / torch.pow(theta, torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
        angles = torch.outer(positions.to(torch.float64), inv_freq)
        return torch.polar(torch.ones_like(angles), angles)

    t_pairs, h_pairs, w_pairs = rope_pair_split(head_dim)
    t = axis(t_pairs, torch.arange(start, start + frames)).view(frames, 1, 1, -1).expand(frames, height, width, -1)
    h = axis(h_pairs, torch.arange(height)).view(1, height, 1, -1).expand(frames, height, width, -1)
    w = axis(w_pairs, torch.arange(width)).view(1, 1, width, -1).expand(frames, height, width, -1)
    return torch.cat([t, h, w], dim=-1).reshape(frames * height * width, 1, -1).to(torch.complex64)


def complex_rope(x: Tensor, rotations: Tensor) -> Tensor:
    b, seq, heads, dim = x.shape
    pairs = torch.view_as_complex(x.float().reshape(b, seq, heads, dim // 2, 2))
    return torch.view_as_real(pairs * rotations).flatten(3).to(x.dtype)


# (head_dim, start frame, frames, height, width, heads, batch)
SHAPES = [(16, 0, 3, 2, 3, 2, 1), (64, 37, 2, 4, 5, 3, 2), (128, 5, 1, 30, 52, 1, 1), (22, 100, 4, 3, 1, 4, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_tables_hold_the_complex_rotations(shape: tuple[int, ...]) -> None:
    head_dim, start, frames, height, width, _, _ = shape
    table = RopeTable(head_dim, max_positions=256)
    rotations = table.rotations(start, frames, height, width, CPU)
    assert rotations.dtype == torch.float32 and rotations.shape == (frames * height * width, 1, head_dim // 2, 2)
    reference = complex_rotations(head_dim, start, frames, height, width, table.theta)
    assert torch.equal(torch.view_as_complex(rotations), reference)


@pytest.mark.parametrize("shape", SHAPES)
def test_real_rotation_matches_the_complex_one(shape: tuple[int, ...]) -> None:
    head_dim, start, frames, height, width, heads, batch = shape
    table = RopeTable(head_dim, max_positions=256)
    rotations = table.rotations(start, frames, height, width, CPU)
    x = torch.randn(batch, frames * height * width, heads, head_dim, generator=torch.Generator().manual_seed(start))
    expected = complex_rope(x, complex_rotations(head_dim, start, frames, height, width, table.theta))
    torch.testing.assert_close(rotate_pairs(x, rotations), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(apply_rope(x, rotations), expected, rtol=0, atol=1e-6)
    # Compiled, apply_rope takes the real form (inductor has no complex type).
    compiled = torch.compile(apply_rope, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, rotations), expected, rtol=0, atol=1e-6)


def test_bf16_is_rotated_in_float32_and_returned_in_bf16() -> None:
    table = RopeTable(32, max_positions=64)
    rotations = table.rotations(7, 2, 3, 4, CPU)
    x = torch.randn(1, 24, 2, 32).to(torch.bfloat16)
    out = rotate_pairs(x, rotations)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, complex_rope(x, complex_rotations(32, 7, 2, 3, 4, table.theta)))
    assert torch.equal(apply_rope(x, rotations), out)


def test_a_shard_of_the_tokens_takes_its_rows_of_the_rotations() -> None:
    """What a sequence-parallel rank does (`SequenceParallel.shard`): the same run of every frame's tokens."""
    frames, per_frame, lo, size = 3, 12, 4, 4
    table = RopeTable(16, max_positions=64)
    rotations = table.rotations(9, frames, 3, 4, CPU)
    x = torch.randn(1, frames * per_frame, 2, 16)

    def mine(tokens: Tensor) -> Tensor:
        return tokens.unflatten(1, (frames, per_frame))[:, :, lo : lo + size].flatten(1, 2)

    local_x = mine(x)
    local_rot = rotations.unflatten(0, (frames, per_frame))[:, lo : lo + size].flatten(0, 1)
    assert torch.equal(apply_rope(local_x, local_rot), mine(apply_rope(x, rotations)))
    assert torch.equal(rotate_pairs(local_x, local_rot), mine(rotate_pairs(x, rotations)))
