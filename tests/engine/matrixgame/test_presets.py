"""The shipped Matrix-Game 2.0 presets: action schemas, windows, steps, and DiT configs that build."""

from __future__ import annotations

import pytest

from engine.families.matrixgame.config import MatrixGameConfig
from inferix.errors import UserError
from inferix.spec.families.matrixgame import load_matrixgame_preset, matrixgame_presets


def test_the_three_released_variants_ship() -> None:
    assert matrixgame_presets() == ["gta_drive", "templerun", "universal"]


def test_universal_schema() -> None:
    preset = load_matrixgame_preset("universal")
    assert [k.key for k in preset.actions.keys] == ["W", "S", "A", "D"]
    assert [(m.name, m.column, m.minimum, m.maximum) for m in preset.actions.mouse] == [
        ("pitch", 0, -0.1, 0.1),
        ("yaw", 1, -0.1, 0.1),
    ]
    assert not preset.actions.one_hot
    assert (preset.sampling.local_attn_size, preset.sampling.denoising_steps) == (6, (1000, 666, 333))


def test_gta_drive_schema() -> None:
    preset = load_matrixgame_preset("gta_drive")
    assert [k.key for k in preset.actions.keys] == ["W", "S"]
    assert [(m.name, m.column) for m in preset.actions.mouse] == [("steer", 1)]
    assert preset.actions.mouse_columns == 2
    assert preset.sampling.local_attn_size == 4 and len(preset.sampling.denoising_steps) == 3


def test_templerun_schema() -> None:
    preset = load_matrixgame_preset("templerun")
    assert [k.name for k in preset.actions.keys] == [
        "no-op", "jump", "slide", "turn left", "turn right", "left side", "right side"
    ]  # fmt: skip
    assert preset.actions.keys[0].key is None
    assert preset.actions.one_hot and preset.actions.mouse == () and preset.actions.mouse_columns == 0
    assert preset.sampling.denoising_steps == (1000, 750, 500, 250)


@pytest.mark.parametrize("name", ["universal", "gta_drive", "templerun"])
def test_model_config_matches_the_schema(name: str) -> None:
    preset = load_matrixgame_preset(name)
    config = MatrixGameConfig.from_reference(preset.model_config)
    assert config.action.keyboard_dim_in == preset.actions.keyboard_dim
    assert config.action.enable_mouse == bool(preset.actions.mouse)
    assert config.action.blocks == tuple(range(15)) and config.dit.num_layers == 30
    assert preset.model_config["local_attn_size"] == preset.sampling.local_attn_size
    assert (preset.height, preset.width) == (352, 640)


def test_unknown_preset_is_a_user_error() -> None:
    with pytest.raises(UserError, match="available: gta_drive"):
        load_matrixgame_preset("minecraft")
