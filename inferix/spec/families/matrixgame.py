"""Matrix-Game 2.0's released variants as data: the DiT config (reference names), the sampling
settings and the action schema of each (`universal`, `gta_drive`, `templerun`).

The action schema says what a client may send per pixel frame: which keys (one column each of
`keyboard_cond`, 0/1), whether several may be held at once, and the mouse axes (columns of
`mouse_cond`) with their range. Values follow MATRIXGAME2_README.md (tests/golden) unless a yaml
comment says they come from the public Matrix-Game 2.0 configs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix.spec.action_schema import ActionKey, ActionSchema, MouseAxis
from inferix.spec.presets import VideoDefaults, read_yaml
from inferix.spec.sizing import VAE_SPATIAL_FACTOR, VAE_TEMPORAL_FACTOR, SessionShape

__all__ = [
    "ActionKey",
    "ActionSchema",
    "MODEL_PREFIX",
    "TINY_MODEL",
    "MatrixGamePreset",
    "MatrixGameSampling",
    "MouseAxis",
    "is_matrixgame_model",
    "is_matrixgame_name",
    "load_matrixgame_preset",
    "load_served_matrixgame_preset",
    "matrixgame_session_shape",
    "matrixgame_presets",
    "matrixgame_variant",
]

# Model names (`model.yaml`'s `preset:`, `--model`): the variant's preset name behind this prefix.
MODEL_PREFIX = "matrixgame2-"
# The built-in random-weights model (tests and smoke runs): the golden case's tiny sizes.
TINY_MODEL = "matrixgame2-tiny"
# Its native size (the universal variant's actions and sampling at 48x32, as its loader builds it).
TINY_WIDTH, TINY_HEIGHT = 48, 32
# Frame rate of every variant (the released demos write 16 fps).
FPS = 16
# Latent frames of a session at most: the DiT's RoPE table (as the reference's).
MAX_LATENT_FRAMES = 1024
# Spatial patch of every released variant's DiT ([1, 2, 2]).
PATCH = 2


@dataclass(frozen=True)
class MatrixGameSampling:
    """Self-Forcing sampling: warped few-step schedule, blocks of latent frames, a rolling window."""

    denoising_steps: tuple[float, ...] = (1000, 666, 333)
    warp: bool = True
    num_frame_per_block: int = 3
    local_attn_size: int = 6
    sink_size: int = 0
    context_noise: float = 0.0
    shift: float = 5.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "denoising_steps", tuple(self.denoising_steps))
        if self.local_attn_size < self.sink_size + self.num_frame_per_block:
            raise ValueError(
                f"local_attn_size={self.local_attn_size} must hold sink_size + num_frame_per_block frames "
                "(the causal pipeline needs a window)"
            )


@dataclass(frozen=True)
class MatrixGamePreset:
    name: str
    description: str
    model_config: Mapping[str, Any]  # the reference DiT config.json (CausalWanModel.from_config)
    sampling: MatrixGameSampling
    actions: ActionSchema
    height: int = 352
    width: int = 640

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str) -> MatrixGamePreset:
        unknown = set(data) - {"name", "description", "model_config", "sampling", "actions", "video"}
        if unknown:
            raise UserError(f"{origin}: unknown section(s) {', '.join(sorted(unknown))}")
        try:
            preset = cls(
                name=str(data["name"]),
                description=str(data.get("description", "")),
                model_config=dict(data["model_config"]),
                sampling=MatrixGameSampling(**data.get("sampling", {})),
                actions=ActionSchema.from_dict(data["actions"]),
                **data.get("video", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{origin}: {exc}") from exc
        action = preset.model_config.get("action_config", {})
        if action.get("keyboard_dim_in") != preset.actions.keyboard_dim:
            raise UserError(
                f"{origin}: action_config.keyboard_dim_in differs from the schema's {preset.actions.keyboard_dim} keys"
            )
        if bool(action.get("enable_mouse")) != bool(preset.actions.mouse):
            raise UserError(f"{origin}: action_config.enable_mouse disagrees with the schema's mouse axes")
        return preset

    @property
    def video(self) -> VideoDefaults:
        """Frame rate and native size, as the other families' presets give them to the mesh."""
        return VideoDefaults(fps=FPS, height=self.height, width=self.width)


def _preset_files() -> dict[str, Traversable]:
    folder = resources.files("inferix.spec").joinpath("presets", "matrixgame2")
    return {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def matrixgame_presets() -> list[str]:
    """Names of the Matrix-Game 2.0 presets shipped with the engine."""
    return sorted(_preset_files())


def load_matrixgame_preset(name: str) -> MatrixGamePreset:
    files = _preset_files()
    if name not in files:
        raise UserError(f"unknown Matrix-Game 2.0 preset {name!r}; available: {', '.join(sorted(files))}")
    return MatrixGamePreset.from_dict(read_yaml(files[name], "preset"), f"preset {name!r}")


def matrixgame_variant(name: str) -> str | None:
    """The shipped preset a model name `matrixgame2-<variant>` names, or None (another family's name)."""
    variant = name.removeprefix(MODEL_PREFIX)
    return variant if name.startswith(MODEL_PREFIX) and variant in _preset_files() else None


def load_served_matrixgame_preset(model: str) -> MatrixGamePreset:
    """The preset of a model name a worker serves: `matrixgame2-<variant>`, or the built-in tiny one
    (the universal variant at 48x32; the control plane never builds its DiT, so the variant's
    `model_config` stands in for the tiny one's)."""
    if model == TINY_MODEL:
        universal = load_matrixgame_preset("universal")
        return dataclasses.replace(universal, name=TINY_MODEL, height=TINY_HEIGHT, width=TINY_WIDTH)
    variant = matrixgame_variant(model)
    if variant is None:
        raise UserError(f"unknown Matrix-Game 2.0 model {model!r}; available: {TINY_MODEL}, "
                        + ", ".join(MODEL_PREFIX + v for v in matrixgame_presets()))  # fmt: skip
    return dataclasses.replace(load_matrixgame_preset(variant), name=model)


def is_matrixgame_name(model: str) -> bool:
    """Whether a served model name (not a folder) is a Matrix-Game 2.0 model."""
    return model == TINY_MODEL or matrixgame_variant(model) is not None


def matrixgame_session_shape(preset: MatrixGamePreset, width: int, height: int, num_blocks: int | None) -> SessionShape:
    """A served Matrix-Game session checked and sized: its native resolution only (a worker's pool
    pages hold one latent frame at that size), its length up front (the first-frame conditioning
    covers every latent frame), a KV window of `local_attn_size` pages."""
    if (width, height) != (preset.width, preset.height):
        raise UserError(
            f"resolution {width}x{height} is not supported by model {preset.name!r}: a served Matrix-Game "
            f"session runs at the model's native {preset.width}x{preset.height}"
        )
    nf = preset.sampling.num_frame_per_block
    max_blocks = MAX_LATENT_FRAMES // nf
    if num_blocks is None or not 1 <= num_blocks <= max_blocks:
        raise UserError(
            f"a Matrix-Game session needs its number of blocks up front: between 1 and {max_blocks} blocks "
            f"({MAX_LATENT_FRAMES} latent frames), got {num_blocks or 0}"
        )
    window = preset.sampling.local_attn_size
    multiple = VAE_SPATIAL_FACTOR * PATCH
    return SessionShape(
        width=width,
        height=height,
        tokens_per_frame=(width // multiple) * (height // multiple),
        pages_per_frame=1,
        cache_frames=window,
        pages=window,
        frames_per_block=nf,
        video_frames_per_block=VAE_TEMPORAL_FACTOR * nf,
    )


def is_matrixgame_model(model: str | Path | None) -> bool:
    """Whether `--model` names a Matrix-Game 2.0 model: the built-in tiny one (unless a folder of that
    name exists), or a folder whose model.yaml names a `matrixgame2-<variant>` preset. Torch-free, so
    the CLI can pick its flags before loading anything."""
    if model is None:
        return False
    path = Path(model).expanduser()
    if str(model) == TINY_MODEL and not path.exists():
        return True
    yaml_path = path / "model.yaml"
    if not yaml_path.is_file():
        return False
    preset = read_yaml(yaml_path, "model config").get("preset")
    return isinstance(preset, str) and matrixgame_variant(preset) is not None
