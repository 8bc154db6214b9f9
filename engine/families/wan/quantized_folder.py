"""`inferix quantize` for Wan-family models (the families whose capabilities say they quantize): a model
folder whose DiT checkpoint holds quantized weights and scales."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import save_file

from engine.families.wan.checkpoint import load_dit
from engine.families.wan.loader import MODEL_YAML, TOYWORLD_WEIGHTS, builtin_model_name, resolve_model_dir
from engine.quant.dit import quantize_linears, weight_bytes
from engine.quant.linear import QuantLinear
from engine.quant.modes import QuantMode
from inferix.errors import UserError
from inferix.spec.presets import read_yaml

__all__ = ["QuantizedFolder", "quantized_dit_name", "write_quantized_folder"]


@dataclass(frozen=True)
class QuantizedFolder:
    """What `write_quantized_folder` wrote."""

    path: Path
    mode: QuantMode
    dit_file: Path
    source_bytes: int  # the DiT's weights as the source stores them
    quantized_bytes: int  # the written DiT's tensors (8-bit weights, scales, the layers kept as stored)


def quantized_dit_name(mode: QuantMode) -> str:
    return f"dit-{mode.name}.safetensors"


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows one (no second copy of a large file), else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, copy_function=_link_file)
    else:
        _link_file(source, target)


def _link_file(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_quantized_folder(model: str | Path | None, mode: QuantMode, out: Path) -> QuantizedFolder:
    """Quantize the DiT of model folder ``model`` (None or "toyworld": the built-in toyworld weights)
    and write a model folder to ``out`` that loads as it is: ``model.yaml`` with ``quant: <mode>``,
    the quantized DiT (safetensors), and the VAE, text encoder and tokenizer (hard links or copies).

    The folder is written next to ``out`` and renamed into place, so a failure leaves nothing half-written.
    """
    if not mode.enabled:
        raise UserError("--quant none writes nothing: choose int8, int8-wo, fp8 or fp8-tensor")
    builtin = builtin_model_name(model) if model is not None else "toyworld"
    if builtin == "tiny":
        raise UserError("the tiny model has built-in random weights and no folder; quantize it on load: --quant")
    root = TOYWORLD_WEIGHTS if builtin == "toyworld" else Path(model)  # type: ignore[arg-type]
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} already exists and is not an empty folder; choose a new path")
    folder = resolve_model_dir(root)
    # As stored, with a LoRA adapter merged: the folder written holds the merged weights and no adapter.
    dit = load_dit(folder.dit, folder.preset.dit, weights=folder.files.dit_weights, adapter=folder.adapter)
    if any(isinstance(m, QuantLinear) for m in dit.modules()):
        raise UserError(f"{folder.dit} is quantized already; quantize its full-precision checkpoint")
    source_bytes = weight_bytes(dit)
    quantized = quantize_linears(dit, mode)  # what loading the source with --quant gives
    yaml_path = folder.root / MODEL_YAML
    config: dict[str, Any] = (
        read_yaml(yaml_path, "model config") if yaml_path.is_file() else {"preset": folder.preset.name}
    )
    files: dict[str, Any] = dict(config.get("files") or {})
    files["dit"] = quantized_dit_name(mode)
    for key, path in (("vae", folder.vae), ("text_encoder", folder.text_encoder), ("tokenizer", folder.tokenizer)):
        files[key] = path.name
    files.pop("dit_weights", None)  # a flat state dict: no EMA / generator choice
    if folder.adapter is not None:
        files["lora"] = []  # merged already (the preset's adapter must not apply twice)
    config["files"], config["quant"] = files, mode.name
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        staging.chmod(0o755)  # a model folder like any other, not mkdtemp's private one
        state = {name: t.contiguous() for name, t in quantized.state_dict().items()}
        save_file(state, str(staging / files["dit"]), metadata={"inferix_quant": mode.name})
        (staging / files["dit"]).chmod(0o644)
        for path in (folder.vae, folder.text_encoder, folder.tokenizer):
            _link_or_copy(path, staging / path.name)
        header = f"# Written by `inferix quantize --quant {mode.name}` from {folder.root}.\n"
        (staging / MODEL_YAML).write_text(header + yaml.safe_dump(config, sort_keys=False))
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return QuantizedFolder(
        out, mode, out / files["dit"], source_bytes, sum(t.numel() * t.element_size() for t in state.values())
    )
