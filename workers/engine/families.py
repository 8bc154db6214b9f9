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

from inferix.spec.matrixgame import is_matrixgame_model
from workers.engine.capabilities import MAGI, MATRIXGAME, WAN, Capabilities, EngineRequest, check
from workers.engine.checkpoint import parse_dtype
from workers.engine.engine import Engine
from workers.engine.magi_engine import MagiEngine
from workers.engine.matrixgame_engine import MatrixGameEngine
from workers.engine.model_dir import builtin_model_name
from workers.engine.models.magi.loader import is_magi_folder, load_magi_model

__all__ = ["AnyEngine", "family_capabilities", "load_engine", "magi_folder"]

AnyEngine = Engine | MagiEngine | MatrixGameEngine


def magi_folder(model: str | Path | None) -> Path | None:
    """The MAGI-1 model folder `model` names, or None (a built-in model or another family)."""
    if model is None or builtin_model_name(model) is not None:
        return None
    path = Path(model).expanduser()
    return path if path.is_dir() and is_magi_folder(path) else None


def family_capabilities(model: str | Path | None) -> Capabilities:
    """What the family of `model` (a folder or built-in name; None: the default) can do, known before
    anything loads, so that an option it refuses costs no load time."""
    if model is not None and is_matrixgame_model(model):
        return MATRIXGAME
    return MAGI if magi_folder(model) is not None else WAN


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
    family = family_capabilities(model)
    check(family, EngineRequest(quant=quant, kv_dtype=kv_dtype, decoder=decoder))
    if family is MATRIXGAME:
        assert model is not None  # the default model is a Wan one
        return MatrixGameEngine.load(
            model, dtype=dtype, device=device, attention_backend=attention_backend, kv_pages=kv_pages
        )
    folder = magi_folder(model)
    if folder is None:
        assert family is WAN
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
    loaded = load_magi_model(folder, parse_dtype(dtype), device)
    return MagiEngine(loaded, kv_pages=kv_pages)
