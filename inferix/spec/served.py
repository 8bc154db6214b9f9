"""What a worker may serve, torch-free: a preset of any family by name, and its session sizing.

The scheduler knows a served model by its preset name; this module is the one place on the torch-free
side that tells the families apart (the engine's is `engine.registry`).
"""

from __future__ import annotations

from inferix.spec.families.magi import MagiPreset, is_magi_preset, load_magi_preset, magi_session_shape
from inferix.spec.families.matrixgame import (
    MatrixGamePreset,
    is_matrixgame_name,
    load_served_matrixgame_preset,
    matrixgame_session_shape,
)
from inferix.spec.presets import ModelPreset, load_preset
from inferix.spec.sizing import SessionShape, session_shape

__all__ = ["AnyPreset", "ServedPreset", "any_session_shape", "load_any_preset"]

AnyPreset = ModelPreset | MagiPreset
# What a worker may serve: a text model of either family, or an action-conditioned world model.
ServedPreset = ModelPreset | MagiPreset | MatrixGamePreset


def load_any_preset(name: str) -> ServedPreset:
    """A shipped preset of any family by name (what the scheduler knows a served model by)."""
    if is_matrixgame_name(name):
        return load_served_matrixgame_preset(name)
    return load_magi_preset(name) if is_magi_preset(name) else load_preset(name)


def any_session_shape(preset: ServedPreset, width: int, height: int, num_blocks: int | None) -> SessionShape:
    """`session_shape` for a preset of any family."""
    if isinstance(preset, MatrixGamePreset):
        return matrixgame_session_shape(preset, width, height, num_blocks)
    if isinstance(preset, MagiPreset):
        return magi_session_shape(preset, width, height, num_blocks)
    return session_shape(preset, width, height, num_blocks)
