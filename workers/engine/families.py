"""One entry point for every model family: `load_engine` picks the engine a model folder needs.

Self Forcing / CausVid (Wan, block-causal) load into `Engine`; MAGI-1 (chunk-pipelined) into
`MagiEngine`. Both open sessions with the same surface (blocks out, prompt changes, restore from
committed blocks, KV offload), which is all `inferix generate` and the worker use. Matrix-Game 2.0
(image-to-world, steered by actions) loads into `MatrixGameEngine`, whose sessions open from an
image and an action track instead of a prompt and yield the same blocks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from inferix.errors import UserError
from inferix.spec.matrixgame import is_matrixgame_model
from workers.engine.checkpoint import parse_dtype
from workers.engine.engine import Engine
from workers.engine.magi_engine import MagiEngine
from workers.engine.matrixgame_engine import MatrixGameEngine
from workers.engine.model_dir import builtin_model_name
from workers.engine.models.magi.loader import is_magi_folder, load_magi_model

__all__ = ["AnyEngine", "load_engine", "magi_folder"]

AnyEngine = Engine | MagiEngine | MatrixGameEngine


def magi_folder(model: str | Path | None) -> Path | None:
    """The MAGI-1 model folder `model` names, or None (a built-in model or another family)."""
    if model is None or builtin_model_name(model) is not None:
        return None
    path = Path(model).expanduser()
    return path if path.is_dir() and is_magi_folder(path) else None


def load_engine(
    model: str | Path | None = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
    kv_pages: int | None = None,
    quant: str | None = None,
    kv_dtype: str = "auto",
    decoder: str | None = None,
) -> AnyEngine:
    """The engine of a model folder or built-in model (see `Engine.load`), whatever its family."""
    if decoder not in (None, "vae") and (model is not None and (is_matrixgame_model(model) or magi_folder(model))):
        raise UserError(f"--decoder {decoder}: Self Forcing / CausVid (Wan) models only for now; leave it out")
    if model is not None and is_matrixgame_model(model):
        if quant not in (None, "none"):
            raise UserError(f"--quant {quant}: Matrix-Game 2.0 runs unquantized for now (Wan-family models quantize)")
        if kv_dtype != "auto":
            raise UserError("--kv-dtype is not supported for Matrix-Game 2.0 yet; leave it at 'auto'")
        return MatrixGameEngine.load(
            model, dtype=dtype, device=device, attention_backend=attention_backend, kv_pages=kv_pages
        )
    folder = magi_folder(model)
    if folder is None:
        return Engine.load(
            model,
            dtype=dtype,
            device=device,
            attention_backend=attention_backend,
            kv_pages=kv_pages,
            quant=quant,
            kv_dtype=kv_dtype,
            decoder=decoder,
        )
    if quant not in (None, "none"):
        raise UserError(f"--quant {quant}: MAGI-1 models run unquantized for now (Wan-family models quantize)")
    if kv_dtype != "auto":
        raise UserError("--kv-dtype is not supported for MAGI-1 yet; leave it at 'auto'")
    loaded = load_magi_model(folder, parse_dtype(dtype), device)
    return MagiEngine(loaded, kv_pages=kv_pages)
