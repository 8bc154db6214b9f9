"""Caption times to block indices (continuous prompts)."""

from __future__ import annotations

import pytest

from inferix.errors import UserError
from lvbench.dataset import VideoAnnotation, parse_annotations
from lvbench.schedule import BlockTiming, plan_video

TINY = BlockTiming(fps=16.0, first_block_frames=9, frames_per_block=12)


def annotation(*captions: tuple[float, float, str]) -> VideoAnnotation:
    (video,) = parse_annotations(
        [{"video_id": "v", "captions": [dict(start=s, end=e, text=t) for s, e, t in captions]}]
    )
    return video


def test_timing_of_the_shipped_presets() -> None:
    assert BlockTiming.from_preset("tiny") == TINY  # 3 latent frames per block: 1 + 4 * 2 = 9, then 12
    assert BlockTiming.from_preset("self-forcing-dmd") == TINY
    with pytest.raises(UserError, match="unknown model preset"):
        BlockTiming.from_preset("no-such-model")
    with pytest.raises(UserError, match="fps > 0"):
        BlockTiming(0.0, 9, 12)


def test_block_boundaries_and_lengths() -> None:
    assert [TINY.block_start_frame(k) for k in range(4)] == [0, 9, 21, 33]
    assert TINY.frames_in(4) == 45
    assert TINY.blocks_for(45 / 16) == 4  # exactly 45 frames
    assert TINY.blocks_for(2.9) == 5  # 46.4 -> 47 frames need a fifth block
    assert TINY.blocks_for(0.1) == 1
    assert TINY.nearest_block(0.0) == 0
    assert TINY.nearest_block(0.3) == 1  # frame 4.8: block 1 starts at 9 (4.2 away), block 0 at 0 (4.8)
    assert TINY.nearest_block(1.0) == 2  # frame 16: block 2 at 21 (5 away) beats block 1 at 9 (7)
    assert TINY.nearest_block(15 / 16) == 2  # frame 15: a tie between 9 and 21 goes to the later block


def test_captions_map_to_the_nearest_boundary() -> None:
    plan = plan_video(annotation((0.0, 1.0, "red"), (1.0, 2.0, "green"), (2.0, 2.8, "blue")), TINY)
    assert plan.num_blocks == 4 and plan.num_frames == 45
    assert [(p.at_block, p.text) for p in plan.prompts] == [(0, "red"), (2, "green"), (3, "blue")]
    assert [(c.at_block, c.text) for c in plan.prompt_changes()] == [(0, "red"), (2, "green"), (3, "blue")]
    assert plan.dropped == ()


def test_colliding_captions_keep_the_later_one() -> None:
    plan = plan_video(annotation((0.0, 0.55, "a"), (0.55, 0.6, "b"), (0.6, 3.0, "c")), TINY)
    assert [(p.at_block, p.caption_index) for p in plan.prompts] == [(0, 0), (1, 2)]
    assert plan.dropped == (1,)
    first = plan_video(annotation((0.0, 0.1, "a"), (0.1, 2.0, "b")), TINY)  # b's nearest boundary is block 0
    assert [(p.at_block, p.text) for p in first.prompts] == [(0, "b")] and first.dropped == (0,)


def test_too_many_prompt_changes_is_a_clear_error() -> None:
    captions = [(2.0 * i, 2.0 * (i + 1), f"scene {i}") for i in range(70)]
    with pytest.raises(UserError, match="70 prompt changes .* at most 64 per session"):
        plan_video(annotation(*captions), TINY)
