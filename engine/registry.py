"""The table of model families: how a model is recognised, loaded, what it can do, how its golden
cases are checked. Every front door (`inferix generate`, `python -m workers`, the worker service,
`inferix verify-golden`, the benches) asks this module; none branches on a family's class.

Adding a family: a folder under `engine/families/` with its engine (`EngineBase`), loop, loader and
golden checks, its `Capabilities`, and one `Family` row in `FAMILIES` (before `WAN_FAMILY`, which
takes every model the others do not claim). Golden layouts that are not a family (the TAEHV
decoder's) sit in `GOLDEN_KINDS` beside the families' own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.capabilities import MAGI, MATRIXGAME, WAN, Capabilities, EngineRequest, check
from engine.checkpoint import parse_dtype
from engine.contract import Engine
from engine.decoders.taehv_golden import is_taehv_case, verify_taehv_case
from engine.families.magi.engine import MagiEngine
from engine.families.magi.golden import is_magi_case, verify_magi_case
from engine.families.magi.loader import MagiModel, is_magi_folder, load_magi_model, magi_preset_of
from engine.families.matrixgame.engine import MatrixGameEngine, load_matrixgame_model
from engine.families.matrixgame.golden import is_matrixgame_case, verify_matrixgame_case
from engine.families.matrixgame.loader import MatrixGameModel
from engine.families.wan.engine import WanEngine, shared_pool
from engine.families.wan.golden import WanCase, verify_case
from engine.families.wan.loader import LoadedModel, builtin_model_name, load_wan_model
from engine.golden import Comparison, GoldenCase, find_cases
from engine.kv.pool import KVPool
from engine.parallel.pod_driver import PodDriver
from inferix.errors import UserError
from inferix.spec.decoders import DecoderChoice, decoder_identity
from inferix.spec.families.magi import is_magi_preset, magi_presets
from inferix.spec.families.matrixgame import is_matrixgame_model

__all__ = [
    "FAMILIES",
    "GOLDEN_KINDS",
    "Family",
    "GoldenKind",
    "LoadOptions",
    "Model",
    "decoder_of",
    "engine_for",
    "family_capabilities",
    "family_of",
    "is_wan_case",
    "kind_of",
    "load_engine",
    "load_model",
    "magi_folder",
    "wan_cases",
]

Model = LoadedModel | MagiModel | MatrixGameModel


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model's weights (what the family cannot do is refused before, by `check`)."""

    dtype: torch.dtype | str = torch.float32
    device: torch.device | str = "cpu"
    attention_backend: str = "auto"
    quant: str | None = None
    decoder: str | None = None


@dataclass(frozen=True)
class GoldenKind:
    """One layout of golden folder. `reference_only`: its checks run on the CPU in fp32 only (their
    tolerances were measured there), so another device or dtype skips it."""

    name: str
    recognises: Callable[[GoldenCase], bool]
    verify: Callable[[GoldenCase, float], list[Comparison]]
    reference_only: bool


@dataclass(frozen=True)
class Family:
    """One model family: its capabilities, which models are its own, how to load one and build its
    engine (`kv_pages`: a pool its sessions share; `driver`: rank 0 of a worker pod), its golden kind."""

    capabilities: Capabilities
    claims: Callable[[str | Path | None], bool]
    load: Callable[[str | Path | None, LoadOptions], Any]
    loaded_type: type
    engine: Callable[[Any, int | None, str, PodDriver | None], Engine]
    golden: GoldenKind


def magi_folder(model: str | Path | None) -> Path | None:
    """The MAGI-1 model folder `model` names, or None (a built-in model or another family)."""
    if model is None or builtin_model_name(model) is not None:
        return None
    path = Path(model).expanduser()
    return path if path.is_dir() and is_magi_folder(path) else None


def _load_magi(model: str | Path | None, options: LoadOptions) -> MagiModel:
    folder = magi_folder(model)
    assert folder is not None  # claimed by MAGI-1
    return load_magi_model(folder, parse_dtype(options.dtype), options.device)


def _wan_engine(model: LoadedModel, kv_pages: int | None, kv_dtype: str, driver: PodDriver | None) -> Engine:
    if driver is not None:  # the pod's pool was built on every rank with the pod (rank 0's shard here)
        return WanEngine(model, driver=driver)
    pool: KVPool | None = None if kv_pages is None else shared_pool(model, kv_pages, kv_dtype)
    return WanEngine(model, pool, kv_dtype=None if pool is not None else kv_dtype)


def _wan_case(case: GoldenCase, tolerance: float) -> list[Comparison]:
    return verify_case(WanCase.of(case), tolerance)


MAGI_FAMILY = Family(
    capabilities=MAGI,
    claims=lambda model: magi_folder(model) is not None,
    load=_load_magi,
    loaded_type=MagiModel,
    engine=lambda model, kv_pages, _kv_dtype, _driver: MagiEngine(model, kv_pages=kv_pages),
    golden=GoldenKind("MAGI-1", is_magi_case, lambda case, _tol: verify_magi_case(case.folder), True),
)
MATRIXGAME_FAMILY = Family(
    capabilities=MATRIXGAME,
    claims=lambda model: model is not None and is_matrixgame_model(model),
    load=lambda model, o: load_matrixgame_model(
        str(model), dtype=o.dtype, device=o.device, attention_backend=o.attention_backend, decoder=o.decoder
    ),
    loaded_type=MatrixGameModel,
    engine=lambda model, kv_pages, _kv_dtype, _driver: MatrixGameEngine(model, kv_pages=kv_pages),
    golden=GoldenKind(
        "Matrix-Game 2.0",
        is_matrixgame_case,
        lambda case, tol: verify_matrixgame_case(case.folder, tol),
        True,
    ),
)
WAN_FAMILY = Family(
    capabilities=WAN,
    claims=lambda _model: True,
    load=lambda model, o: load_wan_model(
        model, dtype=o.dtype, device=o.device, attention_backend=o.attention_backend, quant=o.quant, decoder=o.decoder
    ),
    loaded_type=LoadedModel,
    engine=_wan_engine,
    golden=GoldenKind("Wan (Self Forcing, CausVid, LongLive)", lambda _case: True, _wan_case, False),
)
FAMILIES = (MATRIXGAME_FAMILY, MAGI_FAMILY, WAN_FAMILY)

TAEHV = GoldenKind(
    "TAEHV",
    lambda case: is_taehv_case(case.config),
    lambda case, tol: verify_taehv_case(case.folder, tol, case.device, case.dtype),
    reference_only=False,
)
# A decoder's layout first, then the families' (Wan's last: it reads every other folder).
GOLDEN_KINDS = (TAEHV, *(family.golden for family in FAMILIES))


def family_of(model: str | Path | None) -> Family:
    """The family of a model folder or built-in name (None: the default model), known before
    anything loads, so that an option it refuses costs no load time."""
    return next(family for family in FAMILIES if family.claims(model))


def family_capabilities(model: str | Path | None) -> Capabilities:
    return family_of(model).capabilities


def load_model(model: str | Path | None, options: LoadOptions, *, served: bool = False) -> Model:
    """The weights of any family's model, refusing first what its family cannot do. `served`: the
    mesh knows models by preset name, so a MAGI-1 folder with a bare run config is refused."""
    family = family_of(model)
    check(family.capabilities, EngineRequest(quant=options.quant, decoder=options.decoder))
    folder = magi_folder(model) if served else None
    if folder is not None and not is_magi_preset(magi_preset_of(folder).name):
        raise UserError(
            f"{folder}: the mesh knows models by preset name; write model.yaml with 'preset: <name>' "
            f"(one of {', '.join(magi_presets())}) instead of a bare run config to serve it"
        )
    loaded: Model = family.load(model, options)
    return loaded


def decoder_of(model: Model) -> str:
    """What the model's sessions are decoded with, as a session records it (`decoder_identity`):
    MAGI-1 always decodes with its own VAE."""
    choice = model.decoder_choice if isinstance(model, (LoadedModel, MatrixGameModel)) else DecoderChoice()
    return decoder_identity(choice)


def engine_for(
    model: Model, kv_pages: int | None = None, kv_dtype: str = "auto", driver: PodDriver | None = None
) -> Engine:
    """The engine over loaded weights: its family's, with a pool of `kv_pages` pages its sessions
    share (None: each sizes its own), K/V stored as `kv_dtype`, or a pod's `driver`."""
    family = next(family for family in FAMILIES if isinstance(model, family.loaded_type))
    check(family.capabilities, EngineRequest(kv_dtype=kv_dtype, pod=driver is not None))
    return family.engine(model, kv_pages, kv_dtype, driver)


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
) -> Engine:
    """The engine of a model folder or built-in model, whatever its family."""
    check(family_capabilities(model), EngineRequest(quant=quant, kv_dtype=kv_dtype, decoder=decoder))
    options = LoadOptions(dtype, device, attention_backend, quant, decoder)
    return engine_for(load_model(model, options), kv_pages, kv_dtype)


def kind_of(case: GoldenCase) -> GoldenKind:
    """The first golden kind that recognises the case (Wan's takes the rest)."""
    return next(kind for kind in GOLDEN_KINDS if kind.recognises(case))


def is_wan_case(case: GoldenCase) -> bool:
    """A Wan text-to-video case (Self Forcing, CausVid, LongLive): the layout `WanCase` reads."""
    return kind_of(case) is WAN_FAMILY.golden


def wan_cases(root: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[WanCase]:
    """The Wan text-to-video cases among the golden folders at `root` (see `find_cases`)."""
    return [WanCase.of(case) for case in find_cases(root, device, dtype) if is_wan_case(case)]
