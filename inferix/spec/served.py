"""What a worker may serve, torch-free: a preset of any family by name (or as a worker's model.yaml
changes it), and its session sizing.

The scheduler knows a served model by its preset name and the settings its workers register; this
module is the one place on the torch-free side that tells the families apart (the engine's is
`engine.registry`).
"""

from __future__ import annotations

import json
from pathlib import Path

from inferix.errors import UserError
from inferix.spec.families.magi import MagiPreset, is_magi_preset, load_magi_preset, magi_session_shape
from inferix.spec.families.matrixgame import (
    MatrixGamePreset,
    is_matrixgame_name,
    load_served_matrixgame_preset,
    matrixgame_session_shape,
)
from inferix.spec.presets import ModelPreset, load_preset, read_yaml
from inferix.spec.sizing import SessionShape, session_shape

__all__ = ["AnyPreset", "ServedPreset", "any_session_shape", "load_any_preset", "load_served_preset", "model_settings"]

AnyPreset = ModelPreset | MagiPreset
# What a worker may serve: a text model of either family, or an action-conditioned world model.
ServedPreset = ModelPreset | MagiPreset | MatrixGamePreset


def load_any_preset(name: str) -> ServedPreset:
    """A shipped preset of any family by name (what the scheduler knows a served model by)."""
    if is_matrixgame_name(name):
        return load_served_matrixgame_preset(name)
    return load_magi_preset(name) if is_magi_preset(name) else load_preset(name)


def model_settings(model: str | Path) -> str:
    """What a worker serving `model` (a name or a model folder) registers as its model settings: the
    model.yaml of a Wan or MAGI-1 folder (its preset and the sections it overrides) as canonical JSON,
    which `load_served_preset` turns back into the preset the worker runs. "" where the shipped preset
    of the model's name is what the control plane needs: a built-in model, a folder without model.yaml,
    and a Matrix-Game folder (its model.yaml picks files and a decoder, nothing a session is sized by)."""
    yaml_path = Path(model) / "model.yaml"
    if not yaml_path.is_file():
        return ""
    data = read_yaml(yaml_path, "model config")
    preset = data.get("preset")
    if not isinstance(preset, str) or is_matrixgame_name(preset):
        return ""
    try:
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{yaml_path}: settings must be plain data (numbers, text, lists, mappings): {exc}") from exc


def load_served_preset(model: str, settings: str = "") -> ServedPreset:
    """The preset workers serve `model` with: the shipped one when `settings` is empty, else the one
    their model.yaml makes (`model_settings`)."""
    if not settings:
        return load_any_preset(model)
    where = f"the model.yaml of the workers serving {model!r}"
    try:
        data = json.loads(settings)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not the JSON a worker registers: {exc}") from exc
    name = data.pop("preset", None) if isinstance(data, dict) else None
    if not isinstance(name, str):
        raise UserError(f"{where} names no preset")
    return load_magi_preset(name, data, where) if is_magi_preset(name) else load_preset(name, data, where)


def any_session_shape(preset: ServedPreset, width: int, height: int, num_blocks: int | None) -> SessionShape:
    """`session_shape` for a preset of any family."""
    if isinstance(preset, MatrixGamePreset):
        return matrixgame_session_shape(preset, width, height, num_blocks)
    if isinstance(preset, MagiPreset):
        return magi_session_shape(preset, width, height, num_blocks)
    return session_shape(preset, width, height, num_blocks)
