"""Request validation: pure-function checks and a fuzz of the validator."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferix.api.v1 import common_pb2
from inferix.spec import MAX_PROMPT_BYTES
from inferix.spec.latency import LatencyMode
from inferix.spec.presets import load_preset
from scheduler.sessions import SessionRecord
from scheduler.validation import InvalidRequest, validate_spec

PRESETS = {"tiny": load_preset("tiny"), "self-forcing-dmd": load_preset("self-forcing-dmd")}


def spec(**kwargs: object) -> common_pb2.SessionSpec:
    base: dict[str, object] = {"model": "tiny", "num_blocks": 3, "prompts": [{"at_block": 0, "text": "a red ball"}]}
    base.update(kwargs)
    return common_pb2.SessionSpec(**base)  # type: ignore[arg-type]


def test_defaults_are_filled() -> None:
    valid = validate_spec(spec(), PRESETS, default_lookahead=2)
    assert (valid.spec.resolution.width, valid.spec.resolution.height) == (128, 128)
    assert valid.lookahead == 2 and valid.num_blocks == 3
    assert valid.shape.pages == 9  # global attention: every frame of 3 blocks x 3 frames
    assert valid.shape.video_frames_per_block == 12  # the Wan VAE: 4 pixel frames per latent frame (pacing)


def test_the_latency_mode_defaults_to_smooth_and_interactive_sets_its_own_lookahead() -> None:
    assert validate_spec(spec(), PRESETS, 2).latency is LatencyMode.SMOOTH
    assert validate_spec(spec(latency=common_pb2.LATENCY_MODE_SMOOTH, lookahead=3), PRESETS, 2).lookahead == 3
    interactive = validate_spec(spec(latency=common_pb2.LATENCY_MODE_INTERACTIVE), PRESETS, 2)
    assert (interactive.latency, interactive.lookahead) == (LatencyMode.INTERACTIVE, 0)
    # kept in the spec, so a session restored from its record (revalidated) keeps its mode
    assert LatencyMode.from_proto(validate_spec(interactive.spec, PRESETS, 2).spec.latency) is LatencyMode.INTERACTIVE
    with pytest.raises(InvalidRequest, match="spec.lookahead: 1 with an interactive session; leave it 0"):
        validate_spec(spec(latency=common_pb2.LATENCY_MODE_INTERACTIVE, lookahead=1), PRESETS, 2)
    with pytest.raises(InvalidRequest, match="spec.latency: unknown latency mode 7"):
        validate_spec(spec(latency=7), PRESETS, 2)


def test_an_interactive_session_is_dispatched_one_median_generation_time_ahead() -> None:
    valid = validate_spec(spec(latency=common_pb2.LATENCY_MODE_INTERACTIVE), PRESETS, 2)
    record = SessionRecord("s", "owner", valid, common_pb2.PlaybackUrls())
    assert record.lead_frames(16.0, 3) == 3.0  # nothing measured: the next block goes out at once
    record.generation_s.extend([0.10, 0.14, 0.12])
    assert record.lead_frames(16.0, 3) == pytest.approx(0.12 * 16)
    record.generation_s.extend([0.5] * 8)  # slower than real time: at most a block ahead
    assert record.lead_frames(16.0, 3) == 3.0


def test_window_models_allow_unbounded_sessions_global_ones_do_not() -> None:
    with pytest.raises(InvalidRequest, match="spec.num_blocks: .*global attention"):
        validate_spec(spec(num_blocks=0), PRESETS, 2)
    toyworld = {"toyworld": load_preset("toyworld")}  # a 6-frame window, 3 frames per block
    unbounded = validate_spec(spec(model="toyworld", num_blocks=0), toyworld, 2)
    assert unbounded.num_blocks is None and unbounded.shape.pages == 6  # the window, not the length
    assert unbounded.shape.video_frames_per_block == 3  # no time compression
    # A window re-bases its RoPE positions at the table's end (16384 frames): any length is fine.
    assert validate_spec(spec(model="toyworld", num_blocks=5462), toyworld, 2).shape.pages == 6
    assert validate_spec(spec(model="toyworld", num_blocks=100_000), toyworld, 2).shape.pages == 6
    # Global attention caches every frame and keeps the table's bound.
    with pytest.raises(InvalidRequest, match="spec.num_blocks: 342 blocks need 1026 latent frames.*global attention"):
        validate_spec(spec(num_blocks=342), PRESETS, 2)


def test_a_recorded_decoder_is_kept() -> None:
    recorded = "taehv:sha256:0123456789abcdef"
    assert validate_spec(spec(decoder=recorded), PRESETS, 2).spec.decoder == recorded
    assert validate_spec(spec(decoder="vae"), PRESETS, 2).spec.decoder == "vae"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "spec.model: required"),
        ({"model": "nope"}, "served models: \\['self-forcing-dmd', 'tiny'\\]"),
        ({"resolution": {"width": 832, "height": 470}}, "spec.resolution: .*multiples of 16"),
        ({"resolution": {"width": 8192, "height": 480}}, "spec.resolution"),
        ({"prompts": []}, "spec.prompts: at least one"),
        ({"prompts": [{"at_block": 0, "text": "é" * MAX_PROMPT_BYTES}]}, "spec.prompts\\[0\\].text: .*limit is 2048"),
        ({"prompts": [{"at_block": 0, "text": "a"}, {"at_block": 5, "text": "b"}]}, "block 5 is past the last"),
        ({"prompts": [{"at_block": 0, "text": "a\x00b"}]}, "NUL"),
        ({"outputs": {"rtmp": True}}, "spec.outputs"),
        ({"decoder": "taehv:/w/taew2_1.pth"}, "spec.decoder: .*'taehv:sha256:<16 hex digits>'"),
    ],
)
def test_each_invalid_field_is_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        validate_spec(spec(**kwargs), PRESETS, 2)


prompt_changes = st.lists(
    st.fixed_dictionaries({"at_block": st.integers(0, 2**32 - 1), "text": st.text(max_size=300)}), max_size=8
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(["tiny", "self-forcing-dmd", "", "x" * 100]) | st.text(max_size=20),
    width=st.integers(0, 2**32 - 1),
    height=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(0, 2**32 - 1),
    lookahead=st.integers(0, 2**32 - 1),
    prompts=prompt_changes,
    seed=st.integers(0, 2**64 - 1),
)
def test_fuzzed_specs_are_accepted_or_rejected_with_invalid_request(
    model: str, width: int, height: int, num_blocks: int, lookahead: int, prompts: list[dict], seed: int
) -> None:
    request = spec(
        model=model,
        resolution={"width": width, "height": height},
        num_blocks=num_blocks,
        lookahead=lookahead,
        prompts=prompts,
        seed=seed,
    )
    try:
        valid = validate_spec(request, PRESETS, 2)
    except InvalidRequest as exc:
        assert str(exc).startswith("spec.")
        return
    assert valid.shape.pages >= 1 and valid.spec.prompts[0].at_block == 0
