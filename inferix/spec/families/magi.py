"""MAGI-1's sampling settings: the reference's `runtime_config` + `engine_config`, as data.

Field names follow the reference's config JSON (`example/4.5B/4.5B_distill_config.json`), so a user
moving from the MAGI-1 repository reads the same numbers; `from_reference` takes that JSON's dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from inferix.errors import UserError
from inferix.spec.presets import VideoDefaults, merge_sections, read_yaml
from inferix.spec.sizing import MAX_SIDE, VAE_SPATIAL_FACTOR, SessionShape

__all__ = [
    "MagiFiles",
    "MagiPreset",
    "MagiSampling",
    "is_magi_preset",
    "load_magi_preset",
    "magi_chunk_frames",
    "magi_presets",
    "magi_session_shape",
    "tiled_frames",
]


@dataclass(frozen=True)
class MagiSampling:
    """How a MAGI-1 video is sampled: chunks, the staggered window, steps, KV ranges and guidance."""

    chunk_width: int = 6  # latent frames per chunk (24 video frames)
    window_size: int = 4  # chunks denoised together at staggered noise levels
    num_steps: int = 64
    noise2clean_kvrange: tuple[int, ...] = (5, 4, 3, 2)
    clean_chunk_kvrange: int = 1
    clean_t: float = 0.9999
    cfg_number: int = 1  # 1: distilled single pass; 3: base model's three-pass guidance
    distill: bool = True
    cfg_t_range: tuple[float, ...] = (0.0, 0.0217, 0.1, 0.3, 0.999)
    prev_chunk_scales: tuple[float, ...] = (1.5, 1.5, 1.5, 1.0, 1.0)
    text_scales: tuple[float, ...] = (7.5, 7.5, 7.5, 0.0, 0.0)
    distill_nearly_clean_chunk_threshold: float = 0.3
    prev_chunks_scale: float = 0.7  # the reference's env `prev_chunks_scale`
    fps: int = 24
    scale_factor: float = 0.18215
    temporal_downsample_factor: int = 4

    def __post_init__(self) -> None:
        for name in ("noise2clean_kvrange", "cfg_t_range", "prev_chunk_scales", "text_scales"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.cfg_number not in (1, 3):
            raise UserError(f"cfg_number must be 1 (distilled) or 3 (base model guidance), got {self.cfg_number}")
        if self.cfg_number == 1 and not self.distill:
            raise UserError("cfg_number 1 runs the distilled model: set distill: true, or cfg_number: 3")
        if not len(self.cfg_t_range) == len(self.prev_chunk_scales) == len(self.text_scales):
            raise UserError("cfg_t_range, prev_chunk_scales and text_scales must have the same length")
        if self.num_steps % self.window_size:
            raise UserError(
                f"num_steps {self.num_steps} must be a multiple of window_size {self.window_size}: "
                "each stage runs num_steps / window_size steps"
            )

    @classmethod
    def from_reference(cls, config: Mapping[str, Any]) -> MagiSampling:
        """From a reference config JSON (its runtime_config and engine_config sections are merged)."""
        merged = {**config.get("runtime_config", {}), **config.get("engine_config", {})}
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in merged.items() if k in known})


@dataclass(frozen=True)
class MagiFiles:
    """Paths of a MAGI-1 model folder's files, relative to it (the released layout's names)."""

    dit: tuple[str, ...] = ("inference_weight.distill", "inference_weight")  # first that exists
    t5: str = "t5"
    vae: str = "vae"
    special_tokens: str = "special_tokens.npz"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dit", (self.dit,) if isinstance(self.dit, str) else tuple(self.dit))


@dataclass(frozen=True)
class MagiPreset:
    """One released MAGI-1 variant: the DiT's `model_config` (reference names), sampling, video, files."""

    name: str
    description: str
    model_config: Mapping[str, Any]
    sampling: MagiSampling
    video: VideoDefaults
    files: MagiFiles

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str) -> MagiPreset:
        unknown = set(data) - {"name", "description", "model_config", "sampling", "video", "files"}
        if unknown:
            raise UserError(f"{origin}: unknown section(s) {', '.join(sorted(unknown))}")
        try:
            return cls(
                name=str(data["name"]),
                description=str(data.get("description", "")),
                model_config=dict(data["model_config"]),
                sampling=MagiSampling(**data.get("sampling", {})),
                video=VideoDefaults(**data.get("video", {"fps": 24, "height": 720, "width": 720})),
                files=MagiFiles(**data.get("files", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{origin}: {exc}") from exc

    @classmethod
    def from_reference(cls, config: Mapping[str, Any], name: str, origin: str) -> MagiPreset:
        """From a reference run config JSON (model_config / runtime_config / engine_config)."""
        runtime = config.get("runtime_config", {})
        video = VideoDefaults(
            fps=int(runtime.get("fps", 24)),
            height=int(runtime.get("video_size_h", 720)),
            width=int(runtime.get("video_size_w", 720)),
        )
        if "model_config" not in config:
            raise UserError(f"{origin}: not a MAGI-1 run config (no model_config section)")
        distill = bool(config.get("engine_config", {}).get("distill", True))
        dit = ("inference_weight.distill", "inference_weight") if distill else ("inference_weight",)
        return cls(name, f"MAGI-1 from {origin}", dict(config["model_config"]), MagiSampling.from_reference(config),
                   video, MagiFiles(dit=dit))  # fmt: skip


def magi_presets() -> list[str]:
    """Names of the MAGI-1 presets shipped with the engine."""
    return sorted(_magi_preset_files())


def _magi_preset_files() -> dict[str, Traversable]:
    folder = resources.files("inferix.spec").joinpath("presets", "magi1")
    return {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def load_magi_preset(name: str, overrides: Mapping[str, Any] | None = None, where: str | None = None) -> MagiPreset:
    """The MAGI-1 preset ``name`` with ``overrides`` (same sections) merged in."""
    files = _magi_preset_files()
    if name not in files:
        raise UserError(f"unknown MAGI-1 preset {name!r}; available: {', '.join(sorted(files))}")
    data = read_yaml(files[name], "preset")
    origin = f"preset {name!r}"
    if overrides:
        data = merge_sections(data, overrides)
        origin = f"{origin} with the overrides of {where or 'the caller'}"
    return MagiPreset.from_dict(data, origin)


def is_magi_preset(name: str) -> bool:
    return name in _magi_preset_files()


def tiled_frames(latent_frames: int, tile_latent_frames: int, temporal_factor: int) -> int:
    """Video frames MAGI-1's VAE makes of `latent_frames`: temporal tiles of `tile_latent_frames`
    decoded alone, a tile of one latent frame giving one video frame (MAGI1_README section 11)."""

    def tile(frames: int) -> int:
        return 1 if frames == 1 else frames * temporal_factor

    full, rest = divmod(latent_frames, tile_latent_frames)
    return full * tile(tile_latent_frames) + (tile(rest) if rest else 0)


def magi_chunk_frames(sampling: MagiSampling) -> int:
    """Video frames of one chunk: the VAE tiles time by half a second (`fps // 2` video frames)."""
    factor = sampling.temporal_downsample_factor
    return tiled_frames(sampling.chunk_width, (sampling.fps // 2) // factor, factor)


def magi_session_shape(preset: MagiPreset, width: int, height: int, num_blocks: int | None) -> SessionShape:
    """A MAGI-1 session's resolution checked and its KV cache sized: the look-back of clean chunks
    its KV ranges can reach, in pages of one latent frame at the preset's native resolution."""
    patch = int(preset.model_config.get("patch_size", 2))
    multiple = VAE_SPATIAL_FACTOR * patch
    if (
        not (2 * multiple <= width <= MAX_SIDE and 2 * multiple <= height <= MAX_SIDE)
        or width % multiple
        or height % multiple
    ):
        raise UserError(
            f"resolution {width}x{height} is not supported by model {preset.name!r}: width and height must be "
            f"multiples of {multiple} between {2 * multiple} and {MAX_SIDE} (native {preset.video.width}x"
            f"{preset.video.height})"
        )
    if num_blocks is not None and num_blocks < 1:
        raise UserError(f"a MAGI-1 session needs at least one chunk, got {num_blocks} blocks")

    def tokens(w: int, h: int) -> int:
        return (w // multiple) * (h // multiple)

    per_page = tokens(preset.video.width, preset.video.height)
    frame_tokens = tokens(width, height)
    if frame_tokens % per_page:
        raise UserError(
            f"resolution {width}x{height} is not supported by model {preset.name!r}: a latent frame has "
            f"{frame_tokens} tokens, which must be a multiple of the page size ({per_page} tokens, the native "
            f"{preset.video.width}x{preset.video.height})"
        )
    sampling = preset.sampling
    lookback = max(*sampling.noise2clean_kvrange, sampling.clean_chunk_kvrange) - 1
    frames = max(1, lookback) * sampling.chunk_width
    pages_per_frame = frame_tokens // per_page
    return SessionShape(
        width=width,
        height=height,
        tokens_per_frame=frame_tokens,
        pages_per_frame=pages_per_frame,
        cache_frames=frames,
        pages=frames * pages_per_frame,
        frames_per_block=sampling.chunk_width,
        video_frames_per_block=magi_chunk_frames(sampling),
    )
