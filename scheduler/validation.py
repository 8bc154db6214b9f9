"""Validation of client requests: every field checked, every error names the field and the range.

Pure functions over protobuf messages, so they are fuzzed directly (tests/scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferix.api.v1 import common_pb2
from inferix.errors import UserError
from inferix.spec import schedule
from inferix.spec.magi import AnyPreset, any_session_shape
from inferix.spec.sizing import SessionShape

MAX_BLOCKS = 100_000
MAX_LOOKAHEAD = 64
ALL_OUTPUTS = frozenset({"mp4", "rtmp", "webrtc"})


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


def validate_spec(
    spec: common_pb2.SessionSpec,
    presets: dict[str, AnyPreset],
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
    changes = [schedule.PromptChange(c.at_block, c.text, c.recache) for c in spec.prompts]
    try:
        schedule.validate_schedule(changes, num_blocks, field="spec.prompts")
    except UserError as exc:
        raise InvalidRequest(str(exc)) from exc
    if spec.lookahead > MAX_LOOKAHEAD:
        raise InvalidRequest(f"spec.lookahead: {spec.lookahead} is above the limit {MAX_LOOKAHEAD} (0 = default)")
    for name, hint in _OUTPUT_HINTS.items():
        if getattr(spec.outputs, name) and name not in outputs:
            raise InvalidRequest(
                f"spec.outputs.{name}: not enabled on this server (enabled: {', '.join(sorted(outputs))}); {hint}"
            )
    return ValidSpec(filled, shape, num_blocks, spec.lookahead or default_lookahead)
