"""From timed captions to a prompt schedule: caption times become block indices.

A block-diffusion model makes video in blocks of `num_frame_per_block` latent frames; the Wan VAE
turns the first latent frame into one pixel frame and every later one into `temporal_factor`
(4), so block 0 has 1 + 4 (n - 1) frames (9 for Self Forcing's n = 3) and every later block 4 n
(12). Block k therefore starts at pixel frame 0 for k = 0 and first + (k - 1) * per_block after.

Continuous prompts: each caption switches the prompt at the block boundary nearest to its start
time (ties go to the later boundary, so a prompt never shows before its time by more than half
a block). When two captions land on the same boundary the later one wins — the earlier would be
shown for no block at all — and the plan lists it as dropped. The first prompt always applies
from block 0, and the video gets the fewest blocks that cover the last caption's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferix.errors import UserError
from inferix.spec.schedule import MAX_PROMPT_CHANGES, PromptChange
from lvbench.dataset import VideoAnnotation


@dataclass(frozen=True)
class BlockTiming:
    """Frame rate and block sizes (pixel frames) of the model that will generate the videos."""

    fps: float
    first_block_frames: int
    frames_per_block: int

    def __post_init__(self) -> None:
        if not self.fps > 0 or self.first_block_frames < 1 or self.frames_per_block < 1:
            raise UserError(f"block timing needs fps > 0 and block sizes >= 1 frame, got {self}")

    @classmethod
    def from_preset(cls, model: str) -> BlockTiming:
        """The timing of a model preset shipped with Inferix (`inferix/spec/presets/<model>.yaml`)."""
        from inferix.spec.presets import load_preset

        preset = load_preset(model)
        latent = preset.pipeline.block.num_frame_per_block
        factor = preset.vae.temporal_factor
        return cls(float(preset.fps), 1 + factor * (latent - 1), factor * latent)

    def block_start_frame(self, block: int) -> int:
        return 0 if block == 0 else self.first_block_frames + (block - 1) * self.frames_per_block

    def frames_in(self, num_blocks: int) -> int:
        return self.block_start_frame(num_blocks)

    def blocks_for(self, seconds: float) -> int:
        """The fewest blocks whose frames cover `seconds` of video (at least one)."""
        frames = math.ceil(seconds * self.fps - 1e-9)
        if frames <= self.first_block_frames:
            return 1
        return 1 + math.ceil((frames - self.first_block_frames) / self.frames_per_block)

    def nearest_block(self, seconds: float) -> int:
        """The block whose first frame is nearest to `seconds` (ties: the later block)."""
        frame = seconds * self.fps
        after_first = (frame - self.first_block_frames) / self.frames_per_block
        candidates = {0, max(1, 1 + math.floor(after_first)), max(1, 1 + math.ceil(after_first))}
        return min(candidates, key=lambda k: (abs(self.block_start_frame(k) - frame), -k))


@dataclass(frozen=True)
class ScheduledCaption:
    """A prompt change and the caption it came from (for the manifest and the report)."""

    at_block: int
    caption_index: int
    start: float
    text: str


@dataclass(frozen=True)
class VideoPlan:
    video_id: str
    num_blocks: int
    num_frames: int
    prompts: tuple[ScheduledCaption, ...]
    dropped: tuple[int, ...]  # caption indices that no block shows

    def prompt_changes(self) -> list[PromptChange]:
        return [PromptChange(p.at_block, p.text) for p in self.prompts]


def plan_video(video: VideoAnnotation, timing: BlockTiming) -> VideoPlan:
    num_blocks = timing.blocks_for(video.duration)
    scheduled: list[ScheduledCaption] = []
    dropped: list[int] = []
    for index, caption in enumerate(video.captions):
        block = 0 if index == 0 else min(timing.nearest_block(caption.start), num_blocks - 1)
        if scheduled and block == scheduled[-1].at_block:  # blocks never decrease: start times are ordered
            dropped.append(scheduled.pop().caption_index)
        scheduled.append(ScheduledCaption(block, index, caption.start, caption.text))
    if len(scheduled) > MAX_PROMPT_CHANGES:
        raise UserError(
            f"video {video.video_id!r}: {len(scheduled)} prompt changes after mapping captions to blocks; "
            f"the scheduler accepts at most {MAX_PROMPT_CHANGES} per session"
        )
    return VideoPlan(video.video_id, num_blocks, timing.frames_in(num_blocks), tuple(scheduled), tuple(dropped))
