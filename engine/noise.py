"""Where a session's random numbers come from.

Every draw is keyed by (seed, block, step), so any block can be regenerated alone, on any worker,
after a crash, and give the same numbers. Draws are made on the CPU (the same on every machine)
and moved to the target device. `RecordedNoise` replays given tensors (parity tests).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol

import torch
from torch import Tensor

INITIAL_STEP = -1  # the key of a block's starting noise; denoising steps are 0, 1, ...


def draw_seed(seed: int, block: int, step: int) -> int:
    """A 63-bit generator seed derived from (seed, block, step) by a stable hash."""
    digest = hashlib.blake2b(f"inferix:{seed}:{block}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class NoiseSource(Protocol):
    def initial(self, block: int, shape: tuple[int, ...]) -> Tensor:
        """Starting noise of block `block`, shape [B, F, C, h, w]."""
        ...

    def renoise(self, block: int, step: int, shape: tuple[int, ...]) -> Tensor:
        """Noise added after denoising step `step` of block `block`."""
        ...


class SeededNoise:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def _draw(self, block: int, step: int, shape: tuple[int, ...]) -> Tensor:
        generator = torch.Generator().manual_seed(draw_seed(self.seed, block, step))
        return torch.randn(shape, generator=generator, dtype=torch.float32)

    def initial(self, block: int, shape: tuple[int, ...]) -> Tensor:
        return self._draw(block, INITIAL_STEP, shape)

    def renoise(self, block: int, step: int, shape: tuple[int, ...]) -> Tensor:
        return self._draw(block, step, shape)


class RecordedNoise:
    """Replays recorded noise: `initial_noise` [B, F_total, C, h, w] and `renoise[(block, step)]`."""

    def __init__(self, initial_noise: Tensor, renoise: Mapping[tuple[int, int], Tensor]) -> None:
        self.initial_noise = initial_noise
        self.renoise_draws = dict(renoise)

    def initial(self, block: int, shape: tuple[int, ...]) -> Tensor:
        frames = shape[1]
        noise = self.initial_noise[:, block * frames : (block + 1) * frames]
        if tuple(noise.shape) != tuple(shape):
            raise ValueError(f"recorded initial noise has no block {block} of shape {list(shape)}")
        return noise

    def renoise(self, block: int, step: int, shape: tuple[int, ...]) -> Tensor:
        try:
            noise = self.renoise_draws[(block, step)]
        except KeyError:
            raise ValueError(f"no recorded re-noise draw for block {block}, step {step}") from None
        return noise.reshape(shape)
