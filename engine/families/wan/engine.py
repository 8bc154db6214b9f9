"""The engine's front door: `WanEngine` opens sessions, an `WanSession` turns prompts into blocks.

This is the in-process API that `inferix generate`, the worker service, the benches and the toyworld
tools use, and that people embed in a notebook or their own server::

    from engine.families.wan.engine import WanEngine

    engine = WanEngine.load("toyworld")              # or a model folder; WanEngine(model, pool) to share a pool
    with engine.open("a red ball", num_blocks=8, seed=7) as session:
        for block in session:                      # VideoBlock: clean latents + uint8 RGB frames
            if block.index == 3:
                session.set_prompt("a green ball")  # from the next block on
            ...
        session.offload(); session.prefetch()      # park / bring back its KV pages

    sessions = [engine.open(p, num_blocks=8) for p in prompts]
    blocks = engine.batcher().run([s.block_job() for s in sessions])  # one block each, batched

An `WanSession` wraps a `BlockSession` -- the block loop of one session -- with the prompt
encoder and the streaming VAE decoder: each `next_block()` returns the block's clean latents (what
a store persists) and its decoded RGB frames (what the streamer shows). Because `inferix generate`
and the worker service run this same code, a session served through the mesh gives the same frames
as the CLI.

The block loop runs in this process (`WanLoop`) or, on a sequence-parallel worker pod
(`WanEngine(model, driver=...)`, rank 0), on every rank of the pod (`PodSession`): the DiT steps run
everywhere, while the text encoder and the VAE decode run here, on rank 0 only; the other ranks
receive prompt embeddings, never text, and decode nothing. Both implement `BlockSession`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from engine.batching import BlockBatcher, ForwardStats
from engine.capabilities import WAN, Capabilities
from engine.compiled import CompileOptions, WarmUp, compile_dit, warm_up
from engine.contract import EngineBase, SessionRequest, VideoBlock, committed_latents, to_uint8_frames
from engine.cuda_graphs import use_cuda_graphs
from engine.families.wan.loader import LoadedModel, load_wan_model
from engine.families.wan.pipeline import (
    BlockOutput,
    DiTJob,
    ReplayBlock,
    WanLoop,
    WanPipeline,
    run_solo,
)
from engine.kv.pool import KVPool
from engine.kv.session_cache import SessionUsage
from engine.noise import SeededNoise
from engine.parallel.pod_driver import PodDriver, PodSession
from engine.session_tail import BlockLoop, SessionTail
from engine.snapshot import SessionSnapshot, SnapshotMismatch, dataclass_tree, fill_dataclass
from inferix.errors import UserError
from inferix.profiling import profile
from inferix.spec.action_schema import ActionSchema
from inferix.spec.actions import ActionTrack, HeldAction, parse_held_action
from inferix.spec.blocks import CommittedBlock
from inferix.spec.sizing import native_latent_size


class SessionCache(Protocol):
    """What the front door needs of a session's KV cache (a paged cache, or a pod's proxy of one)."""

    @property
    def position_offset(self) -> int: ...

    def offload(self) -> None: ...

    def prefetch(self) -> None: ...

    def usage(self) -> SessionUsage: ...


class BlockSession(BlockLoop, Protocol):
    """The block loop of one session, in this process (`WanLoop`) or on every rank of a
    worker pod (`PodSession`)."""

    @property
    def cache(self) -> SessionCache: ...

    def generate_block(self) -> BlockOutput: ...

    def block_job(self, denoised: Callable[[BlockOutput], object] | None = None) -> DiTJob[BlockOutput]:
        """`generate_block` as a job that a `BlockBatcher` runs with other sessions' jobs; `denoised`
        (where the loop supports it) makes it yield an `Early` output before its context pass."""
        ...

    def set_prompt(self, prompt_embeds: Tensor, recache: bool = False) -> None: ...

    def replay(
        self, blocks: Sequence[ReplayBlock], next_block_index: int | None = None, *, from_start: bool = True
    ) -> None: ...

    def close(self) -> None: ...


class BlockDecoder(Protocol):
    """What a session needs of its VAE (`WanVAE`, `PatchVAE`): streaming decode, block by block."""

    def new_decode_state(self) -> Any: ...

    def decode_block(self, latents_block: Tensor, state: Any) -> Tensor: ...


def latent_size(model: LoadedModel, width: int, height: int) -> tuple[int, int]:
    """The latent (height, width) of a resolution in pixels (`UserError` if the model cannot make it)."""
    factor = model.vae.config.spatial_factor
    multiple = factor * model.dit.config.patch_size[1]
    if width % multiple or height % multiple or width <= 0 or height <= 0:
        raise UserError(f"resolution {width}x{height} must be positive multiples of {multiple} (e.g. 832x480)")
    return height // factor, width // factor


class WanSession(SessionTail[VideoBlock]):
    """One video: prompt text in, `VideoBlock`s out. Iterate it or call `next_block()`."""

    def __init__(
        self,
        model: LoadedModel,
        pipeline: WanPipeline,
        prompt: str,
        width: int,
        height: int,
        seed: int,
        num_blocks: int | None,
        session_id: str,
        driver: PodDriver | None = None,
        actions: ActionTrack | None = None,
    ) -> None:
        size = latent_size(model, width, height)
        self.model = model
        self.width, self.height = width, height
        self.prompt_text = prompt
        # An action-conditioned model (toyworld-play): what its player may send, the track of an
        # offline run, and the action a live player holds (it overrides the track from its block on).
        self.schema: ActionSchema | None = model.preset.actions
        if actions is not None and self.schema is None:
            raise UserError(f"{actions.origin}: model {model.name} takes no actions")
        self._track = actions
        self._track_rows: list[list[float]] = []
        self._held: HeldAction | None = None
        embeds = self._encode(prompt)
        # The block loop: in this process, or (rank 0 of a worker pod) on every rank of the pod.
        self.loop: BlockSession
        if driver is None:
            self.loop = pipeline.open_session(embeds, *size, seed=seed, num_blocks=num_blocks, session_id=session_id)
        else:
            self.loop = PodSession(driver, session_id, embeds, *size, seed=seed, num_blocks=num_blocks)
        self.decoder: BlockDecoder = model.decoder
        self.decode_state = self.decoder.new_decode_state()
        self.next_frame = 0

    def _encode(self, text: str) -> Tensor:
        if not text.strip():
            raise UserError("the prompt is empty: write what the video should show")
        with profile("text_encode"):
            return self.model.prompt_encoder.encode([text])

    def set_prompt(self, text: str, recache: bool = False) -> None:
        """Switch prompt at the next block boundary."""
        self.loop.set_prompt(self._encode(text), recache=recache)
        self.prompt_text = text

    @torch.no_grad()
    def next_block(self) -> VideoBlock:
        return run_solo(self.model.dit, self.block_job())

    def block_job(self) -> DiTJob[VideoBlock]:
        """`next_block` as a job: run alone, or batched with other sessions by a `BlockBatcher`.
        The block is decoded as soon as it is denoised and handed out as `Early`, so that its frames
        can leave while the context pass runs (a pod's loop decodes after it)."""
        if self.schema is not None:
            self._loop().set_key_rows(self._block_key_rows(self.loop.next_block_index))
        decoded: list[VideoBlock] = []

        def decode(denoised: BlockOutput) -> VideoBlock:
            decoded.append(self._decoded(denoised))
            return decoded[0]

        block = yield from self.loop.block_job(decode)
        if not decoded:
            return self._decoded(block)
        return dataclasses.replace(decoded[0], context_s=block.timings.context_s)

    def hold(self, action: HeldAction) -> None:
        """Hold a parsed action (`parse_held_action`) from the next block on, until the next `hold`."""
        if self.schema is None:
            raise UserError(f"model {self.model.name} takes no actions")
        self._held = action

    def _loop(self) -> WanLoop:
        if not isinstance(self.loop, WanLoop):  # capabilities refuse both for pods before this
            raise UserError("actions and KV snapshots need a session in one process (not a sequence-parallel pod)")
        return self.loop

    def _block_key_rows(self, block: int) -> Tensor:
        """The keys held in each latent frame of `block` [nf, keys]: the held action, else the track's."""
        assert self.schema is not None
        nf = self.model.pipeline_config.block.num_frame_per_block
        if self._held is not None:
            return torch.tensor([self._held.keyboard_row(self.schema)] * nf)
        end = (block + 1) * nf
        if self._track is not None and len(self._track_rows) < end:
            # Latent frames are pixel frames here (a VAE that compresses space only).
            self._track_rows = self._track.rows(self.schema, max(end, 2 * len(self._track_rows)), nf, 1).keyboard
        if self._track is None:
            return torch.zeros(nf, self.schema.keyboard_dim)
        return torch.tensor(self._track_rows[block * nf : end])

    def _decoded(self, block: BlockOutput) -> VideoBlock:
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
            recached=block.recached,
        )

    @torch.no_grad()
    def restore(self, committed: Sequence[CommittedBlock], *, from_start: bool = True) -> list[int]:
        """Continue a session from its committed blocks, in order.

        The KV cache is rebuilt by context passes and the VAE decoder state by decoding the
        committed latents again (output dropped), so the next block's frames are exactly those
        of the uninterrupted run. Returns the pixel frames of each committed block. A long
        history is restored in chunks: `from_start=False` continues the previous call.
        """
        embeds: dict[str, Tensor] = {}
        blocks = []
        for block in committed:
            if block.prompt not in embeds:
                embeds[block.prompt] = self._encode(block.prompt)
            latents = committed_latents(block)
            keys = None
            if self.schema is not None:  # replayed under the action it was made with
                held = parse_held_action(self.schema, list(block.action_keys), [], "committed block action")
                keys = torch.tensor([held.keyboard_row(self.schema)] * latents.shape[1])
                self._held = held
            blocks.append(ReplayBlock(block.start_frame, latents, embeds[block.prompt], keys, block.recached))
        if from_start:
            self.decode_state = self.decoder.new_decode_state()
            self.next_frame = 0
        restored = (0 if from_start else self.loop.next_block_index) + len(blocks)
        self.loop.replay(blocks, next_block_index=restored, from_start=from_start)
        frames = [self.decoder.decode_block(b.latents, self.decode_state).shape[1] for b in blocks]
        self.next_frame += sum(frames)
        if committed:
            self.prompt_text = committed[-1].prompt
        return frames

    def _snapshot_identity(self) -> dict[str, Any]:
        loop = self._loop()
        seed = loop.noise.seed if isinstance(loop.noise, SeededNoise) else None
        return {
            "family": "wan",
            "model": self.model.name,
            "width": self.width,
            "height": self.height,
            "seed": seed,
            "decoder": type(self.decoder).__name__,
        }

    def snapshot(self) -> SessionSnapshot:
        """A copy of everything the next block reads (see `engine.snapshot`); between blocks."""
        loop = self._loop()
        held = None if self._held is None else [list(self._held.keys), list(self._held.mouse)]
        state = {
            "loop": loop.snapshot_state(),
            "decoder": dataclass_tree(self.decode_state),
            "prompt": self.prompt_text,
            "held": held,
        }
        return SessionSnapshot(loop.next_block_index, self.next_frame, self._snapshot_identity(), state)

    @torch.no_grad()
    def load_snapshot(self, snapshot: SessionSnapshot) -> None:
        """Continue from `snapshot` (of a session of the same request) instead of replaying the blocks it
        covers; `restore(..., from_start=False)` replays the blocks committed after it. `SnapshotMismatch`
        if it is of another kind of session (the session is then left as it was)."""
        decode_state = self.redecode_state_at(snapshot)  # checks the snapshot's identity first
        loop = self._loop()
        state = snapshot.state
        try:
            loop.load_state(state["loop"])
        except ValueError as exc:  # e.g. another KV layout (--kv-dtype) than the snapshot's
            raise SnapshotMismatch(str(exc)) from exc
        prompt = str(state["prompt"])
        if prompt != self.prompt_text:
            loop._use_prompt(self._encode(prompt))
            self.prompt_text = prompt
        self.decode_state = decode_state
        self.next_frame = snapshot.next_frame
        held = state["held"]
        self._held = None if held is None else HeldAction(tuple(held[0]), tuple(held[1]))

    def new_redecode_state(self) -> Any:
        """A decoder state for `redecode`: the session's own decoder is never touched."""
        return self.decoder.new_decode_state()

    def redecode_state_at(self, snapshot: SessionSnapshot) -> Any:
        """A `redecode` state that continues at the snapshot's block (the decoder's memory it holds):
        blocks from there decode to the same frames as when they were made. `SnapshotMismatch` if it
        is of another kind of session."""
        snapshot.check_identity(self._snapshot_identity())
        return fill_dataclass(self.decoder.new_decode_state(), snapshot.state["decoder"], self._loop().pipeline.device)

    @torch.no_grad()
    def redecode(self, block: CommittedBlock, state: Any) -> np.ndarray:
        """One committed block's frames decoded anew (blocks in order from the first, or from a snapshot's
        `redecode_state_at`; one `state` for all): the same frames as when they were made."""
        return to_uint8_frames(self.decoder.decode_block(committed_latents(block), state))

    def close(self) -> None:
        self.loop.close()

    @property
    def kv_cache(self) -> SessionCache:
        return self.loop.cache

    @property
    def position_offset(self) -> int:
        """How far the session has re-based its RoPE time positions (0 until its table's end)."""
        return self.loop.cache.position_offset


def shared_pool(model: LoadedModel, kv_pages: int, kv_dtype: str = "auto") -> KVPool:
    """A KV pool for all of an engine's sessions: `kv_pages` pages of one latent frame at the model's
    native resolution (what a worker holds), K/V stored as `kv_dtype` (see `KVPoolSpec`). Sessions in
    one pool attend together when batched.

    In a pod (sequence parallelism installed on the DiT) a page is this rank's shard of a frame.
    """
    pipeline = WanPipeline(model.dit, model.pipeline_config)  # only for its cache layout
    return KVPool(pipeline.pool_spec(*native_latent_size(model.preset), kv_pages, kv_dtype))


class WanEngine(EngineBase):
    """A loaded model plus its block pipeline and KV pool; opens `WanSession`s.

    With `driver` (rank 0 of a worker pod) the pipeline and pool are the driver's, and sessions
    open on every rank of the pod. `kv_dtype` is how every pool the engine makes stores K/V (see
    `KVPoolSpec`); by default that of `pool`, else "auto".
    """

    capabilities: ClassVar[Capabilities] = WAN

    def __init__(
        self,
        model: LoadedModel,
        pool: KVPool | None = None,
        driver: PodDriver | None = None,
        kv_dtype: str | None = None,
    ) -> None:
        if driver is not None and pool is not None:
            raise ValueError("a pod's KV pool is its driver's pipeline's: pass pool or driver, not both")
        self.model = model
        self.driver = driver
        if driver is not None and model.preset.actions is not None:
            raise UserError(f"{model.name} takes actions: it runs in one process (start its worker without a pod)")
        if driver is None:
            self.pipeline = WanPipeline(model.dit, model.pipeline_config, pool, kv_dtype)
        else:
            self.pipeline = driver.engine.pipeline
            if kv_dtype is not None and kv_dtype != self.pipeline.kv_dtype:
                raise ValueError(f"the pod's pipeline stores K/V as {self.pipeline.kv_dtype!r}, not {kv_dtype!r}")

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        *,
        dtype: torch.dtype | str = torch.float32,
        device: torch.device | str = "cpu",
        attention_backend: str = "auto",
        pool: KVPool | None = None,
        kv_pages: int | None = None,
        quant: str | None = None,
        kv_dtype: str = "auto",
        decoder: str | None = None,
    ) -> WanEngine:
        """An engine over a model folder or a built-in model (`toyworld` when None, `tiny`).

        Sessions share `pool`, or a pool of `kv_pages` pages (`shared_pool`); with neither, each
        session sizes its own. The pools the engine makes store K/V as `kv_dtype` ("auto": the
        model's dtype; "fp8" / "int8": 8 bits with a scale per page and head); a given `pool`, its own.
        `decoder`: "vae" or "taehv:PATH" (None: the preset's / model.yaml's `decoder:`).
        """
        if pool is not None and kv_pages is not None:
            raise ValueError("pass pool or kv_pages, not both")
        if pool is not None and kv_dtype != "auto":
            raise ValueError("pass pool or kv_dtype, not both: a pool's spec says how it stores K/V")
        loaded = load_wan_model(
            model, dtype=dtype, device=device, attention_backend=attention_backend, quant=quant, decoder=decoder
        )
        if kv_pages is not None:
            pool = shared_pool(loaded, kv_pages, kv_dtype)
        return cls(loaded, pool, kv_dtype=None if pool is not None else kv_dtype)

    @property
    def pool(self) -> KVPool | None:
        """The KV pool sessions take their pages from (None: each session sizes its own)."""
        return self.pipeline.pool

    def compile(
        self,
        *,
        width: int | None = None,
        height: int | None = None,
        num_blocks: int | None = None,
        options: CompileOptions | None = None,
    ) -> WarmUp:
        """Compile the DiT's step with `torch.compile` and warm it up now, on a throwaway session of
        this resolution (default: the model's) in the engine's pool: sessions of that size never
        compile in their blocks (see `engine.compiled`). Without a shared pool, a global
        session's pool depends on its `num_blocks`: pass the one sessions will use.
        """
        if self.driver is not None:
            raise UserError("--compile: a sequence-parallel pod runs its DiT eagerly; start it without --compile")
        size = latent_size(self.model, width or self.model.width, height or self.model.height)
        compile_dit(self.model.dit, options or CompileOptions())
        return warm_up(self.pipeline, *size, num_blocks=num_blocks)

    def use_cuda_graphs(
        self, *, width: int | None = None, height: int | None = None, num_blocks: int | None = None
    ) -> WarmUp:
        """Replay the DiT's step from CUDA graphs (`engine.cuda_graphs`), captured now on a
        throwaway session of this resolution (default: the model's), so that no session captures in
        its blocks. The graphs address the engine's KV pool: without a shared one, the engine makes
        one sized for a session of `num_blocks` (a global-attention session needs it)."""
        if self.driver is not None:
            raise UserError("--cuda-graphs: a sequence-parallel pod runs its DiT eagerly; start it without it")
        if self.model.preset.actions is not None:
            raise UserError(f"--cuda-graphs: {self.model.name} (a DiT with a keyboard branch) runs eagerly")
        if self.model.dit.patch_embedding.weight.device.type != "cuda":
            raise UserError("--cuda-graphs needs the model on a CUDA device (--device cuda)")
        size = latent_size(self.model, width or self.model.width, height or self.model.height)
        if self.pipeline.pool is None:
            frames = self.pipeline.session_frames(num_blocks)
            self.pipeline.pool = KVPool(self.pipeline.pool_spec(*size, frames, self.pipeline.kv_dtype))
        use_cuda_graphs(self.model.dit, self.pipeline.pool)
        return warm_up(self.pipeline, *size, num_blocks=num_blocks)

    def batcher(
        self, max_tokens: int | None = None, on_forward: Callable[[ForwardStats], None] | None = None
    ) -> BlockBatcher:
        """A batcher that runs this engine's sessions' block jobs together (continuous batching); at most
        `max_tokens` token rows per forward (None: the default of the model's device)."""
        return BlockBatcher(self.model.dit, max_tokens, on_forward)

    @property
    def denoising_steps(self) -> int:
        """DiT calls that denoise one block (a context pass follows them)."""
        return len(self.pipeline.timesteps)

    def open(
        self,
        prompt: str,
        *,
        width: int | None = None,
        height: int | None = None,
        seed: int = 0,
        num_blocks: int | None = None,
        session_id: str | None = None,
        actions: ActionTrack | None = None,
    ) -> WanSession:
        """A session of `prompt`; an action-conditioned model is steered by `actions` (an offline
        track) or live by `WanSession.hold` (neither: no key held)."""
        return WanSession(
            self.model,
            self.pipeline,
            prompt,
            width or self.model.width,
            height or self.model.height,
            seed,
            num_blocks,
            session_id or uuid.uuid4().hex,
            self.driver,
            actions,
        )

    def _open(self, request: SessionRequest) -> WanSession:
        assert request.prompt is not None  # EngineBase.open_session checked it
        return self.open(
            request.prompt,
            width=request.width,
            height=request.height,
            seed=request.seed,
            num_blocks=request.num_blocks,
            session_id=request.session_id,
            actions=request.actions,
        )

    @property
    def action_schema(self) -> ActionSchema | None:
        """What the model's player sends (None: a text model)."""
        return self.model.preset.actions
