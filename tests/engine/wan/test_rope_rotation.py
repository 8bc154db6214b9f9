"""`rotate_time` and the re-basing rule: turning cached keys by time positions keeps attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.families.wan.rope import RopeTable, apply_rope, rope_pair_split, rotate_time
from inferix.spec.sampling import BlockConfig, RopeRebase, rope_rebase

HEAD_DIM = 16  # 4 time pairs, 2 height, 2 width
TABLE = RopeTable(HEAD_DIM, max_positions=64)
CPU = torch.device("cpu")


def keys(seed: int, frames: int = 3, height: int = 2, width: int = 3, heads: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, frames * height * width, heads, HEAD_DIM, generator=generator)


def at(x: torch.Tensor, start: int, frames: int = 3) -> torch.Tensor:
    """x with RoPE applied for frames from time position `start` (2x3 tokens per frame)."""
    return apply_rope(x, TABLE.rotations(start, frames, 2, 3, CPU))


def test_turning_back_and_forth_and_composing_turns() -> None:
    k = at(keys(0), 10)
    torch.testing.assert_close(rotate_time(rotate_time(k, 37), -37), k, rtol=0, atol=1e-6)
    torch.testing.assert_close(rotate_time(rotate_time(k, -18), -18), rotate_time(k, -36), rtol=0, atol=1e-6)
    torch.testing.assert_close(rotate_time(rotate_time(k, 5), -23), rotate_time(k, -18), rtol=0, atol=1e-6)
    assert torch.equal(rotate_time(k, 0), k)


def test_only_the_time_pairs_turn() -> None:
    k = at(keys(1), 4)
    turned = rotate_time(k, -40)
    time_channels = 2 * rope_pair_split(HEAD_DIM)[0]
    assert torch.equal(turned[..., time_channels:], k[..., time_channels:])
    assert not torch.allclose(turned[..., :time_channels], k[..., :time_channels])
    # Turning keeps every pair's length.
    norms = k[..., :time_channels].unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(turned[..., :time_channels].unflatten(-1, (-1, 2)).norm(dim=-1), norms)


def test_turning_equals_rope_at_the_shifted_position() -> None:
    raw = keys(2)
    torch.testing.assert_close(rotate_time(at(raw, 50), -44), at(raw, 6), rtol=0, atol=1e-5)
    torch.testing.assert_close(rotate_time(at(raw, 3), 20), at(raw, 23), rtol=0, atol=1e-5)


def test_the_result_of_a_key_does_not_depend_on_the_keys_turned_with_it() -> None:
    k = at(keys(3, frames=5), 7, frames=5)
    whole = rotate_time(k, -29)
    assert torch.equal(rotate_time(k[:, 5:17], -29), whole[:, 5:17])
    assert torch.equal(rotate_time(k[:, :, 1:], -29), whole[:, :, 1:])


def test_attention_is_unchanged_when_queries_and_keys_shift_together() -> None:
    """Relative-position invariance: the sink below position 0 (turned directly), queries re-based."""
    q_raw, k_raw, v = keys(4), keys(5, frames=9), keys(6, frames=9)
    sink = at(k_raw[:, :18], 0)  # frames 0..2
    window = at(k_raw[:, 18:], 54, frames=6)  # frames 54..59
    before = F.scaled_dot_product_attention(
        at(q_raw, 60).transpose(1, 2), torch.cat([sink, window], 1).transpose(1, 2), v.transpose(1, 2)
    )
    shift = 54  # the sink ends at -54..-52, the window at 0..5, the queries at 6..8
    rebased_keys = rotate_time(torch.cat([sink, window], 1), -shift)
    after = F.scaled_dot_product_attention(
        at(q_raw, 60 - shift).transpose(1, 2), rebased_keys.transpose(1, 2), v.transpose(1, 2)
    )
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_rebase_offset_is_zero_until_the_table_end_then_a_fixed_stride() -> None:
    rule = RopeRebase(max_positions=24, keep=6)
    assert rule.stride == 18
    assert [rule.offset(end) for end in (3, 24)] == [0, 0]
    assert [rule.offset(end) for end in (25, 27, 42, 43, 45, 60, 61)] == [18, 18, 18, 36, 36, 36, 54]
    # The block that crosses starts at most `keep` positions into the table; every pass fits it.
    for start in range(0, 300, 3):
        position, offset = start - rule.offset(start + 3), rule.offset(start + 3)
        assert 0 <= position <= 24 - 3
        if offset != rule.offset(start):
            assert position <= 6


def test_rebase_rule_of_a_session() -> None:
    assert rope_rebase(24, BlockConfig(num_frame_per_block=3)) is None  # global: bounded by the table
    assert rope_rebase(24, BlockConfig(3, local_attn_size=9, sink_size=3)) == RopeRebase(24, 6)
    assert rope_rebase(9, BlockConfig(3, local_attn_size=9, sink_size=3)) == RopeRebase(9, 6)
    with pytest.raises(ValueError, match="rope_max_positions=8 is too short .* at least .* = 9"):
        rope_rebase(8, BlockConfig(3, local_attn_size=9, sink_size=3))
    with pytest.raises(ValueError, match="keep < max_positions"):
        RopeRebase(6, 6)
