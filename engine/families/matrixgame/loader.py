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

Optional keys: ``decoder: taehv:PATH`` decodes with TAEHV (``taew2_1``: the Wan 2.1 VAE's latents;
a relative PATH is in the folder), and ``image_encoder: taehv`` makes the first-image conditioning
with that TAEHV file's encoder instead of the VAE's (default ``vae``, as the reference).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine.checkpoint import load_into, read_state_dict, seeded_state_dict
from engine.decoders.select import load_decoder
from engine.decoders.taehv import TAEHV, TAEHVDecoder
from engine.families.matrixgame.clip import CLIPVisionConfig, CLIPVisionEncoder
from engine.families.matrixgame.config import MatrixGameConfig
from engine.families.matrixgame.dit import MatrixGameDiT
from engine.families.wan.vae import WanVAE
from engine.precision import warn_if_emulated
from inferix.errors import UserError
from inferix.spec.architectures import WanVAEConfig
from inferix.spec.decoders import DecoderChoice, parse_decoder
from inferix.spec.families.matrixgame import (
    MODEL_PREFIX,
    TINY_MODEL,
    MatrixGamePreset,
    load_matrixgame_preset,
    matrixgame_variant,
)
from inferix.spec.presets import read_yaml

__all__ = [
    "IMAGE_ENCODERS",
    "MatrixGameModel",
    "load_matrixgame_dit",
    "load_matrixgame_folder",
    "load_tiny_matrixgame",
]

# What makes the first-image conditioning's latents: the VAE's encoder (the reference) or TAEHV's.
IMAGE_ENCODERS = ("vae", "taehv")

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
    # What its sessions decode with (model.yaml `decoder:` or `--decoder`): the VAE, or TAEHV.
    decoder_choice: DecoderChoice = dataclasses.field(default_factory=DecoderChoice)
    taehv: TAEHVDecoder | None = None
    image_encoder: str = "vae"  # one of IMAGE_ENCODERS

    @property
    def decoder(self) -> WanVAE | TAEHVDecoder:
        """The streaming decoder of every session, its restore and its re-decode (so all decode alike)."""
        return self.vae if self.taehv is None else self.taehv

    @property
    def taehv_encoder(self) -> TAEHV | None:
        """TAEHV when it makes the first-image conditioning (`image_encoder: taehv`), else None."""
        return self.taehv.model if self.taehv is not None and self.image_encoder == "taehv" else None

    def with_decoder(self, choice: DecoderChoice, image_encoder: str = "vae") -> MatrixGameModel:
        """The model decoding with `choice`, its conditioning encoded by `image_encoder` (TAEHV needs
        `choice` to be a TAEHV file with an encoder). TAEHV runs in fp32, as the VAE does here."""
        if image_encoder not in IMAGE_ENCODERS:
            raise UserError(f"image_encoder: {image_encoder!r} is not one of {', '.join(IMAGE_ENCODERS)}")
        taehv = load_decoder(choice, self.vae, torch.float32, self.vae.conv1.weight.device)
        if image_encoder == "taehv" and (taehv is None or taehv.model.encoder is None):
            raise UserError(
                "image_encoder: taehv encodes with the TAEHV file of decoder: taehv:PATH, "
                + ("and the decoder is the VAE" if taehv is None else f"and {choice.path} has no encoder")
            )
        return dataclasses.replace(self, decoder_choice=choice, taehv=taehv, image_encoder=image_encoder)

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


FOLDER_KEYS = ("preset", "files", "decoder", "image_encoder")


def _folder_files(root: Path) -> tuple[str, dict[str, Path], dict[str, Any]]:
    """The variant a folder's model.yaml names, its files (dit, vae, clip), each checked to exist,
    and the yaml itself."""
    yaml_path = root / "model.yaml"
    data = read_yaml(yaml_path, "model config")
    unknown = sorted(set(data) - set(FOLDER_KEYS))
    if unknown:
        raise UserError(f"{yaml_path}: unknown key(s) {', '.join(unknown)} (expected {', '.join(FOLDER_KEYS)})")
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
    return variant, paths, data


def load_matrixgame_folder(
    root: Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
    decoder: str | None = None,
    image_encoder: str | None = None,
) -> MatrixGameModel:
    """A model folder (see the module docstring): DiT in `dtype`, VAE and CLIP in fp32, on `device`;
    `decoder` / `image_encoder` (None: model.yaml's, else the VAE) as in `MatrixGameModel.with_decoder`."""
    warn_if_emulated(dtype, device)
    variant, paths, data = _folder_files(root)
    preset = load_matrixgame_preset(variant)
    config = MatrixGameConfig.from_reference(preset.model_config)
    dit = load_matrixgame_dit(paths["dit"], config, dtype, device, attention_backend)
    vae = WanVAE.from_checkpoint(paths["vae"], WanVAEConfig(), device=device).eval()
    clip = CLIPVisionEncoder.from_checkpoint(paths["clip"], CLIPVisionConfig(), device=device).eval()
    model = MatrixGameModel(MODEL_PREFIX + variant, preset, dit, vae, clip, root)
    yaml_path = root / "model.yaml"
    if decoder is not None:
        choice = parse_decoder(decoder, "--decoder")
    else:
        choice = parse_decoder(str(data.get("decoder", "vae")), f"{yaml_path}: decoder", relative_to=root)
    return model.with_decoder(choice, image_encoder or str(data.get("image_encoder", "vae")))


def load_tiny_matrixgame(
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
    decoder: str | None = None,
    image_encoder: str | None = None,
) -> MatrixGameModel:
    """The built-in tiny model: deterministic random weights, the same on every machine; `decoder` /
    `image_encoder` as in `MatrixGameModel.with_decoder` (None: the VAE)."""
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
    model = MatrixGameModel(TINY_MODEL, preset, dit, vae, clip, None)
    return model.with_decoder(parse_decoder(decoder or "vae", "--decoder"), image_encoder or "vae")
