"""Loading Matrix-Game 2.0: the DiT checkpoint (reference names, optionally under the released
`model.` prefix), and whole models -- a model folder, or the built-in random-weights tiny model.

Layout of a model folder (file names as released in Skywork/Matrix-Game-2.0; each can be changed
under ``files:`` in ``model.yaml``)::

    DIR/model.yaml                    ``preset: matrixgame2-universal`` (or -gta_drive, -templerun)
    DIR/base_distilled_model/base_distill.safetensors      the DiT (universal; gta_drive:
                                      gta_distilled_model/gta_keyboard2dim.safetensors, templerun:
                                      templerun_distilled_model/templerun_7dim_onlykey.safetensors)
    DIR/Wan2.1_VAE.pth                the Wan2.1 VAE
    DIR/models_clip_open-clip-xlm-roberta-large-vit-huge14.pth   the CLIP (its vision tower is used)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine.checkpoint import load_into, read_state_dict, seeded_state_dict
from engine.families.matrixgame.clip import CLIPVisionConfig, CLIPVisionEncoder
from engine.families.matrixgame.config import MatrixGameConfig
from engine.families.matrixgame.dit import MatrixGameDiT
from engine.families.wan.vae import WanVAE
from engine.precision import warn_if_emulated
from inferix.errors import UserError
from inferix.spec.architectures import WanVAEConfig
from inferix.spec.families.matrixgame import (
    MODEL_PREFIX,
    TINY_MODEL,
    MatrixGamePreset,
    load_matrixgame_preset,
    matrixgame_variant,
)
from inferix.spec.presets import read_yaml

__all__ = ["MatrixGameModel", "load_matrixgame_dit", "load_matrixgame_folder", "load_tiny_matrixgame"]

RELEASED_PREFIX = "model."
# Playback rate of the MP4s (Wan2.1's 16 fps); it does not change the frames.
FPS = 16
DIT_FILES = {
    "universal": "base_distilled_model/base_distill.safetensors",
    "gta_drive": "gta_distilled_model/gta_keyboard2dim.safetensors",
    "templerun": "templerun_distilled_model/templerun_7dim_onlykey.safetensors",
}
VAE_FILE = "Wan2.1_VAE.pth"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge14.pth"

# The built-in tiny model: the golden case's sizes (tests/golden/matrixgame2_tiny/config.json) with
# the universal preset's actions and sampling; weights from these seeds (`seeded_state_dict`).
TINY_SEEDS = {"dit": 2501, "vae": 2502, "clip": 2503}
TINY_DIT: dict[str, Any] = {
    "dim": 64, "ffn_dim": 128, "freq_dim": 32, "num_heads": 2, "num_layers": 2, "in_dim": 36, "out_dim": 16,
    "eps": 1e-6, "model_type": "i2v", "local_attn_size": 6, "sink_size": 0,
    "action_config": {
        "blocks": [0], "enable_keyboard": True, "enable_mouse": True, "heads_num": 2, "hidden_size": 16,
        "img_hidden_size": 64, "keyboard_dim_in": 4, "keyboard_hidden_dim": 128, "mouse_dim_in": 2,
        "mouse_hidden_dim": 128, "mouse_qk_dim_list": [8, 28, 28], "qk_norm": True, "qkv_bias": False,
        "rope_theta": 256, "vae_time_compression_ratio": 4, "windows_size": 3,
    },
}  # fmt: skip
TINY_CLIP_DIM = 32
TINY_VAE = WanVAEConfig(dim=4, num_res_blocks=1)
TINY_CLIP = CLIPVisionConfig(
    image_size=28, patch_size=14, vision_dim=32, vision_heads=2, vision_layers=3, vision_mlp_ratio=4, embed_dim=16
)

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


@dataclass
class MatrixGameModel:
    """A loaded Matrix-Game 2.0: the DiT (in the run's dtype), the VAE and the CLIP tower (fp32)."""

    name: str  # the model name: matrixgame2-<variant>, or matrixgame2-tiny
    preset: MatrixGamePreset
    dit: MatrixGameDiT
    vae: WanVAE
    clip: CLIPVisionEncoder
    source: Path | None  # the model folder; None for built-in random weights
    fps: int = FPS

    @property
    def height(self) -> int:
        return self.preset.height

    @property
    def width(self) -> int:
        return self.preset.width


def load_matrixgame_dit(
    path: str | Path,
    config: MatrixGameConfig,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
) -> MatrixGameDiT:
    state = read_state_dict(path, "Matrix-Game DiT checkpoint", "Expected the CausalWanModel state dict.")
    if state and all(name.startswith(RELEASED_PREFIX) for name in state):
        state = {name.removeprefix(RELEASED_PREFIX): tensor for name, tensor in state.items()}
    dit = load_into(
        lambda: MatrixGameDiT(config, attention_backend),
        state,
        path,
        dtype=dtype,
        device=device,
        what="Matrix-Game DiT",
        hint="check the DiT config (dim, num_layers, action_config) against the checkpoint",
    )
    return dit.eval()


def _folder_files(root: Path) -> tuple[str, dict[str, Path]]:
    """The variant a folder's model.yaml names and its files (dit, vae, clip), each checked to exist."""
    yaml_path = root / "model.yaml"
    data = read_yaml(yaml_path, "model config")
    unknown = sorted(set(data) - {"preset", "files"})
    if unknown:
        raise UserError(f"{yaml_path}: unknown key(s) {', '.join(unknown)} (expected preset, files)")
    name = data.get("preset")
    variant = matrixgame_variant(name) if isinstance(name, str) else None
    if variant is None:
        raise UserError(f"{yaml_path}: preset must be {MODEL_PREFIX}universal, -gta_drive or -templerun, got {name!r}")
    names = {"dit": DIT_FILES[variant], "vae": VAE_FILE, "clip": CLIP_FILE}
    overrides = data.get("files") or {}
    if not isinstance(overrides, dict) or set(overrides) - set(names):
        raise UserError(f"{yaml_path}: files: maps dit, vae and clip to paths in the folder, got {overrides!r}")
    names.update({key: str(value) for key, value in overrides.items()})
    paths = {key: root / value for key, value in names.items()}
    for key, path in paths.items():
        if not path.is_file():
            raise UserError(
                f"Matrix-Game model folder {root}: missing the {key} file {path} (or set files.{key} in model.yaml)"
            )
    return variant, paths


def load_matrixgame_folder(
    root: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", attention_backend: str = "auto"
) -> MatrixGameModel:
    """A model folder (see the module docstring): DiT in `dtype`, VAE and CLIP in fp32, on `device`."""
    warn_if_emulated(dtype, device)
    variant, paths = _folder_files(root)
    preset = load_matrixgame_preset(variant)
    config = MatrixGameConfig.from_reference(preset.model_config)
    dit = load_matrixgame_dit(paths["dit"], config, dtype, device, attention_backend)
    vae = WanVAE.from_checkpoint(paths["vae"], WanVAEConfig(), device=device).eval()
    clip = CLIPVisionEncoder.from_checkpoint(paths["clip"], CLIPVisionConfig(), device=device).eval()
    return MatrixGameModel(MODEL_PREFIX + variant, preset, dit, vae, clip, root)


def load_tiny_matrixgame(
    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", attention_backend: str = "auto"
) -> MatrixGameModel:
    """The built-in tiny model: deterministic random weights, the same on every machine."""
    universal = load_matrixgame_preset("universal")
    preset = dataclasses.replace(
        universal,
        name=TINY_MODEL,
        description="tiny random-weights Matrix-Game 2.0 (universal actions), for tests and smoke runs",
        model_config=TINY_DIT,
        height=32,
        width=48,
    )
    source = f"built-in random weights of {TINY_MODEL}"

    def build(factory: Callable[[], ModuleT], seed: int, weights: torch.dtype) -> ModuleT:
        return load_into(factory, seeded_state_dict(factory, seed), source, dtype=weights, device=device).eval()

    config = MatrixGameConfig.from_reference(TINY_DIT, TINY_CLIP_DIM)
    dit = build(lambda: MatrixGameDiT(config, attention_backend), TINY_SEEDS["dit"], dtype)
    vae = build(lambda: WanVAE(TINY_VAE), TINY_SEEDS["vae"], torch.float32)
    clip = build(lambda: CLIPVisionEncoder(TINY_CLIP), TINY_SEEDS["clip"], torch.float32)
    return MatrixGameModel(TINY_MODEL, preset, dit, vae, clip, None)
