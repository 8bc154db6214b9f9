"""Actions of Matrix-Game sessions in the scheduler: each checked against the model's schema (errors
name the field), the latest before a boundary kept, and the held and pending actions stored with
the session record so that a restarted scheduler continues with them."""

from __future__ import annotations

import re

import pytest

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.spec.presets import load_preset
from inferix.spec.served import load_any_preset
from scheduler.sessions import PendingAction, SessionRecord
from scheduler.validation import InvalidRequest, ValidSpec, validate_action, validate_spec

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16  # the scheduler checks the signature; workers decode it
MODELS = ["matrixgame2-tiny", "matrixgame2-templerun", "toyworld"]
PRESETS = {name: load_any_preset(name) for name in MODELS} | {"tiny": load_preset("tiny")}


def valid(model: str) -> ValidSpec:
    if model == "toyworld":
        prompts = [common_pb2.PromptChange(at_block=0, text="a ball")]
        return validate_spec(common_pb2.SessionSpec(model=model, num_blocks=4, prompts=prompts), PRESETS, 2)
    return validate_spec(common_pb2.SessionSpec(model=model, num_blocks=4, image=PNG), PRESETS, 2)


def action(keys: list[str], mouse: list[float] | None = None, payload: bytes = b"") -> scheduler_pb2.Action:
    return scheduler_pb2.Action(keys=keys, mouse=mouse or [], payload=payload)


def test_actions_are_checked_against_the_schema_and_named_canonically() -> None:
    held = validate_action(valid("matrixgame2-tiny"), action(["forward", "a"], [0.1, -0.05]))
    assert list(held.keys) == ["W", "A"] and list(held.mouse) == [0.1, -0.05]
    assert list(validate_action(valid("matrixgame2-tiny"), action([])).mouse) == [0.0, 0.0]  # neutral
    assert list(validate_action(valid("matrixgame2-templerun"), action([])).keys) == ["no-op"]


@pytest.mark.parametrize(
    ("model", "request_", "message"),
    [
        ("matrixgame2-tiny", action(["Q"]), "action: keys: unknown key 'Q' (this model takes W, S, A, D)"),
        ("matrixgame2-tiny", action(["W"], [0.2, 0.0]), r"action: mouse pitch: 0.2 is outside [-0.1, 0.1]"),
        ("matrixgame2-tiny", action(["W"], [0.1]), r"action: mouse: expected 2 value(s) (pitch, yaw), got 1"),
        ("matrixgame2-templerun", action(["W", "S"]), "action: keys: this model takes one key at a time"),
        ("matrixgame2-templerun", action(["W"], [0.1]), "action: mouse: this model takes no mouse input"),
        ("matrixgame2-tiny", action([], payload=b"x"), "action.payload: opaque actions are not supported"),
        ("toyworld", action(["W"]), "action: model 'toyworld' takes no actions"),
    ],
)
def test_each_bad_action_names_its_field(model: str, request_: scheduler_pb2.Action, message: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        validate_action(valid(model), request_)


def test_the_schema_and_held_action_come_with_the_session_but_not_the_image() -> None:
    record = SessionRecord("s1", "alice", valid("matrixgame2-tiny"), common_pb2.PlaybackUrls())
    session = record.to_proto()
    assert [k.key for k in session.action_schema.keys] == ["W", "S", "A", "D"]
    assert [(a.name, a.minimum, a.maximum) for a in session.action_schema.mouse] == [
        ("pitch", -0.1, 0.1),
        ("yaw", -0.1, 0.1),
    ]
    assert not session.action_schema.one_hot and session.HasField("current_action")
    assert session.spec.image == b"" and record.spec.image == PNG
    text = SessionRecord("s2", "alice", valid("toyworld"), common_pb2.PlaybackUrls()).to_proto()
    assert not text.HasField("action_schema") and not text.HasField("current_action")


def test_held_and_pending_actions_survive_a_scheduler_restart() -> None:
    stored = SessionRecord("s1", "alice", valid("matrixgame2-tiny"), common_pb2.PlaybackUrls())
    stored.current_action = common_pb2.HeldAction(keys=["W"], mouse=[0.0, 0.05])
    stored.pending_action = PendingAction(3, common_pb2.HeldAction(keys=["S", "D"], mouse=[-0.1, 0.0]))
    record = SessionRecord.from_json(stored.to_json(), lambda spec: validate_spec(spec, PRESETS, 2))
    assert record.current_action == stored.current_action
    assert record.pending_action == stored.pending_action
    assert record.spec.image == PNG
