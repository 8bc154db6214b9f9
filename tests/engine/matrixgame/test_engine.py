"""`MatrixGameEngine` and action tracks on the built-in tiny model: the engine's frames are the
sampler's, a track's change shows only in the blocks after it, and bad tracks are one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.contract import VideoBlock, to_uint8_frames
from engine.families.matrixgame.action import ActionInputs
from engine.families.matrixgame.clip import CLIPVisionEncoder
from engine.families.matrixgame.conditioning import condition_on_image
from engine.families.matrixgame.engine import MatrixGameEngine, _pixels, fit_image
from engine.noise import SeededNoise
from inferix.errors import UserError
from inferix.spec.actions import ActionTrack, block_start_frame, parse_action_track, parse_held_action
from inferix.spec.blocks import CommittedBlock
from inferix.spec.families.matrixgame import TINY_MODEL, is_matrixgame_model, load_matrixgame_preset

BLOCKS = 3


@pytest.fixture(scope="module")
def engine() -> MatrixGameEngine:
    return MatrixGameEngine.load(TINY_MODEL)


def _image() -> np.ndarray:
    return (np.random.default_rng(4).random((40, 64, 3)) * 255).astype(np.uint8)


def _track(tmp_path: Path, entries: list[dict[str, object]], name: str = "track.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(entries))
    return path


def _frames(engine: MatrixGameEngine, track: ActionTrack | None, seed: int = 1) -> list[np.ndarray]:
    with engine.open(_image(), actions=track, num_blocks=BLOCKS, seed=seed) as session:
        return [block.frames for block in session]


def test_the_engine_exposes_the_schema_and_is_detected(engine: MatrixGameEngine) -> None:
    assert engine.action_schema == load_matrixgame_preset("universal").actions
    assert is_matrixgame_model(TINY_MODEL) and not is_matrixgame_model("tiny") and not is_matrixgame_model(None)


def test_engine_frames_equal_the_samplers(engine: MatrixGameEngine, tmp_path: Path) -> None:
    track = parse_action_track(_track(tmp_path, [{"frame": 0, "keys": ["W"]}, {"block": 1, "mouse": [0.1, 0]}]),
                               engine.action_schema)  # fmt: skip
    with engine.open(_image(), actions=track, num_blocks=BLOCKS, seed=5) as session:
        blocks = list(session)
    model, nf = engine.model, engine.pipeline.config.block.num_frame_per_block
    rows = track.rows(engine.action_schema, 1 + 4 * (BLOCKS * nf - 1), nf, 4)
    assert rows.mouse is not None
    inputs = ActionInputs(torch.tensor([rows.keyboard]), torch.tensor([rows.mouse]))
    pixels = _pixels(fit_image(_image(), model.width, model.height))
    conditioning = condition_on_image(model.vae, model.clip, pixels, BLOCKS * nf)
    world = engine.pipeline.open_session(conditioning, inputs, SeededNoise(5))
    for block in blocks:
        expected = world.generate_block()
        assert torch.equal(block.latents, expected.latents)
        assert np.array_equal(block.frames, to_uint8_frames(expected.video))
    world.close()
    assert [b.frames.shape[0] for b in blocks] == [9, 12, 12]
    assert blocks[0].frames.shape[1:] == (model.height, model.width, 3)


def test_a_track_change_shows_only_from_its_block_on(engine: MatrixGameEngine, tmp_path: Path) -> None:
    base = [{"frame": 0, "keys": ["W"]}]
    changed = base + [{"block": 2, "keys": ["A"], "mouse": [0, -0.1]}]
    before = _frames(engine, parse_action_track(_track(tmp_path, base, "a.json"), engine.action_schema))
    after = _frames(engine, parse_action_track(_track(tmp_path, changed, "b.json"), engine.action_schema))
    assert [np.array_equal(a, b) for a, b in zip(before, after, strict=True)] == [True, True, False]


def test_json_and_csv_give_the_same_rows(engine: MatrixGameEngine, tmp_path: Path) -> None:
    schema = engine.action_schema
    json_track = parse_action_track(
        _track(tmp_path, [{"frame": 0, "keys": ["w"]}, {"block": 1, "keys": ["forward", "D"], "mouse": {"yaw": 0.05}}]),
        schema,
    )
    csv_path = tmp_path / "track.csv"
    csv_path.write_text("frame,keys,pitch,yaw\n0,W,,\n9,W+D,0,0.05\n")
    csv_track = parse_action_track(csv_path, schema)
    assert json_track.rows(schema, 45, 3, 4) == csv_track.rows(schema, 45, 3, 4)
    rows = csv_track.rows(schema, 45, 3, 4)
    assert rows.mouse is not None
    assert rows.keyboard[8] == [1, 0, 0, 0] and rows.keyboard[9] == [1, 0, 0, 1] and rows.mouse[9] == [0, 0.05]


def test_block_starts_are_the_blocks_first_pixel_frames() -> None:
    assert [block_start_frame(b, 3, 4) for b in range(4)] == [0, 9, 21, 33]


def test_neutral_actions_and_one_hot_no_op(tmp_path: Path) -> None:
    universal = load_matrixgame_preset("universal").actions
    neutral = ActionTrack("none").rows(universal, 5, 3, 4)
    assert neutral.keyboard == [[0.0] * 4] * 5 and neutral.mouse == [[0.0, 0.0]] * 5
    templerun = load_matrixgame_preset("templerun").actions
    track = parse_action_track(_track(tmp_path, [{"frame": 2, "keys": ["jump"]}, {"frame": 3}]), templerun)
    rows = track.rows(templerun, 5, 3, 4)
    assert rows.mouse is None
    assert [row.index(1.0) for row in rows.keyboard] == [0, 0, 1, 0, 0]


@pytest.mark.parametrize(
    ("preset", "entries", "message"),
    [
        ("universal", [{"frame": 0, "keys": ["Q"]}], "entry 0: keys: unknown key 'Q'"),
        ("universal", [{"frame": 0, "mouse": [0, 0.5]}], "entry 0: mouse yaw: 0.5 is outside [-0.1, 0.1]"),
        ("universal", [{"frame": 0, "mouse": [0]}], "entry 0: mouse: expected 2 value(s) (pitch, yaw), got 1"),
        ("universal", [{"frame": 0}, {"frame": -1}], "entry 1: frame: expected a whole number >= 0"),
        ("universal", [{"keys": ["W"]}], "entry 0: frame: give exactly one of frame or block"),
        ("universal", [{"frame": 0, "speed": 2}], "entry 0: speed: unknown field"),
        ("templerun", [{"frame": 0, "keys": ["W", "S"]}], "entry 0: keys: this model takes one key at a time"),
        ("templerun", [{"frame": 0, "mouse": {"yaw": 0.1}}], "entry 0: mouse: this model takes no mouse input"),
    ],
)
def test_bad_json_entries_name_the_entry_and_field(
    preset: str, entries: list[dict[str, object]], message: str, tmp_path: Path
) -> None:
    with pytest.raises(UserError) as error:
        parse_action_track(_track(tmp_path, entries), load_matrixgame_preset(preset).actions)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_out_of_order_entries_name_the_later_one(tmp_path: Path) -> None:
    schema = load_matrixgame_preset("universal").actions
    track = parse_action_track(_track(tmp_path, [{"block": 1}, {"frame": 5}]), schema)
    with pytest.raises(UserError, match="entry 1: frame: starts at pixel frame 5, not after .*entry 0"):
        track.rows(schema, 45, 3, 4)


def test_bad_csv_lines_name_the_line(tmp_path: Path) -> None:
    schema = load_matrixgame_preset("universal").actions
    path = tmp_path / "t.csv"
    path.write_text("frame,keys,pitch,yaw\n0,W,0,0\n4,W,0.3,0\n")
    with pytest.raises(UserError, match=r"t.csv line 3: mouse pitch: 0.3 is outside"):
        parse_action_track(path, schema)
    path.write_text("frame,keys,roll\n0,W,0\n")
    with pytest.raises(UserError, match=r"t.csv line 1: roll: unknown column"):
        parse_action_track(path, schema)


def test_a_session_needs_an_image_and_a_length(engine: MatrixGameEngine, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs a start image"):
        engine.open(None, num_blocks=1)
    with pytest.raises(UserError, match="number of blocks up front"):
        engine.open(_image())
    with pytest.raises(UserError, match="cannot read the start image"):
        engine.open(tmp_path / "missing.png", num_blocks=1)


def test_a_model_folder_needs_its_files(tmp_path: Path) -> None:
    (tmp_path / "model.yaml").write_text("preset: matrixgame2-universal\n")
    assert is_matrixgame_model(tmp_path)
    with pytest.raises(UserError, match="missing the dit file .*base_distill.safetensors"):
        MatrixGameEngine.load(tmp_path)


def test_the_clip_tower_loads_from_a_whole_clip_checkpoint(engine: MatrixGameEngine, tmp_path: Path) -> None:
    """The released CLIP file holds both towers: the vision tower is read from its `visual.` names."""
    from safetensors.torch import save_file

    clip = engine.model.clip
    state = {f"visual.{k}": v.contiguous() for k, v in clip.state_dict().items()}
    state["textual.token_embedding.weight"] = torch.zeros(2, 2)
    save_file(state, str(tmp_path / "clip.safetensors"))
    loaded = CLIPVisionEncoder.from_checkpoint(tmp_path / "clip.safetensors", clip.config)
    pixels = torch.zeros(1, 3, 32, 48)
    assert torch.equal(loaded.encode(pixels), clip.encode(pixels))


def test_a_session_restored_from_committed_blocks_continues_bit_identically(engine: MatrixGameEngine) -> None:
    """What a worker does when a Matrix-Game session moves to it: each committed block replayed under
    its action, then the next blocks are the uninterrupted session's (and so is a re-decode)."""
    schema = engine.action_schema
    plan = [(["W"], [0.0, 0.05]), (["W"], [0.0, 0.05]), (["A", "S"], [0.1, -0.02])]
    held = [parse_held_action(schema, keys, mouse, "action") for keys, mouse in plan]

    def made(blocks: int) -> list[tuple[VideoBlock, CommittedBlock]]:
        with engine.open(_image(), num_blocks=BLOCKS, seed=3) as session:
            out = []
            for action in held[:blocks]:
                session.hold(action)
                block = session.next_block()
                keys, mouse = tuple(action.key_names(schema)), action.mouse
                out.append((block, dataclasses.replace(block.committed(), action_keys=keys, action_mouse=mouse)))
            return out

    whole = made(BLOCKS)
    with engine.open(_image(), num_blocks=BLOCKS, seed=3) as restored:
        assert restored.restore([c for _, c in whole[:1]]) == [9]
        assert restored.restore([c for _, c in whole[1:2]], from_start=False) == [12]
        restored.hold(held[2])
        block = restored.next_block()
        assert block.first_frame == whole[2][0].first_frame
        assert np.array_equal(block.frames, whole[2][0].frames)
        state = restored.new_redecode_state()
        assert all(np.array_equal(restored.redecode(c, state), b.frames) for b, c in whole)
