"""The sampler's own first blocks as training states (toyworld-play's last stage, DAgger-style).

A session's first block sees no context: the object must come out of the noise alone. Teacher
forcing trains the flow at noisy versions of real blocks, but the sampler's few Euler steps walk
their own path, and from some noise draws that path settles on an empty (or fading-in) scene: the
model predicts a faint mean of all the places the object could be, and the next step sees less
object than before. So this loss runs the inference sampler over a first block (no gradient),
then trains the model's flow at the states of that path towards a simulator block whose
object sits where the path leaned: where the model drew it, or, when it drew none, where its
predictions along the path were most object-like. The model learns to commit to the object the
noise suggests, with the keys of the block moving it as the simulator does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.text_encoder import UMT5Encoder
from engine.families.wan.tokenizer import PromptTokenizer
from toyworld_lab.measure import read_frame
from toyworld_lab.play import Player, parse_play_prompt
from toyworld_lab.train import (
    BlockSampler,
    LatentClips,
    LatentCodec,
    TeacherForcingCache,
    object_weight,
    window_key_rows,
)


@dataclass(frozen=True)
class FirstBlockRollouts:
    """The first-block loss: rollouts of the clips' first blocks (prompt and keys) from fresh noise."""

    data: LatentClips  # the play clips (their first blocks' prompts and key rows)
    sampler: BlockSampler
    codec: LatentCodec
    tokenizer: PromptTokenizer
    batch: int
    object_loss_weight: float
    weight: float  # of this loss, added to the teacher-forcing loss

    def loss(self, dit: CausalWanDiT, text: UMT5Encoder, generator: torch.Generator) -> Tensor:
        """Flow-matching loss towards the targets at the states of the sampler's path over `batch` first blocks."""
        assert self.data.key_rows is not None and dit.config.action is not None, "a keyboard DiT and keyed clips"
        nf = self.sampler.frames_per_block
        clips = torch.randint(len(self.data.prompts), (self.batch,), generator=generator)
        prompts = [self.data.prompts[int(c)][0] for c in clips]
        rows = self.data.key_rows[clips, :nf]
        keys = window_key_rows(rows, 0, nf, dit.config.action.rows_before)
        shape = torch.Size((self.batch, nf, *self.data.latents.shape[2:]))
        unique = sorted(set(prompts))
        with torch.no_grad():
            embeds = text.prompt_embeds(*self.tokenizer(unique))[[unique.index(p) for p in prompts]]
            steps = self.sampler.trajectory(
                dit, dit.encode_prompt(embeds), TeacherForcingCache(), 0, shape, generator, keys
            )
            seed = int(torch.randint(2**31, (1,), generator=generator))
            target = self.targets(steps[-1].x0, torch.stack([s.x0 for s in steps]), prompts, rows, seed)
        embeds = text.prompt_embeds(*self.tokenizer(unique))[[unique.index(p) for p in prompts]]
        prompt = dit.encode_prompt(embeds)
        weight = object_weight(target, self.data.background, self.object_loss_weight)
        losses = []
        # The first step sees pure noise, as in teacher forcing: nothing of the path to learn there.
        for step in steps[1:]:
            t = step.t.expand(self.batch, nf).contiguous()
            flow = dit(step.x, t, prompt, TeacherForcingCache(), 0, key_rows=keys)
            # The flow that predicts `target` from this state, weighed as teacher forcing weighs it.
            wanted = (step.x - target) / step.sigma
            losses.append((weight * (flow - wanted).square()).mean() / weight.mean())
        return self.weight * torch.stack(losses).mean()

    def targets(self, sampled: Tensor, path: Tensor, prompts: list[str], rows: Tensor, seed: int) -> Tensor:
        """The simulator's first blocks ([B, F, z, h, w]) of each prompt and key track, its object
        (of a random size, as in the clips) placed where the model's block drew it, else at the most
        object-like token of `path` ([steps, B, F, z, h, w]: the x0 predictions along the way)."""
        rng = random.Random(seed)
        frames = self.codec.decode(sampled)  # [B, F, H, W, 3]
        distance = (path - self.data.background).square().mean(dim=3).sqrt()  # [steps, B, F, h, w]
        leaning = distance[:, :, 0].mean(dim=0)  # [B, h, w]: the first frame, over the whole path
        height, width = frames.shape[2:4]
        patch = height // leaning.shape[1]
        blocks = []
        for index, prompt in enumerate(prompts):
            spec = parse_play_prompt(prompt)
            assert spec is not None, f"not a play prompt: {prompt!r}"
            seen = read_frame(frames[index, 0])
            if seen.present and seen.centroid is not None:
                at = seen.centroid
            else:
                token = int(leaning[index].argmax())
                at = ((token % leaning.shape[2] + 0.5) * patch, (token // leaning.shape[2] + 0.5) * patch)
            # The simulator's sizes, not the model's: sizes read back from blurred edges run large,
            # and targets that followed them grew the objects.
            player = Player.create(spec, rng, width, height, at=at)
            blocks.append(np.stack([player.frame(row) for row in rows[index].numpy()]))
        return self.codec.encode(np.stack(blocks))


__all__ = ["FirstBlockRollouts"]
