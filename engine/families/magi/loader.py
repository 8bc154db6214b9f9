"""MAGI-1 model folders: from the released layout to a runnable `MagiModel`.

Layout (names as released by SandAI; each can be changed under ``files:`` in ``model.yaml``)::

    DIR/model.yaml                    ``preset: magi1-4.5b-distill`` (+ overrides), or instead:
    DIR/magi_config.json              the reference's run config (example/4.5B/4.5B_distill_config.json)
    DIR/inference_weight.distill/     the DiT: sharded safetensors + model.safetensors.index.json
                                      (inference_weight/ for the base models)
    DIR/t5/                           the HF t5-v1_1-xxl folder: config.json, weights, spiece.model
    DIR/vae/                          config.json + diffusion_pytorch_model.safetensors
    DIR/special_tokens.npz            example/assets/special_tokens.npz of the reference

Every network is built on the meta device and its weights assigned, so nothing is initialised twice.
Errors name the file and what is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint import StateDict, load_into, read_sharded, read_state_dict
from engine.families.magi.captions import SpecialTokens, load_special_tokens
from engine.families.magi.dit import MagiDiT, MagiDiTConfig
from engine.families.magi.t5 import MagiTokenizer, T5Encoder, load_t5
from engine.families.magi.vae import MagiVAEDecoder, load_magi_vae
from engine.families.wan.loader import PresetDefaults
from engine.precision import warn_if_emulated
from inferix.errors import UserError
from inferix.spec.families.magi import MagiPreset, is_magi_preset, load_magi_preset
from inferix.spec.presets import read_yaml

__all__ = ["MAGI_CONFIG_JSON", "MagiModel", "is_magi_folder", "load_magi_dit", "load_magi_model"]

MAGI_CONFIG_JSON = "magi_config.json"
_INDEX = "model.safetensors.index.json"
# Parameter names that only a Wan-family DiT has: a folder that mixes the two families is refused.
_WAN_MARKERS = ("blocks.0.self_attn.q.weight", "patch_embedding.weight", "model.blocks.0.self_attn.q.weight")


@dataclass
class MagiModel(PresetDefaults):
    """A loaded MAGI-1: DiT, T5 + tokenizer, special caption tokens and the VAE decoder."""

    preset: MagiPreset
    dit: MagiDiT
    t5: T5Encoder
    tokenizer: MagiTokenizer
    special: SpecialTokens
    vae: MagiVAEDecoder
    source: Path


def is_magi_folder(root: Path) -> bool:
    """Whether a model folder holds MAGI-1 (its model.yaml names a MAGI-1 preset, or it has a run config)."""
    if (root / MAGI_CONFIG_JSON).is_file():
        return True
    yaml_path = root / "model.yaml"
    if yaml_path.is_file():
        preset = read_yaml(yaml_path, "model config").get("preset")
        return isinstance(preset, str) and is_magi_preset(preset)
    return False


def magi_preset_of(root: Path) -> MagiPreset:
    yaml_path = root / "model.yaml"
    if yaml_path.is_file():
        data = read_yaml(yaml_path, "model config")
        name = data.pop("preset", None)
        if not isinstance(name, str):
            raise UserError(f"{yaml_path} must name a preset, e.g. 'preset: magi1-4.5b-distill'")
        return load_magi_preset(name, data, str(yaml_path))
    path = root / MAGI_CONFIG_JSON
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read the MAGI-1 run config {path}: {exc}") from exc
    return MagiPreset.from_reference(config, root.name, str(path))


def _dit_state(path: Path) -> StateDict:
    """The DiT tensors of a released weight folder (shards + index, or one file), or of one file."""
    if path.is_file():
        return read_state_dict(path, "MAGI-1 DiT weights")
    if (path / _INDEX).is_file():
        return read_sharded(path / _INDEX, "MAGI-1 DiT shard")
    files = sorted(path.glob("*.safetensors"))
    if len(files) != 1:
        raise UserError(
            f"the DiT folder {path} holds {len(files)} .safetensors files and no {_INDEX}: "
            "give the released folder with its index, or one weights file"
        )
    return read_state_dict(files[0], "MAGI-1 DiT weights")


def load_magi_dit(path: Path, config: MagiDiTConfig, dtype: torch.dtype, device: str | torch.device) -> MagiDiT:
    """The DiT of a released weight folder (or one .safetensors file), built on meta and assigned."""
    if ".fp8" in path.name:
        raise UserError(
            f"{path} holds MAGI-1's fp8 weights, which need fp8 linear layers with smooth scales that this "
            "engine does not run yet; use the bf16 weights (inference_weight or inference_weight.distill)"
        )
    state = _dit_state(path)
    for key, tensor in state.items():
        if key in _WAN_MARKERS:
            raise UserError(
                f"{path} holds Wan weights ({key}), not MAGI-1's: a model folder holds one family; "
                "put the MAGI-1 DiT there, or point model.yaml at the right preset"
            )
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise UserError(f"{path}: {key} is fp8; fp8 MAGI-1 weights are not supported yet (use the bf16 ones)")
    hint = "check that the folder and the preset are the same variant (4.5B / 24B, distill / base)"
    return load_into(lambda: MagiDiT(config), state, path, dtype=dtype, device=device, what="MAGI-1 DiT", hint=hint)


def _required(root: Path, relative: str, what: str) -> Path:
    path = root / relative
    if not path.exists():
        raise UserError(
            f"MAGI-1 model folder {root}: missing {what} {path} (or set its path under 'files:' in model.yaml)"
        )
    return path


def load_magi_model(root: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> MagiModel:
    warn_if_emulated(dtype, device)
    preset = magi_preset_of(root)
    files = preset.files
    dit_path = next((root / name for name in files.dit if (root / name).exists()), None)
    if dit_path is None:
        raise UserError(
            f"MAGI-1 model folder {root}: missing the DiT weights ({' or '.join(files.dit)}); "
            "download the variant's inference_weight folder there"
        )
    t5_path = _required(root, files.t5, "the T5 text encoder folder")
    vae_path = _required(root, files.vae, "the VAE")
    special = load_special_tokens(_required(root, files.special_tokens, "the special tokens"))
    dit = load_magi_dit(dit_path, MagiDiTConfig.from_reference(dict(preset.model_config)), dtype, device)
    t5 = load_t5(t5_path, dtype=dtype, device=device)
    tokenizer = MagiTokenizer(t5_path, max_length=int(preset.model_config.get("caption_max_length", 800)))
    vae = load_magi_vae(vae_path, None, dtype=dtype, device=device)
    return MagiModel(preset, dit, t5, tokenizer, special, vae, root)
