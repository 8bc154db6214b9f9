"""From text to pixels, block by block: the unit that `inferix generate` and the worker share.

A `VideoSession` wraps a `GenerationSession` with the prompt encoder and the streaming VAE
decoder: each `next_block()` returns the block's clean latents (what a store persists) and its
decoded RGB frames (what the streamer shows). Because `inferix generate` and the worker service
run this same code, a session served through the mesh gives the same frames as the CLI.

On a sequence-parallel worker pod (`VideoGenerator(model, driver=...)`, rank 0) the session is a
`PodSession`: the DiT steps run on every rank, while the text encoder and the VAE decode run here,
on rank 0 only; the other ranks receive prompt embeddings, never text, and decode nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from inferix.errors import UserError
from inferix.profiling import profile
from workers.engine.kv.pool import KVPool
from workers.engine.model_dir import LoadedModel
from workers.engine.parallel.runner import PodDriver, PodSession
from workers.engine.pipeline import BlockDiffusionPipeline, CommittedBlock, GenerationSession


class BlockDecoder(Protocol):
    """What a session needs of its VAE (`WanVAE`, `PatchVAE`): streaming decode, block by block."""

    def new_decode_state(self) -> Any: ...

    def decode_block(self, latents_block: Tensor, state: Any) -> Tensor: ...


@dataclass(frozen=True)
class PromptChange:
    """`text` applies from block `at_block` on (with an optional KV re-cache)."""

    at_block: int
    text: str
    recache: bool = False


def validate_schedule(changes: Sequence[PromptChange]) -> list[PromptChange]:
    """A prompt schedule must start at block 0 and have strictly increasing, non-empty entries."""
    if not changes:
        raise UserError("a prompt is required: give at least one prompt (it applies from block 0)")
    ordered = sorted(changes, key=lambda c: c.at_block)
    if ordered[0].at_block != 0:
        raise UserError(f"the first prompt must apply at block 0, got block {ordered[0].at_block}")
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        if cur.at_block == prev.at_block:
            raise UserError(f"two prompts for block {cur.at_block}: keep one")
    for change in ordered:
        if not change.text.strip():
            raise UserError(f"the prompt for block {change.at_block} is empty: write what the video should show")
    return ordered


@dataclass
class VideoBlock:
    index: int
    start_frame: int  # latent-frame index of latents[:, 0]
    first_frame: int  # pixel-frame index of frames[0] in the whole video
    latents: Tensor  # [1, F, C, h, w] float32 on the CPU
    frames: np.ndarray  # uint8 [T, H, W, 3]
    prompt: str
    denoise_s: float
    context_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.denoise_s + self.context_s + self.decode_s


def to_uint8_frames(video: Tensor) -> np.ndarray:
    """VAE output [1, T, 3, H, W] in [-1, 1] -> uint8 [T, H, W, 3] (x*0.5+0.5, rounded)."""
    unit = (video[0].float() * 0.5 + 0.5).clamp(0, 1)
    return (unit * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu().numpy()


class VideoSession:
    """One video: prompt text in, `VideoBlock`s out. Iterate it or call `next_block()`."""

    def __init__(
        self,
        model: LoadedModel,
        pipeline: BlockDiffusionPipeline,
        prompt: str,
        width: int,
        height: int,
        seed: int,
        num_blocks: int | None,
        session_id: str,
        driver: PodDriver | None = None,
    ) -> None:
        factor = model.vae.config.spatial_factor
        multiple = factor * model.dit.config.patch_size[1]
        if width % multiple or height % multiple or width <= 0 or height <= 0:
            raise UserError(f"resolution {width}x{height} must be positive multiples of {multiple} (e.g. 832x480)")
        self.model = model
        self.width, self.height = width, height
        self.prompt_text = prompt
        embeds = self._encode(prompt)
        size = (height // factor, width // factor)
        # The block loop: in this process, or (rank 0 of a worker pod) on every rank of the pod.
        self.session: GenerationSession | PodSession
        if driver is None:
            self.session = pipeline.open_session(embeds, *size, seed=seed, num_blocks=num_blocks, session_id=session_id)
        else:
            self.session = PodSession(driver, session_id, embeds, *size, seed=seed, num_blocks=num_blocks)
        self.decoder: BlockDecoder = model.vae
        self.decode_state = self.decoder.new_decode_state()
        self.next_frame = 0

    @property
    def session_id(self) -> str:
        return self.session.session_id

    @property
    def next_block_index(self) -> int:
        return self.session.next_block

    @property
    def finished(self) -> bool:
        return self.session.finished

    def _encode(self, text: str) -> Tensor:
        if not text.strip():
            raise UserError("the prompt is empty: write what the video should show")
        with profile("text_encode"):
            return self.model.prompt_encoder.encode([text])

    def set_prompt(self, text: str, recache: bool = False) -> None:
        """Switch prompt at the next block boundary."""
        self.session.set_prompt(self._encode(text), recache=recache)
        self.prompt_text = text

    def next_block(self) -> VideoBlock:
        block = self.session.generate_block()
        began = time.perf_counter()
        with profile("vae_decode"):
            video = self.decoder.decode_block(block.latents, self.decode_state)
            frames = to_uint8_frames(video)
        decode_s = time.perf_counter() - began
        first = self.next_frame
        self.next_frame += frames.shape[0]
        return VideoBlock(
            index=block.index,
            start_frame=block.start_frame,
            first_frame=first,
            latents=block.latents.float().cpu(),
            frames=frames,
            prompt=self.prompt_text,
            denoise_s=block.timings.denoise_s,
            context_s=block.timings.context_s,
            decode_s=decode_s,
        )

    def __iter__(self) -> Iterator[VideoBlock]:
        while not self.finished:
            yield self.next_block()

    @torch.no_grad()
    def restore(self, committed: Sequence[tuple[int, Tensor, str]]) -> list[int]:
        """Continue a session from its committed blocks `(start_frame, latents, prompt)`, in order.

        The KV cache is rebuilt by context passes and the VAE decoder state by decoding the
        committed latents again (output dropped), so the next block's frames are exactly those
        of the uninterrupted run. Returns the pixel frames of each committed block.
        """
        embeds: dict[str, Tensor] = {}
        blocks = []
        for start, latents, text in committed:
            if text not in embeds:
                embeds[text] = self._encode(text)
            blocks.append(CommittedBlock(start, latents, embeds[text]))
        self.session.replay(blocks, next_block=len(blocks))
        self.decode_state = self.decoder.new_decode_state()
        frames = [self.decoder.decode_block(latents, self.decode_state).shape[1] for _, latents, _ in committed]
        self.next_frame = sum(frames)
        if committed:
            self.prompt_text = committed[-1][2]
        return frames

    @torch.no_grad()
    def decode_from_start(self, blocks: Sequence[Tensor]) -> Iterator[np.ndarray]:
        """The frames of the session's first blocks (clean latents, in order), decoded anew with a fresh
        decoder state: the same frames as when they were made. The session's own decoder is untouched."""
        state = self.decoder.new_decode_state()
        for latents in blocks:
            yield to_uint8_frames(self.decoder.decode_block(latents, state))

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> VideoSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VideoGenerator:
    """A loaded model plus its block pipeline and KV pool; opens `VideoSession`s.

    With `driver` (rank 0 of a worker pod) the pipeline and pool are the driver's, and sessions
    open on every rank of the pod.
    """

    def __init__(self, model: LoadedModel, pool: KVPool | None = None, driver: PodDriver | None = None) -> None:
        if driver is not None and pool is not None:
            raise ValueError("a pod's KV pool is its driver's pipeline's: pass pool or driver, not both")
        self.model = model
        self.driver = driver
        self.pipeline = (
            driver.engine.pipeline
            if driver is not None
            else BlockDiffusionPipeline(model.dit, model.pipeline_config, pool)
        )

    def open(
        self,
        prompt: str,
        *,
        width: int | None = None,
        height: int | None = None,
        seed: int = 0,
        num_blocks: int | None = None,
        session_id: str | None = None,
    ) -> VideoSession:
        return VideoSession(
            self.model,
            self.pipeline,
            prompt,
            width or self.model.width,
            height or self.model.height,
            seed,
            num_blocks,
            session_id or uuid.uuid4().hex,
            self.driver,
        )
