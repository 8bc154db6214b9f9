"""Validation of client requests: every field checked, every error names the field and the range.

Pure functions over protobuf messages, so they are fuzzed directly (tests/scheduler).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferix.api.v1 import common_pb2, scheduler_pb2
from inferix.errors import UserError
from inferix.spec import schedule
from inferix.spec.actions import parse_held_action
from inferix.spec.families.matrixgame import ActionSchema, MatrixGamePreset
from inferix.spec.latency import LatencyMode
from inferix.spec.presets import ModelPreset
from inferix.spec.served import ServedPreset, any_session_shape
from inferix.spec.sizing import SessionShape

MAX_BLOCKS = 100_000
MAX_LOOKAHEAD = 64
ALL_OUTPUTS = frozenset({"mp4", "rtmp", "webrtc"})
# How a session records its decoder (`inferix.spec.decoders.decoder_identity`).
DECODER_ID = re.compile(r"vae|taehv:sha256:[0-9a-f]{16}")
# Start images: PNG or JPEG, told apart by their signature (the worker decodes them).
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")


# What an operator does to enable an output that a session asked for.
_OUTPUT_HINTS = {
    "rtmp": "start the scheduler with --rtmp-play-url (`inferix serve` does when nginx with the RTMP module "
    "is installed: apt-get install nginx libnginx-mod-rtmp)",
    "webrtc": "start the scheduler with --viewer-page-url and a viewer secret (`inferix serve` does)",
}


class InvalidRequest(UserError):
    """A request field is invalid (INVALID_ARGUMENT)."""


def check_prompt_text(text: str, field: str) -> str:
    """`text` if it can be a prompt (`InvalidRequest` naming `field` otherwise)."""
    try:
        return schedule.check_prompt_text(text, field)
    except UserError as exc:
        raise InvalidRequest(str(exc)) from exc


@dataclass(frozen=True)
class ValidSpec:
    spec: common_pb2.SessionSpec
    shape: SessionShape
    num_blocks: int | None
    lookahead: int
    # What the model's actions are (None: it takes none, a text model).
    actions: ActionSchema | None = None
    latency: LatencyMode = LatencyMode.SMOOTH


def schema_proto(schema: ActionSchema) -> common_pb2.ActionSchema:
    """The compact form of an action schema that clients get with the session."""
    return common_pb2.ActionSchema(
        keys=[common_pb2.ActionKey(name=k.name, key=k.key or "") for k in schema.keys],
        mouse=[common_pb2.MouseAxis(name=a.name, minimum=a.minimum, maximum=a.maximum) for a in schema.mouse],
        one_hot=schema.one_hot,
    )


def validate_action(valid: ValidSpec, action: scheduler_pb2.Action) -> common_pb2.HeldAction:
    """An Interact action checked against the session's model; its canonical form (keys by the
    schema's names, one mouse value per axis)."""
    if action.payload:
        raise InvalidRequest("action.payload: opaque actions are not supported; send action.keys and action.mouse")
    if valid.actions is None:
        raise InvalidRequest(
            f"action: model {valid.spec.model!r} takes no actions (a text model: steer it with set_prompt)"
        )
    try:
        held = parse_held_action(valid.actions, list(action.keys), list(action.mouse), "action")
    except UserError as exc:
        raise InvalidRequest(str(exc)) from exc
    return common_pb2.HeldAction(keys=held.key_names(valid.actions), mouse=list(held.mouse))


def _check_image(spec: common_pb2.SessionSpec, preset: ServedPreset) -> None:
    """Image-to-world models need a start image; text models take none."""
    if not isinstance(preset, MatrixGamePreset):
        if spec.image:
            raise InvalidRequest(f"spec.image: model {spec.model!r} takes no start image (it starts from spec.prompts)")
        return
    if not spec.image:
        raise InvalidRequest(
            f"spec.image: model {spec.model!r} is image-to-world: it needs a start image (PNG or JPEG bytes)"
        )
    if not spec.image.startswith(IMAGE_SIGNATURES):
        raise InvalidRequest(f"spec.image: not a PNG or JPEG image ({len(spec.image)} bytes)")
    if spec.prompts:
        raise InvalidRequest(
            f"spec.prompts: model {spec.model!r} has no text conditioning: leave it empty, steer it with actions"
        )


def validate_spec(
    spec: common_pb2.SessionSpec,
    presets: dict[str, ServedPreset],
    default_lookahead: int,
    outputs: frozenset[str] = frozenset({"mp4"}),
) -> ValidSpec:
    """Check a CreateSession spec against the models served and the `outputs` this server has enabled;
    fill defaults (resolution, lookahead)."""
    if not spec.model:
        raise InvalidRequest(f"spec.model: required; served models: {sorted(presets) or 'none yet'}")
    preset = presets.get(spec.model)
    if preset is None:
        raise InvalidRequest(f"spec.model: unknown model {spec.model[:64]!r}; served models: {sorted(presets)}")
    filled = common_pb2.SessionSpec()
    filled.CopyFrom(spec)
    if not spec.HasField("resolution") or (spec.resolution.width == 0 and spec.resolution.height == 0):
        filled.resolution.width, filled.resolution.height = preset.video.width, preset.video.height
    if spec.num_blocks > MAX_BLOCKS:
        raise InvalidRequest(f"spec.num_blocks: {spec.num_blocks} is above the limit {MAX_BLOCKS} (0 = unbounded)")
    num_blocks = spec.num_blocks or None
    try:
        shape = any_session_shape(preset, filled.resolution.width, filled.resolution.height, num_blocks)
    except UserError as exc:
        field = "spec.num_blocks" if "blocks" in str(exc) and "resolution" not in str(exc) else "spec.resolution"
        raise InvalidRequest(f"{field}: {exc}") from exc
    _check_image(spec, preset)
    if not isinstance(preset, MatrixGamePreset):
        changes = [schedule.PromptChange(c.at_block, c.text, c.recache) for c in spec.prompts]
        try:
            schedule.validate_schedule(changes, num_blocks, field="spec.prompts")
        except UserError as exc:
            raise InvalidRequest(str(exc)) from exc
    if spec.lookahead > MAX_LOOKAHEAD:
        raise InvalidRequest(f"spec.lookahead: {spec.lookahead} is above the limit {MAX_LOOKAHEAD} (0 = default)")
    if spec.latency not in common_pb2.LatencyMode.values():
        raise InvalidRequest(
            f"spec.latency: unknown latency mode {spec.latency}; use LATENCY_MODE_SMOOTH or LATENCY_MODE_INTERACTIVE"
        )
    if spec.decoder and not DECODER_ID.fullmatch(spec.decoder):
        raise InvalidRequest(
            f"spec.decoder: {spec.decoder[:64]!r} is not 'vae' or 'taehv:sha256:<16 hex digits>' "
            "(leave it empty: the session keeps the decoder of the worker that first hosts it)"
        )
    latency = LatencyMode.from_proto(spec.latency)
    if latency is LatencyMode.INTERACTIVE and spec.lookahead:
        raise InvalidRequest(
            f"spec.lookahead: {spec.lookahead} with an interactive session; leave it 0: an interactive session is "
            "made one generation time ahead of playback, the smallest lookahead that stays on time"
        )
    for name, hint in _OUTPUT_HINTS.items():
        if getattr(spec.outputs, name) and name not in outputs:
            raise InvalidRequest(
                f"spec.outputs.{name}: not enabled on this server (enabled: {', '.join(sorted(outputs))}); {hint}"
            )
    actions = preset.actions if isinstance(preset, MatrixGamePreset | ModelPreset) else None
    lookahead = 0 if latency is LatencyMode.INTERACTIVE else spec.lookahead or default_lookahead
    return ValidSpec(filled, shape, num_blocks, lookahead, actions, latency)
