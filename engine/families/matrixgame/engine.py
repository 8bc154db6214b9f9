"""The front door for Matrix-Game 2.0: `MatrixGameEngine` opens `MatrixGameSession`s, which turn a
start image and an action track into blocks.

The shape of `WanEngine` / `MagiEngine` where it applies: sessions yield `VideoBlock`s (clean latents
and uint8 frames), so `inferix generate` writes and hashes them unchanged. What differs: a session
opens with an image instead of a prompt, needs its length up front (the first-frame conditioning
covers every latent frame), and is steered by actions (`ActionTrack`, or `hold_actions` live)::

    engine = MatrixGameEngine.load("matrixgame2-tiny")
    track = parse_action_track(Path("moves.json"), engine.action_schema)
    with engine.open("start.png", actions=track, num_blocks=4, seed=1) as session:
        for block in session:
            ...

The frames are the sampler's (`MatrixGamePipeline`, checked stage by stage against the reference
by the golden case), converted to uint8 like every other engine's.
"""

from __future__ import annotations

import dataclasses
import io
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from engine.batching import BlockBatcher, default_max_tokens
from engine.capabilities import MATRIXGAME, Capabilities
from engine.checkpoint import parse_dtype
from engine.contract import EngineBase, ImageInput, SessionRequest, VideoBlock, committed_latents, to_uint8_frames
from engine.families.matrixgame.action import ActionInputs
from engine.families.matrixgame.conditioning import condition_on_image
from engine.families.matrixgame.loader import MatrixGameModel, load_matrixgame_folder, load_tiny_matrixgame
from engine.families.matrixgame.pipeline import MatrixGameLoop, MatrixGamePipeline
from engine.families.wan.pipeline import DiTJob
from engine.kv.pool import KVPool
from engine.noise import SeededNoise
from engine.session_tail import HostTieredCache, SessionTail
from inferix.errors import UserError
from inferix.spec.actions import ActionTrack, HeldAction, parse_held_action
from inferix.spec.blocks import CommittedBlock
from inferix.spec.families.matrixgame import TINY_MODEL, ActionSchema, MatrixGamePreset
from inferix.spec.sampling import BlockConfig, FlowMatchConfig, PipelineConfig, SamplingConfig

__all__ = [
    "ImageInput",
    "MatrixGameEngine",
    "MatrixGameSession",
    "fit_image",
    "load_matrixgame_model",
    "pipeline_config",
]


def pipeline_config(preset: MatrixGamePreset) -> PipelineConfig:
    """The sampler's settings of a preset (sigma range 0..1 as the reference's scheduler)."""
    s = preset.sampling
    sampling = SamplingConfig(
        denoising_steps=s.denoising_steps,
        warp=s.warp,
        context_noise=s.context_noise,
        schedule=FlowMatchConfig(shift=s.shift),
    )
    return PipelineConfig(BlockConfig(s.num_frame_per_block, s.local_attn_size, s.sink_size), sampling)


def load_matrixgame_model(
    model: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
    decoder: str | None = None,
    image_encoder: str | None = None,
) -> MatrixGameModel:
    """A model folder, or the built-in `matrixgame2-tiny` (random weights) unless a folder has its name.
    `decoder`: "vae" or "taehv:PATH" (None: model.yaml's, else the VAE); `image_encoder`: "vae" or
    "taehv" (the decoder's TAEHV file encodes the start image; None: model.yaml's, else the VAE)."""
    weights = parse_dtype(dtype)
    if str(model) == TINY_MODEL and not Path(model).exists():
        return load_tiny_matrixgame(weights, device, attention_backend, decoder, image_encoder)
    return load_matrixgame_folder(Path(model).expanduser(), weights, device, attention_backend, decoder, image_encoder)


def _read_image(image: ImageInput) -> np.ndarray:
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise UserError(f"the start image must be uint8 [H, W, 3] RGB, got {image.dtype} {list(image.shape)}")
        return image
    source = io.BytesIO(image) if isinstance(image, bytes) else image
    try:
        with Image.open(source) as opened:
            return np.asarray(opened.convert("RGB"))
    except (OSError, UnidentifiedImageError) as exc:
        name = f"({len(image)} bytes)" if isinstance(image, bytes) else str(image)
        raise UserError(f"cannot read the start image {name}: {exc}") from None


def fit_image(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Center-crop to the aspect ratio of width x height, then resize (bilinear) to it, as the
    reference's `_resizecrop` + `Resize` do."""
    h, w = image.shape[:2]
    if h * width > w * height:  # taller than the target: crop rows
        crop_w, crop_h = w, round(w * height / width)
    else:
        crop_w, crop_h = round(h * width / height), h
    left, top = (w - crop_w) // 2, (h - crop_h) // 2
    cropped = Image.fromarray(image).crop((left, top, left + crop_w, top + crop_h))
    return np.asarray(cropped.resize((width, height), Image.Resampling.BILINEAR))


def _pixels(image: np.ndarray) -> Tensor:
    """uint8 [H, W, 3] -> [1, 3, H, W] in [-1, 1] (ToTensor + Normalize(0.5, 0.5))."""
    return torch.from_numpy(image.copy()).permute(2, 0, 1).unsqueeze(0).float() / 127.5 - 1.0


class MatrixGameSession(SessionTail[VideoBlock]):
    """One world: a start image and actions in, `VideoBlock`s out. Iterate it or call `next_block()`."""

    def __init__(
        self,
        engine: MatrixGameEngine,
        image: ImageInput | None,
        actions: ActionTrack | None,
        width: int,
        height: int,
        seed: int,
        num_blocks: int | None,
        session_id: str,
    ) -> None:
        model = engine.model
        factor = model.vae.config.spatial_factor * model.dit.config.dit.patch_size[1]
        if width % factor or height % factor or width <= 0 or height <= 0:
            raise UserError(f"resolution {width}x{height} must be positive multiples of {factor} (e.g. 640x352)")
        if image is None:
            raise UserError(f"{model.name} is image-to-world: it needs a start image (--image)")
        if num_blocks is None or num_blocks < 1:
            raise UserError(f"a Matrix-Game session needs its number of blocks up front (at least 1), got {num_blocks}")
        self.model = model
        self.schema: ActionSchema = engine.action_schema
        self.width, self.height = width, height
        nf = engine.pipeline.config.block.num_frame_per_block
        ratio = model.dit.config.action.vae_time_compression_ratio
        latent_frames = num_blocks * nf
        track = actions or ActionTrack("actions")
        rows = track.rows(engine.action_schema, 1 + ratio * (latent_frames - 1), nf, ratio)
        device = model.dit.patch_embedding.weight.device
        inputs = ActionInputs(
            torch.tensor([rows.keyboard], dtype=torch.float32, device=device),
            None if rows.mouse is None else torch.tensor([rows.mouse], dtype=torch.float32, device=device),
        )
        pixels = _pixels(fit_image(_read_image(image), width, height)).to(model.vae.conv1.weight.device)
        conditioning = condition_on_image(model.vae, model.clip, pixels, latent_frames, model.taehv_encoder)
        self.loop: MatrixGameLoop = engine.pipeline.open_session(
            conditioning, inputs, SeededNoise(seed), pool=engine.pool, session_id=session_id
        )
        self.next_frame = 0
        # Matrix-Game has no text conditioning; the mesh's block events carry this empty prompt.
        self.prompt_text = ""

    def hold_actions(self, keyboard: Tensor, mouse: Tensor | None = None) -> None:
        """Live control: keys [K] and mouse [axes] for the next block (see `MatrixGameLoop.hold_actions`)."""
        self.loop.hold_actions(keyboard, mouse)

    def hold(self, action: HeldAction) -> None:
        """Hold a parsed action (`parse_held_action`) during the next block: the same raw rows as a
        track entry starting at that block."""
        keyboard = torch.tensor(action.keyboard_row(self.schema))
        mouse = action.mouse_row(self.schema)
        self.hold_actions(keyboard, None if mouse is None else torch.tensor(mouse))

    def block_job(self) -> DiTJob[VideoBlock]:
        """`next_block` as a batcher job: a Matrix-Game block runs whole, alone (one session per call)."""
        yield from ()
        return self.next_block()

    @torch.no_grad()
    def restore(self, committed: Sequence[CommittedBlock], *, from_start: bool = True) -> list[int]:
        """Continue after committed blocks (in order; a long history may come in several calls): each
        is replayed under the action it was made with -- its context pass rewrites every cache the
        block wrote, its decode advances the VAE's state -- so the next block is the one an
        uninterrupted session makes. Returns each block's pixel-frame count."""
        world = self.loop
        if from_start and world.next_block_index:
            raise RuntimeError("restore from the start needs a fresh session")
        frames = []
        for block in committed:
            if block.block_index != world.next_block_index:
                raise UserError(
                    f"committed block {block.block_index}: the session's next block is {world.next_block_index}"
                )
            self.hold(parse_held_action(self.schema, list(block.action_keys), list(block.action_mouse), "action"))
            frames.append(int(world.replay_block(committed_latents(block)).shape[1]))
        self.next_frame += sum(frames)
        return frames

    def new_redecode_state(self) -> Any:
        return self.model.decoder.new_decode_state()

    @torch.no_grad()
    def redecode(self, block: CommittedBlock, state: Any) -> np.ndarray:
        """A committed block's frames again (for a restarted streamer), decoded as `next_block` does."""
        x0 = committed_latents(block).to(self.model.vae.conv1.weight.device)
        return to_uint8_frames(self.model.decoder.decode_block(x0.half().to(x0.dtype), state))

    @property
    def kv_cache(self) -> HostTieredCache:
        return self.loop.cache

    @torch.no_grad()
    def next_block(self) -> VideoBlock:
        """The next block; `denoise_s` covers the whole block, decode included (the sampler decodes it)."""
        began = time.perf_counter()
        block = self.loop.generate_block()
        frames = to_uint8_frames(block.video)
        first = self.next_frame
        self.next_frame += frames.shape[0]
        return VideoBlock(
            index=block.index,
            start_frame=block.start_frame,
            first_frame=first,
            latents=block.latents.float().cpu(),
            frames=frames,
            prompt="",
            denoise_s=time.perf_counter() - began,
            context_s=0.0,
            decode_s=0.0,
        )

    def close(self) -> None:
        self.loop.close()


class MatrixGameEngine(EngineBase):
    """A loaded Matrix-Game 2.0 plus its sampler; opens `MatrixGameSession`s."""

    capabilities: ClassVar[Capabilities] = MATRIXGAME

    def __init__(self, model: MatrixGameModel, kv_pages: int | None = None) -> None:
        """Sessions share a pool of `kv_pages` pages (one latent frame each, at the model's native size),
        or, without it, each holds its own window."""
        self.model = model
        self.pipeline = MatrixGamePipeline(model.dit, model.decoder, pipeline_config(model.preset))
        self.pool: KVPool | None = None
        if kv_pages is not None:
            factor = model.vae.config.spatial_factor
            spec = self.pipeline.pool_spec(model.height // factor, model.width // factor)
            self.pool = KVPool(dataclasses.replace(spec, num_pages=kv_pages))

    @classmethod
    def load(
        cls,
        model: str | Path,
        *,
        dtype: torch.dtype | str = torch.float32,
        device: torch.device | str = "cpu",
        attention_backend: str = "auto",
        kv_pages: int | None = None,
        decoder: str | None = None,
        image_encoder: str | None = None,
    ) -> MatrixGameEngine:
        """A model folder, or the built-in `matrixgame2-tiny` (random weights); `decoder` and
        `image_encoder` as in `load_matrixgame_model`."""
        loaded = load_matrixgame_model(
            model,
            dtype=dtype,
            device=device,
            attention_backend=attention_backend,
            decoder=decoder,
            image_encoder=image_encoder,
        )
        return cls(loaded, kv_pages)

    def batcher(self, max_tokens: int | None = None, on_forward: Any = None) -> BlockBatcher:
        """A batcher for the worker's job loop; Matrix-Game jobs run whole, so it never calls the DiT."""
        device = self.model.dit.patch_embedding.weight.device
        tokens = max_tokens if max_tokens is not None else default_max_tokens(device)
        return BlockBatcher(self.model.dit, tokens, on_forward)

    @property
    def action_schema(self) -> ActionSchema:
        """What the model's actions are: keys, mouse axes and their ranges (`inferix.spec.actions`)."""
        return self.model.preset.actions

    def open(
        self,
        image: ImageInput | None,
        *,
        actions: ActionTrack | None = None,
        width: int | None = None,
        height: int | None = None,
        seed: int = 0,
        num_blocks: int | None = None,
        session_id: str | None = None,
    ) -> MatrixGameSession:
        """A session from `image` (resized and center-cropped to width x height, by default the model's)
        steered by `actions` (None: neutral: no key, still mouse)."""
        return MatrixGameSession(
            self,
            image,
            actions,
            width or self.model.width,
            height or self.model.height,
            seed,
            num_blocks,
            session_id or uuid.uuid4().hex,
        )

    def _open(self, request: SessionRequest) -> MatrixGameSession:
        return self.open(
            request.image,
            actions=request.actions,
            width=request.width,
            height=request.height,
            seed=request.seed,
            num_blocks=request.num_blocks,
            session_id=request.session_id,
        )
