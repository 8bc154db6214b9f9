"""TAEHV decoded the way the reference streams it: one time step at a time through every layer.

A depth-first walk over (time step, layer): each step goes as deep as it can before the next one
starts, each layer runs as written (Upsample, then TGrow, then the conv at full resolution),
activations in the default (contiguous) layout. It shares nothing with `taehv._run` but the weights,
which makes it both an independent check of the block-wise decoder's rewrites and the bench's
"reference-style" baseline (bench/vae.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.decoders.taehv import TAEHV, MemBlock, SuperMemBlock, TGrow


class FramewiseDecoder:
    """Streaming TAEHV decode, one time step through every layer (batch of one stream)."""

    def __init__(self, model: TAEHV) -> None:
        self.model = model
        self.layers = list(model.decoder)
        self.memory: list[Tensor | None] = [None] * len(self.layers)
        self.to_trim = model.layout.frames_to_trim

    @torch.no_grad()
    def decode_block(self, latents: Tensor) -> Tensor:
        """latents [N, F, C, h, w] -> RGB [N, T, 3, H, W] in [0, 1] (the first frames of a stream dropped)."""
        x = latents.to(self.model.dtype)
        queue: list[tuple[Tensor, int]] = [(x[:, i], 0) for i in range(x.shape[1])]
        frames: list[Tensor] = []
        while queue:
            xt, i = queue.pop(0)
            if i == len(self.layers):
                if self.to_trim:
                    self.to_trim -= 1
                elif self.model.layout.patch_size > 1:
                    frames.append(torch.pixel_shuffle(xt, self.model.layout.patch_size).clamp(0, 1))
                else:
                    frames.append(xt.clamp(0, 1))
                continue
            layer = self.layers[i]
            if isinstance(layer, (MemBlock, SuperMemBlock)):
                past = self.memory[i]
                self.memory[i] = xt
                queue.insert(0, (layer(xt, torch.zeros_like(xt) if past is None else past), i + 1))
            elif isinstance(layer, TGrow):
                for part in reversed(layer.conv(xt).chunk(layer.stride, 1)):
                    queue.insert(0, (part, i + 1))
            else:
                queue.insert(0, (layer(xt), i + 1))
        return torch.stack(frames, 1)
