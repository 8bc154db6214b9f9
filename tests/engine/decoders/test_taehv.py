"""TAEHV: the released layout loads from its tensor shapes, streams per block like the one-shot decode,
and matches the reference's golden vectors (tests/golden/taew2_1_tiny)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engine.contract import to_uint8_frames
from engine.decoders import taehv
from engine.decoders.taehv import TAEHVDecoder, TAEHVLayout, load_taehv, random_taehv_state
from engine.decoders.taehv_framewise import FramewiseDecoder
from engine.decoders.taehv_golden import verify_taehv_case
from inferix.errors import CheckpointError

CASE = Path(__file__).resolve().parents[2] / "golden" / "taew2_1_tiny"
TOL = 1e-5  # the golden case's tolerance (fp32, different convolution orders)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def test_the_golden_case_passes_one_shot_every_block_and_the_encoder() -> None:
    comparisons = verify_taehv_case(CASE, TOL)
    names = [c.name for c in comparisons]
    assert names == [
        "video_parallel",
        "stream_block0",
        "stream_block1",
        "stream_block2",
        "encoded_parallel",
        "encoded_sequential",
    ]
    assert all(c.passed for c in comparisons), comparisons


def test_the_layout_is_read_from_the_shapes_not_the_file_name(tmp_path: Path) -> None:
    # The golden weights under a misleading name still load as taew2_1 (16 channels, patch 1).
    misleading = tmp_path / "taew2_2_super.pth"
    misleading.write_bytes((CASE / "taew2_1.pth").read_bytes())
    model = load_taehv(misleading)
    assert model.layout == TAEHVLayout(16, 1, "base", (1, 2, 2), (2, 2, 1))
    assert sum(p.numel() for p in model.parameters()) == 11315539  # the released taew2_1 count


def test_blocks_of_any_size_equal_the_one_shot_and_the_frame_at_a_time_decode() -> None:
    model = load_taehv(CASE / "taew2_1.pth")
    framewise = FramewiseDecoder(load_taehv(CASE / "taew2_1.pth", channels_last=False))
    latents = torch.randn(1, 7, 16, 3, 5, generator=torch.Generator().manual_seed(2))
    one_shot = model.decode_video(latents)
    assert one_shot.shape == (1, 1 + 4 * 6, 3, 24, 40)
    state = model.new_decode_state()
    blocks = [model.decode_stream(latents[:, a:b], state) for a, b in [(0, 1), (1, 4), (4, 5), (5, 7)]]
    assert [b.shape[1] for b in blocks] == [1, 12, 4, 8]  # the first latent frame gives one frame
    assert _max_diff(torch.cat(blocks, 1), one_shot) <= TOL
    walked = torch.cat([framewise.decode_block(latents[:, :3]), framewise.decode_block(latents[:, 3:])], 1)
    assert _max_diff(walked, one_shot) <= TOL


@pytest.mark.parametrize(
    ("layout", "gain"),
    [
        (TAEHVLayout(48, 2, "base"), 1.0),  # taew2_2: Wan 2.2 5B latents, patch 2
        (TAEHVLayout(32, 2, "super"), 0.5),  # taehv1_5_super: the larger decoder
    ],
)
def test_other_layouts_round_trip_through_a_safetensors_file(tmp_path: Path, layout: TAEHVLayout, gain: float) -> None:
    path = tmp_path / "weights.safetensors"  # no layout in the name: it comes from the shapes
    save_file(random_taehv_state(layout, seed=3, gain=gain), str(path))
    model = load_taehv(path)
    assert model.layout == layout
    latents = torch.randn(1, 4, layout.latent_channels, 3, 4, generator=torch.Generator().manual_seed(1))
    one_shot = model.decode_video(latents)
    assert one_shot.shape == (1, 13, 3, 3 * 16, 4 * 16)  # 8x space, then the patch
    inside = ((one_shot > 0) & (one_shot < 1)).float().mean().item()
    assert inside > 0.3  # random weights that still exercise the network, not clamped constants
    state = model.new_decode_state()
    streamed = torch.cat([model.decode_stream(latents[:, :1], state), model.decode_stream(latents[:, 1:], state)], 1)
    assert _max_diff(streamed, one_shot) <= TOL
    walked = FramewiseDecoder(load_taehv(path, channels_last=False)).decode_block(latents)
    assert _max_diff(walked, one_shot) <= TOL
    frames = torch.rand(1, 6, 3, 48, 64, generator=torch.Generator().manual_seed(4))
    assert model.encode_video(frames).shape == (1, 2, layout.latent_channels, 3, 4)  # padded to 8 frames


def test_a_truncated_file_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    for name in ("taew2_1.pth", "taew2_1.safetensors"):
        source = tmp_path / f"full_{name}"
        if name.endswith(".pth"):
            source.write_bytes((CASE / "taew2_1.pth").read_bytes())
        else:
            save_file(random_taehv_state(TAEHVLayout()), str(source))
        truncated = tmp_path / name
        truncated.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
        with pytest.raises(CheckpointError) as error:
            load_taehv(truncated)
        message = str(error.value)
        assert str(truncated) in message and "truncated" in message and "\n" not in message


def test_a_file_that_is_not_taehv_says_what_was_expected(tmp_path: Path) -> None:
    path = tmp_path / "vae.safetensors"
    save_file({"decoder.conv1.weight": torch.zeros(384, 16, 3, 3, 3)}, str(path))
    with pytest.raises(CheckpointError, match=r"not TAEHV weights: expected decoder\.1\.weight \[256, latent_channels"):
        load_taehv(path)
    state = random_taehv_state(TAEHVLayout())
    state["decoder.22.weight"] = state["decoder.22.weight"][:, :32].contiguous()
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=r"decoder\.22\.weight is \(3, 32, 3, 3\), expected \[3 \* patch\^2, 64"):
        load_taehv(path)
    del state["decoder.22.weight"]
    state["decoder.22.weight"] = torch.zeros(3, 64, 3, 3, dtype=torch.float16)
    state["decoder.3.conv.0.weight"] = state["decoder.3.conv.0.weight"][:, :8].contiguous()
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=str(path)) as error:
        load_taehv(path)
    assert "decoder.3.conv.0.weight" in str(error.value) and "\n" not in str(error.value)


def test_the_block_decoder_frames_are_the_unit_range_mapped_like_the_wan_vae() -> None:
    model = load_taehv(CASE / "taew2_1.pth")
    decoder = TAEHVDecoder(model, CASE / "taew2_1.pth")
    latents = torch.randn(1, 4, 16, 2, 3, generator=torch.Generator().manual_seed(5))
    state = decoder.new_decode_state()
    signed = torch.cat([decoder.decode_block(latents[:, :1], state), decoder.decode_block(latents[:, 1:], state)], 1)
    assert signed.min() >= -1 and signed.max() <= 1
    unit = model.decode_video(latents)
    expected = (unit[0] * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    frames = to_uint8_frames(signed)
    assert frames.shape == (13, 16, 24, 3)
    # x*2-1 then *0.5+0.5 is the identity up to one rounding step: at most one level off, rarely.
    assert np.abs(frames.astype(int) - expected.astype(int)).max() <= 1


def test_bf16_decodes_close_to_fp32() -> None:
    fp32 = load_taehv(CASE / "taew2_1.pth")
    bf16 = load_taehv(CASE / "taew2_1.pth", dtype=torch.bfloat16)
    latents = torch.randn(1, 2, 16, 2, 3, generator=torch.Generator().manual_seed(6))
    out = bf16.decode_video(latents)
    assert out.dtype == torch.bfloat16
    assert _max_diff(out, fp32.decode_video(latents)) < 0.1


def test_a_batch_of_streams_decodes_as_each_stream_alone() -> None:
    model = load_taehv(CASE / "taew2_1.pth")
    latents = torch.randn(2, 3, 16, 2, 3, generator=torch.Generator().manual_seed(8))
    state = model.new_decode_state()
    batched = torch.cat([model.decode_stream(latents[:, :1], state), model.decode_stream(latents[:, 1:], state)], 1)
    for i in range(2):
        assert _max_diff(batched[i : i + 1], model.decode_video(latents[i : i + 1])) <= TOL
    frames = torch.rand(2, 5, 3, 16, 24, generator=torch.Generator().manual_seed(9))
    encoded = model.encode_video(frames)
    for i in range(2):
        assert _max_diff(encoded[i : i + 1], model.encode_video(frames[i : i + 1])) <= TOL


def test_the_encoder_streams_frames_in_any_grouping() -> None:
    model = load_taehv(CASE / "taew2_1.pth")
    frames = torch.rand(1, 7, 3, 16, 24, generator=torch.Generator().manual_seed(10))
    state = model.new_encode_state()
    parts = [model.encode_stream(frames[:, a:b], state) for a, b in [(0, 3), (3, 4), (4, 7)]]
    tail = model.flush_encoder(state)  # pads 7 frames to 8 with the last one
    got = torch.cat([p for p in [*parts, tail] if p is not None], 1)
    assert _max_diff(got, model.encode_video(frames)) <= TOL


def test_large_activations_run_in_chunks_of_time_steps_with_the_same_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_taehv(CASE / "taew2_1.pth")
    latents = torch.randn(1, 4, 16, 2, 3, generator=torch.Generator().manual_seed(11))
    frames = torch.rand(1, 8, 3, 16, 24, generator=torch.Generator().manual_seed(12))
    whole, encoded = model.decode_video(latents), model.encode_video(frames)
    monkeypatch.setattr(taehv, "CHUNK_BYTES", 4096)  # every layer past the first few runs a step or two at a time
    assert _max_diff(model.decode_video(latents), whole) <= TOL
    assert _max_diff(model.encode_video(frames), encoded) <= TOL


def test_one_step_chunks_stay_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # A chunk of one time step once made its TGrow output a strided view and its past a contiguous
    # (NCHW) tensor, so the layers after ran NCHW: 1.3x slower at 480x832 (bench/RESULTS.md).
    model = load_taehv(CASE / "taew2_1.pth")
    latents = torch.randn(1, 4, 16, 2, 3, generator=torch.Generator().manual_seed(13))
    whole = model.decode_video(latents)
    seen: list[tuple[str, bool]] = []

    def record(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0]
        seen.append((type(module).__name__, x.is_contiguous(memory_format=torch.channels_last)))

    for module in model.decoder.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_pre_hook(record)
    monkeypatch.setattr(taehv, "CHUNK_BYTES", 1)  # past the first layer, one time step at a time
    assert _max_diff(model.decode_video(latents), whole) <= TOL
    assert seen and all(channels_last for _, channels_last in seen), seen


@pytest.mark.parametrize("chunk_bytes", [taehv.CHUNK_BYTES, 1])
def test_a_streams_dropped_first_frames_are_never_made(monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    # The first t_upscale - 1 frames of a stream are dropped; the last layers (the upsampled conv and
    # the output conv, per frame) skip them instead of making and dropping them.
    model = load_taehv(CASE / "taew2_1.pth")
    latents = torch.randn(2, 3, 16, 2, 3, generator=torch.Generator().manual_seed(14))
    walked = FramewiseDecoder(load_taehv(CASE / "taew2_1.pth", channels_last=False))
    expected = [walked.decode_block(latents[:, :1]), walked.decode_block(latents[:, 1:])]
    monkeypatch.setattr(taehv, "CHUNK_BYTES", chunk_bytes)
    made: list[int] = []
    last_layers = taehv._upconv_out

    def counted(x: torch.Tensor, upconv: torch.nn.Conv2d, then: torch.nn.Conv2d) -> torch.Tensor:
        made.append(x.shape[0])
        return last_layers(x, upconv, then)

    monkeypatch.setattr(taehv, "_upconv_out", counted)
    state = model.new_decode_state()
    first = model.decode_stream(latents[:, :1], state)
    assert sum(made) == 2 * 1  # of 4 frames per sample, the 3 dropped ones never reach the last layers
    made.clear()
    second = model.decode_stream(latents[:, 1:], state)
    assert sum(made) == 2 * 8
    assert first.shape[1] == 1 and second.shape[1] == 8
    assert _max_diff(first, expected[0]) <= TOL and _max_diff(second, expected[1]) <= TOL
