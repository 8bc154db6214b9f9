"""Causal Wan DiT checkpoints: Self Forcing / CausVid files, Wan-AI and diffusers folders, LoRA merged at load.

The generic reading and loading (`read_checkpoint`, `load_into`) is `engine.checkpoint`; this module
knows the Wan DiT's layouts and names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from engine.checkpoint import (
    StateDict,
    as_state_dict,
    load_into,
    read_checkpoint,
    read_sharded,
    read_state_dict,
)
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.lora import LoraAdapter, merge_lora
from engine.quant import (
    QuantMode,
    check_quant_device,
    quantize_linears,
    quantized_skeleton,
    run_mode,
    stored_quant,
)
from inferix.errors import CheckpointError, UserError
from inferix.spec.architectures import DiTWeights, WanDiTConfig

__all__ = [
    "dit_config_from_wan_config",
    "dit_state_from_checkpoint",
    "from_diffusers_names",
    "load_dit",
    "read_wan_folder",
]

WAN_CONFIG = "config.json"
WAN_WEIGHTS = "diffusion_pytorch_model.safetensors"
WAN_INDEX = "diffusion_pytorch_model.safetensors.index.json"

# ---- DiT layouts --------------------------------------------------------------------------------
_GENERATOR_KEYS = ("generator_ema", "generator")
_WRAPPER_PREFIX = "model."  # WanDiffusionWrapper.model in Self Forcing and CausVid

# diffusers WanTransformer3DModel name fragment -> ours, the inverse of TRANSFORMER_KEYS_RENAME_DICT in
# diffusers' scripts/convert_wan_to_diffusers.py (T2V entries). Top level, then inside ``blocks.N.``.
_DIFFUSERS_TOP = {
    "condition_embedder.time_embedder.linear_1.": "time_embedding.0.",
    "condition_embedder.time_embedder.linear_2.": "time_embedding.2.",
    "condition_embedder.text_embedder.linear_1.": "text_embedding.0.",
    "condition_embedder.text_embedder.linear_2.": "text_embedding.2.",
    "condition_embedder.time_proj.": "time_projection.1.",
    "proj_out.": "head.head.",
    "scale_shift_table": "head.modulation",
}
_DIFFUSERS_BLOCK = {
    "attn1.to_q.": "self_attn.q.",
    "attn1.to_k.": "self_attn.k.",
    "attn1.to_v.": "self_attn.v.",
    "attn1.to_out.0.": "self_attn.o.",
    "attn1.norm_q.": "self_attn.norm_q.",
    "attn1.norm_k.": "self_attn.norm_k.",
    "attn2.to_q.": "cross_attn.q.",
    "attn2.to_k.": "cross_attn.k.",
    "attn2.to_v.": "cross_attn.v.",
    "attn2.to_out.0.": "cross_attn.o.",
    "attn2.norm_q.": "cross_attn.norm_q.",
    "attn2.norm_k.": "cross_attn.norm_k.",
    # diffusers numbers the norms in call order: its norm2 is the (affine) cross-attention norm, our
    # norm3. Its norm3 / our norm2 (before the FFN) has no parameters.
    "norm2.": "norm3.",
    "ffn.net.0.proj.": "ffn.0.",
    "ffn.net.2.": "ffn.2.",
    "scale_shift_table": "modulation",
}


def _is_diffusers_naming(state: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("condition_embedder.") or ".attn1." in k for k in state)


def _rename(name: str, table: Mapping[str, str]) -> str:
    for theirs, ours in table.items():
        if name.startswith(theirs):
            return ours + name[len(theirs) :]
    return name


def from_diffusers_names(state: StateDict) -> StateDict:
    """Rename a diffusers ``WanTransformer3DModel`` state dict to our (= Wan-AI original) names.

    Names without a counterpart (I2V image projections, ...) are kept, so the key check reports them.
    """
    renamed: StateDict = {}
    for name, tensor in state.items():
        parts = name.split(".", 2)
        if parts[0] == "blocks" and len(parts) == 3:
            renamed[f"blocks.{parts[1]}.{_rename(parts[2], _DIFFUSERS_BLOCK)}"] = tensor
        else:
            renamed[_rename(name, _DIFFUSERS_TOP)] = tensor
    return renamed


def dit_state_from_checkpoint(
    content: Mapping[str, object], source: str | Path, weights: DiTWeights = "ema"
) -> StateDict:
    """The DiT state dict (our names) inside a Self Forcing / CausVid / flat checkpoint.

    ``weights="ema"`` takes ``generator_ema`` when the checkpoint has one (Self Forcing) and
    ``generator`` otherwise (CausVid saves no EMA); ``"generator"`` insists on the raw weights.
    """
    if any(key in content for key in _GENERATOR_KEYS):
        if weights == "ema" and "generator_ema" in content:
            key = "generator_ema"
        elif "generator" in content:
            key = "generator"
        else:
            raise CheckpointError(
                f"{source} has no 'generator' weights (it holds {sorted(content)}); "
                "use the EMA weights (dit_weights: ema)"
            )
        inner = content[key]
        if not isinstance(inner, Mapping):
            raise CheckpointError(f"{source}[{key!r}] holds a {type(inner).__name__}, not a state dict")
        state = as_state_dict(inner, f"{source}[{key!r}]")
    else:
        state = as_state_dict(content, source)
    if all(name.startswith(_WRAPPER_PREFIX) for name in state):
        state = {name[len(_WRAPPER_PREFIX) :]: t for name, t in state.items()}
    return from_diffusers_names(state) if _is_diffusers_naming(state) else state


def read_wan_folder(folder: str | Path) -> tuple[StateDict, dict[str, Any]]:
    """(state dict with the file's names, ``config.json``) of a Wan / diffusers transformer folder."""
    folder = Path(folder)
    config_path = folder / WAN_CONFIG
    if not config_path.is_file():
        raise CheckpointError(
            f"DiT folder {folder} has no {WAN_CONFIG}; a Wan model folder holds {WAN_CONFIG} and "
            f"{WAN_WEIGHTS} (or its shards and {WAN_INDEX})"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {config_path}: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} must hold a JSON object of DiT hyper-parameters")
    index_path = folder / WAN_INDEX
    if index_path.is_file():
        return read_sharded(index_path, "DiT shard"), config
    if (folder / WAN_WEIGHTS).is_file():
        return read_state_dict(folder / WAN_WEIGHTS, "DiT weights"), config
    raise CheckpointError(f"DiT folder {folder} has neither {WAN_WEIGHTS} nor {WAN_INDEX}")


# config.json spellings of the diffusers WanTransformer3DModel -> our WanDiTConfig fields
_DIFFUSERS_CONFIG = {
    "in_channels": "in_dim",
    "out_channels": "out_dim",
    "num_attention_heads": "num_heads",
    "ffn_dim": "ffn_dim",
    "freq_dim": "freq_dim",
    "text_dim": "text_dim",
    "num_layers": "num_layers",
    "eps": "eps",
    "patch_size": "patch_size",
    "cross_attn_norm": "cross_attn_norm",
}
_WAN_CONFIG = ("dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads", "num_layers", "eps",
               "text_len", "text_dim", "patch_size", "qk_norm", "cross_attn_norm")  # fmt: skip


def dit_config_from_wan_config(config: Mapping[str, Any], base: WanDiTConfig, source: str | Path) -> WanDiTConfig:
    """``base`` with the architecture of a Wan-AI or diffusers ``config.json`` (T2V only)."""
    values: dict[str, Any] = {}
    if "num_attention_heads" in config:  # diffusers WanTransformer3DModel
        if config.get("image_dim") is not None or config.get("added_kv_proj_dim") is not None:
            raise CheckpointError(f"{source} describes an image-to-video Wan model; only T2V models are supported")
        values = {ours: config[theirs] for theirs, ours in _DIFFUSERS_CONFIG.items() if theirs in config}
        values["dim"] = int(config["num_attention_heads"]) * int(config.get("attention_head_dim", 128))
        qk_norm = config.get("qk_norm", "rms_norm_across_heads")
        if qk_norm not in ("rms_norm_across_heads", None):
            raise CheckpointError(f"{source}: qk_norm={qk_norm!r} is not supported (rms_norm_across_heads or null)")
        values["qk_norm"] = qk_norm is not None
    else:
        if config.get("model_type", "t2v") != "t2v":
            raise CheckpointError(
                f"{source} describes a {config['model_type']!r} Wan model; only t2v models are supported"
            )
        values = {key: config[key] for key in _WAN_CONFIG if key in config}
    try:
        return dataclasses.replace(base, **values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: invalid DiT configuration ({exc})") from exc


_DIT_HINT = (
    "check the DiT section of the preset / model.yaml (dim, ffn_dim, num_heads, num_layers, text_dim): "
    "Self Forcing and CausVid checkpoints are Wan2.1-T2V-1.3B (dim 1536, 30 layers)"
)


def load_dit(
    path: str | Path,
    config: WanDiTConfig,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    weights: DiTWeights = "ema",
    attention_backend: str = "auto",
    quant: QuantMode | None = None,
    adapter: LoraAdapter | None = None,
) -> CausalWanDiT:
    """Load a causal Wan DiT from a checkpoint file or a Wan model folder (see the module docstring).

    For a folder, the architecture comes from its ``config.json`` (fields it does not set keep
    ``config``'s values); for a file, from ``config``. A quantized checkpoint (`engine.quant`)
    loads as it is; ``quant`` quantizes a full-precision one on load, from its stored values, so
    that the result equals loading what `inferix quantize` writes from it. ``adapter`` (a LoRA) is
    merged into the full-precision weights before anything else.
    """
    path = Path(path)
    shard_of: Callable[[str], str | None] | None = None
    if path.is_dir():
        raw, wan_config = read_wan_folder(path)
        config = dit_config_from_wan_config(wan_config, config, path / WAN_CONFIG)
        state = from_diffusers_names(raw) if _is_diffusers_naming(raw) else raw
        if (path / WAN_INDEX).is_file():
            shard_of = json.loads((path / WAN_INDEX).read_text())["weight_map"].get  # read_wan_folder checked it
    else:
        state = dit_state_from_checkpoint(read_checkpoint(path, "DiT checkpoint"), path, weights)
    state, stored = stored_quant(state, path, shard_of)
    if adapter is not None:
        if stored is not None:
            raise UserError(
                f"{path} is quantized; a LoRA adapter ({adapter.path}) merges into full-precision weights: "
                "merge it first (inferix quantize writes the merged weights and no adapter)"
            )
        state = merge_lora(state, read_checkpoint(adapter.path, "LoRA adapter"), adapter)
    mode = run_mode(quant, stored, path)
    check_quant_device(mode.is_fp8, device)

    def build() -> CausalWanDiT:
        return CausalWanDiT(config, attention_backend=attention_backend)

    dit = load_into(
        cast(Callable[[], CausalWanDiT], quantized_skeleton(build, mode)) if stored else build,
        state,
        path,
        dtype=None if mode.enabled else dtype,
        device=device,
        what="causal Wan DiT",
        hint=_DIT_HINT,
    )
    if not mode.enabled:
        return dit
    if stored is None:
        quantize_linears(dit, mode)
    return dit.to(dtype) if dtype is not None else dit
