"""Model presets: everything that defines one released model, read from ``presets/<name>.yaml``.

A preset is data, not code: the DiT / VAE / text-encoder architectures, the block-causal sampling
of the reference (steps, warp, shift, timestep dtype), the video defaults (fps, resolution) and the
files a model folder holds. ``model.yaml`` in a model folder names a preset and may override any
of its sections (`load_preset`'s ``overrides``), which are merged key by key. A preset may itself
name another as its ``base`` and hold only what it changes (toyworld-play-1f: toyworld-play with
one-frame blocks).

Unknown keys are errors, so that a typo cannot silently fall back to a default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml

from inferix.errors import UserError
from inferix.spec.action_schema import ActionSchema
from inferix.spec.architectures import DiTWeights, PatchVAEConfig, UMT5Config, WanDiTConfig, WanVAEConfig
from inferix.spec.sampling import BlockConfig, FlowMatchConfig, PipelineConfig, PromptSwitchConfig, SamplingConfig

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "ModelFiles",
    "ModelPreset",
    "VideoDefaults",
    "available_presets",
    "load_preset",
    "merge_sections",
    "read_yaml",
]

_PRESET_DIR = "presets"
# The models built into the package, by name: toyworld (trained weights shipped with the engine, what
# runs without --model), toyworld-play (toyworld with a player the arrow keys steer; also trained
# and shipped), toyworld-play-1f (its weights with one-frame blocks, for interactive play) and tiny
# (deterministic random weights, for smoke tests).
BUILTIN_MODELS = ("toyworld", "toyworld-play", "toyworld-play-1f", "tiny")
DEFAULT_MODEL = "toyworld"
T = TypeVar("T")
_SECTIONS = (
    "name",
    "description",
    "dit",
    "pipeline",
    "vae",
    "text_encoder",
    "video",
    "files",
    "random_weights",
    "quant",
    "actions",
    "decoder",
)


@dataclass(frozen=True)
class VideoDefaults:
    """What the model was trained to produce: its frame rate and its default pixel size."""

    fps: int = 16
    height: int = 480
    width: int = 832

    def __post_init__(self) -> None:
        for name in ("fps", "height", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ModelFiles:
    """Paths of a model folder's files, relative to the folder (absolute paths are kept as given).

    ``dit`` lists candidates, the first that exists is used: a checkpoint file or a Wan model
    folder. ``dit_source`` / ``base_source`` tell the user how to get the DiT checkpoint and the
    Wan2.1 base files (VAE, text encoder, tokenizer) when they are missing. ``lora`` (candidates
    too; none by default) is a LoRA adapter merged into the DiT at load, W + lora_alpha / lora_rank
    * B A (LongLive ships its generator as a base checkpoint plus such an adapter).
    """

    dit: tuple[str, ...]
    vae: str = "Wan2.1_VAE.pth"
    text_encoder: str = "models_t5_umt5-xxl-enc-bf16.pth"
    tokenizer: str = "google/umt5-xxl"
    dit_weights: DiTWeights = "ema"
    dit_source: str = ""
    base_source: str = ""
    lora: tuple[str, ...] = ()
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_source: str = ""

    def __post_init__(self) -> None:
        dit = (self.dit,) if isinstance(self.dit, str) else tuple(self.dit)
        object.__setattr__(self, "dit", dit)
        if not dit or not all(isinstance(p, str) and p for p in dit):
            raise ValueError(f"dit must name at least one checkpoint file or folder, got {self.dit!r}")
        lora = (self.lora,) if isinstance(self.lora, str) else tuple(self.lora or ())
        object.__setattr__(self, "lora", tuple(p for p in lora if p))
        if self.lora and (not isinstance(self.lora_rank, int) or self.lora_rank < 1 or not self.lora_alpha > 0):
            raise ValueError(
                f"a LoRA adapter needs lora_rank >= 1 and lora_alpha > 0 (as it was trained), "
                f"got lora_rank={self.lora_rank!r}, lora_alpha={self.lora_alpha!r}"
            )
        if self.dit_weights not in get_args(DiTWeights):
            raise ValueError(f"dit_weights must be one of {get_args(DiTWeights)}, got {self.dit_weights!r}")


@dataclass(frozen=True)
class ModelPreset:
    """One model: architectures, block sampling, video defaults, and where its weights come from.

    Exactly one of ``files`` (weights read from a model folder) and ``random_weights_seed``
    (deterministic random weights built in-process, for the ``tiny`` smoke-test model) is set.
    """

    name: str
    description: str
    dit: WanDiTConfig
    pipeline: PipelineConfig
    vae: WanVAEConfig | PatchVAEConfig
    text_encoder: UMT5Config
    video: VideoDefaults
    files: ModelFiles | None = None
    random_weights_seed: int | None = None
    # The DiT's default quantization (`--quant`); a quantized checkpoint's model.yaml names its own.
    quant: str = "none"
    # What a player sends an action-conditioned model (its DiT has `action`); None: a text model.
    actions: ActionSchema | None = None
    # What decodes its latents: "vae" (its own) or "taehv:PATH" (inferix.spec.decoders; `--decoder`).
    decoder: str = "vae"

    def __post_init__(self) -> None:
        if not isinstance(self.quant, str) or not self.quant:
            raise ValueError(f"quant must name a quantization mode (e.g. none, int8, fp8), got {self.quant!r}")
        if (self.files is None) == (self.random_weights_seed is None):
            raise ValueError("a preset needs exactly one of 'files' and 'random_weights'")
        dit, vae, text = self.dit, self.vae, self.text_encoder
        if (dit.action is None) != (self.actions is None):
            raise ValueError("'actions' (the schema) and dit.action (the keyboard branch) come together")
        branch, schema = dit.action, self.actions
        if branch is not None and schema is not None and (schema.mouse or schema.keyboard_dim != branch.keys):
            raise ValueError(
                f"actions: the DiT's keyboard branch takes {branch.keys} keys and no mouse; the schema "
                f"has {schema.keyboard_dim} keys and {len(schema.mouse)} mouse axes"
            )
        if dit.text_dim != text.dim:
            raise ValueError(f"dit.text_dim ({dit.text_dim}) must equal text_encoder.dim ({text.dim})")
        if text.text_len > dit.text_len:
            raise ValueError(f"text_encoder.text_len ({text.text_len}) must not exceed dit.text_len ({dit.text_len})")
        if not dit.in_dim == dit.out_dim == vae.z_dim:
            raise ValueError(
                f"dit.in_dim ({dit.in_dim}), dit.out_dim ({dit.out_dim}) and vae.z_dim ({vae.z_dim}) must be equal"
            )
        _, ph, pw = dit.patch_size
        step_h, step_w = vae.spatial_factor * ph, vae.spatial_factor * pw
        if self.video.height % step_h or self.video.width % step_w:
            raise ValueError(
                f"video size {self.video.height}x{self.video.width} must be a multiple of {step_h}x{step_w} "
                "(VAE downsampling x DiT patch)"
            )

    @property
    def fps(self) -> int:
        return self.video.fps

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> ModelPreset:
        """Build from a parsed preset (yaml); ``where`` names the source in error messages."""
        _check_keys(data, _SECTIONS, where)
        try:
            name, description = str(data["name"]), str(data.get("description", ""))
        except KeyError:
            raise UserError(f"{where}: missing 'name'") from None
        pipeline = _section(data, "pipeline", where)
        _check_keys(pipeline, ("block", "sampling", "prompt_switch"), f"{where}: pipeline")
        sampling = dict(_section(pipeline, "sampling", f"{where}: pipeline"))
        schedule = _build(FlowMatchConfig, sampling.pop("schedule", {}), f"{where}: pipeline.sampling.schedule")
        vae_section = _section(data, "vae", where)
        vae_fields = fields(PatchVAEConfig if vae_section.get("type") == "patch" else WanVAEConfig)
        _check_keys(vae_section, [f.name for f in vae_fields], f"{where}: vae")
        random = data.get("random_weights")
        files = data.get("files")
        try:
            return cls(
                name=name,
                description=description,
                dit=_build(WanDiTConfig, _section(data, "dit", where), f"{where}: dit"),
                pipeline=PipelineConfig(
                    block=_build(
                        BlockConfig, _section(pipeline, "block", f"{where}: pipeline"), f"{where}: pipeline.block"
                    ),
                    sampling=_build(SamplingConfig, {**sampling, "schedule": schedule}, f"{where}: pipeline.sampling"),
                    prompt_switch=_build(
                        PromptSwitchConfig,
                        pipeline.get("prompt_switch", {}),
                        f"{where}: pipeline.prompt_switch",
                    ),
                ),
                vae=_call(_vae_config, vae_section, f"{where}: vae"),
                text_encoder=_call(
                    UMT5Config.from_dict, _section(data, "text_encoder", where), f"{where}: text_encoder"
                ),
                video=_build(VideoDefaults, _section(data, "video", where), f"{where}: video"),
                files=None if files is None else _build(ModelFiles, files, f"{where}: files"),
                random_weights_seed=None if random is None else _random_seed(random, where),
                quant=data.get("quant", "none"),
                decoder=str(data.get("decoder", "vae")),
                actions=None
                if "actions" not in data
                else _call(ActionSchema.from_dict, data["actions"], f"{where}: actions"),
            )
        except ValueError as exc:
            if isinstance(exc, UserError):
                raise
            raise UserError(f"{where}: {exc}") from exc


def _vae_config(section: Mapping[str, Any]) -> WanVAEConfig | PatchVAEConfig:
    """`type: patch` selects the pixel-space patch autoencoder; otherwise the Wan VAE."""
    if section.get("type") == "patch":
        return PatchVAEConfig.from_dict(section)
    return WanVAEConfig.from_dict(section)


def _check_keys(data: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    accepted = set(known)
    unknown = sorted(set(data) - accepted)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; accepted keys are {sorted(accepted)}")


def _section(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise UserError(f"{where}: '{key}' must be a mapping of settings, got {value!r}")
    return value


def _build(cls: type[T], data: object, where: str) -> T:
    """``cls(**data)`` with unknown keys and invalid values reported as UserErrors naming ``where``."""
    if not isinstance(data, Mapping):
        raise UserError(f"{where}: expected a mapping of settings, got {data!r}")
    _check_keys(data, [f.name for f in fields(cls)], where)  # type: ignore[arg-type]
    return _call(lambda d: cls(**d), data, where)


def _call(build: Callable[[Mapping[str, Any]], T], data: Mapping[str, Any], where: str) -> T:
    try:
        return build(data)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, UserError):
            raise
        raise UserError(f"{where}: {exc}") from exc


def _random_seed(section: object, where: str) -> int:
    if not isinstance(section, Mapping):
        raise UserError(f"{where}: 'random_weights' must be a mapping like {{seed: 0}}, got {section!r}")
    _check_keys(section, ("seed",), f"{where}: random_weights")
    seed = section.get("seed", 0)
    if not isinstance(seed, int) or seed < 0:
        raise UserError(f"{where}: random_weights.seed must be a non-negative integer, got {seed!r}")
    return seed


def merge_sections(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in: mappings key by key (recursively), anything else replaced."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_sections(merged[key], value)
        else:
            merged[key] = value
    return merged


def _preset_files() -> dict[str, Traversable]:
    folder = resources.files("inferix.spec").joinpath(_PRESET_DIR)
    return {entry.name.removesuffix(".yaml"): entry for entry in folder.iterdir() if entry.name.endswith(".yaml")}


def available_presets() -> list[str]:
    """Names of the presets shipped with the engine."""
    return sorted(_preset_files())


def read_yaml(path: Path | Traversable, what: str) -> dict[str, Any]:
    """A yaml file that must hold a mapping, with errors naming the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read {what} {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must hold a mapping of settings, got {type(data).__name__}")
    return data


def _preset_data(name: str, files: Mapping[str, Traversable], derived: tuple[str, ...]) -> dict[str, Any]:
    """The sections of preset ``name``: a preset with ``base: OTHER`` is OTHER's sections with its own
    merged in (a variant states only what it changes). ``derived``: the presets that led here."""
    if name not in files:
        what = f"preset {derived[-1]!r}: base {name!r} is an" if derived else "an"
        raise UserError(f"{what} unknown model preset {name!r}; available presets: {', '.join(sorted(files))}")
    if name in derived:
        raise UserError(f"presets {' -> '.join((*derived, name))}: a preset cannot be its own base")
    data = read_yaml(files[name], "preset")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise UserError(f"preset {name!r} ({_PRESET_DIR}/{name}.yaml): base must be a preset name, got {base!r}")
    return merge_sections(_preset_data(base, files, (*derived, name)), data)


def load_preset(name: str, overrides: Mapping[str, Any] | None = None, where: str | None = None) -> ModelPreset:
    """The preset ``name``, with ``overrides`` (same sections as the yaml) merged in.

    ``where`` names the origin of the overrides (e.g. a model.yaml) in error messages.
    """
    data = _preset_data(name, _preset_files(), ())
    origin = f"preset {name!r} ({_PRESET_DIR}/{name}.yaml)"
    if overrides:
        data = merge_sections(data, overrides)
        origin = f"{origin} with the overrides of {where or 'the caller'}"
    return ModelPreset.from_dict(data, origin)
