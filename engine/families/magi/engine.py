"""The front door for MAGI-1: `MagiEngine` opens `MagiSession`s, which turn prompts into chunks.

The same surface as `WanEngine` / `WanSession` (`engine.families.wan.engine`), so `inferix generate`, the
worker service and the mesh serve MAGI-1 unchanged: a session's "blocks" are its chunks (24 frames at
the released settings), each returned as a `VideoBlock` with its clean latents, its decoded frames
and the carry (the in-flight window) that recovery needs.

Prompts: MAGI-1 takes a caption per chunk. A prompt change applies from the next chunk to leave the
window on: every chunk not yet emitted is denoised with the new caption from the next call on.
A session without a chunk count gives every chunk the "8 or more chunks to go" duration token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from engine.batching import BlockBatcher, default_max_tokens
from engine.capabilities import MAGI, Capabilities
from engine.contract import EngineBase, SessionRequest, VideoBlock
from engine.families.magi.captions import caption_rows, valid_rows
from engine.families.magi.clean_caption import clean_prompt
from engine.families.magi.loader import MagiModel
from engine.families.magi.pipeline import MagiLoop, MagiPipeline, ReplayChunk, SeededChunkNoise
from engine.families.wan.pipeline import DiTJob
from engine.kv.pool import KVPool
from engine.session_tail import HostTieredCache, SessionTail
from inferix.errors import UserError
from inferix.profiling import profile
from inferix.spec.blocks import CommittedBlock

__all__ = ["MagiEngine", "MagiSession"]


def _latents_of(shape: tuple[int, ...], data: bytes) -> Tensor:
    """Stored [frames, C, h, w] float32 -> the pipeline's [1, C, frames, h, w]."""
    array = np.frombuffer(data, dtype="<f4").reshape(shape)
    return torch.from_numpy(array.copy()).permute(1, 0, 2, 3).unsqueeze(0)


def _stored(latents: Tensor) -> Tensor:
    """The pipeline's [1, C, frames, h, w] -> [1, frames, C, h, w], the layout every block is stored in."""
    return latents.permute(0, 2, 1, 3, 4).contiguous().float().cpu()


class MagiSession(SessionTail[VideoBlock]):
    """One MAGI-1 video: prompt text in, chunks (as `VideoBlock`s) out."""

    def __init__(
        self,
        engine: MagiEngine,
        prompt: str,
        width: int,
        height: int,
        seed: int,
        num_blocks: int | None,
        session_id: str,
    ) -> None:
        model = engine.model
        factor = 8 * engine.pipeline.patch
        if width % factor or height % factor or width <= 0 or height <= 0:
            raise UserError(f"resolution {width}x{height} must be positive multiples of {factor} (e.g. 720x720)")
        if num_blocks is not None and num_blocks < 1:
            raise UserError(f"a video needs at least one chunk, got {num_blocks}")
        self.model = model
        self.width, self.height = width, height
        self.num_chunks = num_blocks
        self._embeds: dict[str, tuple[Tensor, Tensor]] = {}
        self._prompts: list[tuple[int, str]] = []  # (first chunk, prompt), ascending
        self._rows: dict[tuple[str, int], Tensor] = {}
        self.prompt_text = prompt
        self._set_from(0, prompt)
        self.loop: MagiLoop = engine.pipeline.open_session(
            height // 8, width // 8, self._caption, SeededChunkNoise(seed), num_blocks, session_id
        )
        self.next_frame = 0
        self._replay: list[ReplayChunk] = []

    # ---- prompts ------------------------------------------------------------------------------
    def _encode(self, text: str) -> tuple[Tensor, Tensor]:
        if not text.strip():
            raise UserError("the prompt is empty: write what the video should show")
        if text not in self._embeds:
            with profile("text_encode"), torch.no_grad():
                ids, mask = self.model.tokenizer.encode(clean_prompt(text))
                device = next(self.model.t5.parameters()).device
                embeds = self.model.t5(ids.to(device), mask.to(device)).float().cpu()
            self._embeds[text] = (embeds[0], mask[0])
        return self._embeds[text]

    def _set_from(self, chunk: int, text: str) -> None:
        """`text` is the prompt of `chunk` and after (a restore re-states it per chunk: kept once)."""
        self._encode(text)
        self._prompts = [(c, p) for c, p in self._prompts if c < chunk]
        if not self._prompts or self._prompts[-1][1] != text:
            self._prompts.append((chunk, text))

    def _caption(self, chunk: int) -> Tensor:
        text = self._prompt_of(chunk)
        key = (text, chunk if self.num_chunks is not None else -1)
        if key not in self._rows:
            embeds, mask = self._embeds[text]
            # An endless session is always "8 or more chunks from the end" (the longest duration token).
            chunks = self.num_chunks if self.num_chunks is not None else chunk + 8
            rows, row_mask = caption_rows(embeds, mask, chunk, chunks, self.model.special)
            self._rows[key] = valid_rows(rows, row_mask).to(self._dit_device, self._dit_dtype)
        return self._rows[key]

    @property
    def _dit_device(self) -> torch.device:
        return next(self.model.dit.parameters()).device

    @property
    def _dit_dtype(self) -> torch.dtype:
        return next(self.model.dit.parameters()).dtype

    def set_prompt(self, text: str, recache: bool = False) -> None:
        """Switch prompt from the next chunk on (`recache` has no meaning here: MAGI-1 re-reads captions)."""
        self._set_from(self.loop.next_block_index, text)
        self.prompt_text = text

    # ---- the WanSession surface -------------------------------------------------------------

    @torch.no_grad()
    def next_block(self) -> VideoBlock:
        if self._replay:
            self.loop.replay(self._replay)
            self._replay = []
        out = self.loop.generate_chunk()
        began = time.perf_counter()
        with profile("vae_decode"):
            frames = self.model.vae.decode_chunk(out.latents)
        decode_s = time.perf_counter() - began
        first = self.next_frame
        self.next_frame += frames.shape[0]
        cw = self.loop.spec.chunk_width
        return VideoBlock(
            index=out.index,
            start_frame=out.index * cw,
            first_frame=first,
            latents=_stored(out.latents),
            frames=frames,
            prompt=self._prompt_of(out.index),
            denoise_s=out.denoise_s,
            context_s=0.0,
            decode_s=decode_s,
            carry=_stored(out.carry),
        )

    def _prompt_of(self, chunk: int) -> str:
        return next(p for c, p in reversed(self._prompts) if c <= chunk)

    def block_job(self) -> DiTJob[VideoBlock]:
        """`next_block` as a batcher job: MAGI-1's calls run alone (one job is the whole chunk)."""
        yield from ()
        return self.next_block()

    def restore(self, committed: Sequence[CommittedBlock], *, from_start: bool = True) -> list[int]:
        """Continue after committed chunks (in order; a long history may come in several calls). Only
        the last few are replayed, when the next chunk is asked for; returns each chunk's frame count."""
        if from_start:
            self._replay, self.next_frame = [], 0
        frames = []
        for block in committed:
            if not block.carry_shape:  # every MAGI-1 chunk has one, if only of 0 frames (the last chunk)
                raise UserError(
                    f"committed chunk {block.block_index} has no carry: it was not made by a MAGI-1 session "
                    "(a session cannot change model family)"
                )
            latents = _latents_of(block.shape, block.latents)
            carry = _latents_of(block.carry_shape, block.carry)
            self._replay.append(ReplayChunk(block.block_index, latents, carry))
            frames.append(self.model.vae.config.pixel_frames(block.shape[0]))
            self._set_from(block.block_index, block.prompt)
            self.prompt_text = block.prompt
        self._replay = self._replay[-(self.loop.spec.lookback_chunks + 1) :]
        self.next_frame += sum(frames)
        if self._replay:
            self.loop.next_block_index = self._replay[-1].index + 1
        return frames

    def new_redecode_state(self) -> Any:
        """MAGI-1's VAE decodes each chunk alone: no state."""
        return None

    @torch.no_grad()
    def redecode(self, block: CommittedBlock, state: Any) -> np.ndarray:
        return self.model.vae.decode_chunk(_latents_of(block.shape, block.latents))

    def close(self) -> None:
        self.loop.cache.pool.close_session(self.loop.session_id)

    @property
    def kv_cache(self) -> HostTieredCache:
        return self.loop.cache

    @property
    def position_offset(self) -> int:
        return 0


class MagiEngine(EngineBase):
    """A loaded MAGI-1 plus its chunk pipeline and KV pool."""

    capabilities: ClassVar[Capabilities] = MAGI

    def __init__(self, model: MagiModel, pool: KVPool | None = None, kv_pages: int | None = None) -> None:
        """Sessions share `pool`, or a pool of `kv_pages` pages of one latent frame at the model's native
        resolution (what a worker holds); with neither, each session sizes its own."""
        if pool is not None and kv_pages is not None:
            raise ValueError("pass pool or kv_pages, not both")
        self.model = model
        self.pipeline = MagiPipeline(model.dit, model.preset.sampling, pool)
        if kv_pages is not None:
            spec = self.pipeline.pool_spec(model.height // 8, model.width // 8, kv_pages, str(self.pipeline.device))
            self.pipeline.pool = KVPool(spec)

    @property
    def pool(self) -> KVPool | None:
        return self.pipeline.pool

    def batcher(self, max_tokens: int | None = None, on_forward: Any = None) -> BlockBatcher:
        """A batcher for the worker's job loop; MAGI-1 jobs run whole, so it never calls the DiT."""
        tokens = max_tokens if max_tokens is not None else default_max_tokens(self.pipeline.device)
        return BlockBatcher(self.model.dit, tokens, on_forward)

    def open(
        self,
        prompt: str,
        *,
        width: int | None = None,
        height: int | None = None,
        seed: int = 0,
        num_blocks: int | None = None,
        session_id: str | None = None,
    ) -> MagiSession:
        return MagiSession(
            self,
            prompt,
            width or self.model.width,
            height or self.model.height,
            seed,
            num_blocks,
            session_id or uuid.uuid4().hex,
        )

    def _open(self, request: SessionRequest) -> MagiSession:
        if request.actions is not None:
            raise UserError(f"{self.capabilities.name} takes no actions; steer it with prompts")
        assert request.prompt is not None  # EngineBase.open_session checked it
        return self.open(
            request.prompt,
            width=request.width,
            height=request.height,
            seed=request.seed,
            num_blocks=request.num_blocks,
            session_id=request.session_id,
        )
