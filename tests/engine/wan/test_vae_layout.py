"""Wan VAE decode layouts: the channels-last CPU path stays channels-last, and agrees with the fold path."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from engine.families.wan.autoencoders import load_vae
from engine.families.wan.vae import CausalConv3d, WanVAE, _is_channels_last, _time_taps
from inferix.spec.architectures import WanVAEConfig
from tests.conftest import GOLDEN_CASES, GOLDEN_DIR
from tests.engine.wan.test_vae import read_golden, tiny_model

ATTENTION = WanVAEConfig(dim=4, num_res_blocks=1, attn_scales=(1.0, 0.5))  # attention blocks in every stage


def attention_model(seed: int = 0) -> WanVAE:
    """Random VAE with attention in every decoder stage."""
    return tiny_model(seed, ATTENTION)


def stream(model: WanVAE, latents: Tensor, block: int) -> Tensor:
    state = model.new_decode_state()
    blocks = [model.decode_block(latents[:, i : i + block], state) for i in range(0, latents.shape[1], block)]
    return torch.cat(blocks, dim=1)


def layouts_seen(model: WanVAE, latents: Tensor) -> dict[bool, set[str]]:
    """Whether each decoder module's outputs were channels-last, over a streaming decode of two blocks."""
    seen: dict[bool, set[str]] = {}

    def record(module: nn.Module, _: object, out: Tensor) -> None:
        seen.setdefault(_is_channels_last(out), set()).add(type(module).__name__)

    hooks = [m.register_forward_hook(record) for m in model.decoder.modules() if not isinstance(m, nn.Sequential)]
    stream(model, latents, 3)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("channels_last", [True, False])
def test_every_decoder_layer_keeps_the_layout(channels_last: bool) -> None:
    # One layer that fell back to the other layout would make every later one convert (slow, not wrong).
    model = attention_model()
    model.channels_last = channels_last
    seen = layouts_seen(model, torch.randn(1, 6, 16, 4, 6))
    assert set(seen) == {channels_last}
    assert {"AttentionBlock", "CausalConv3d", "PointwiseConv3d", "Resample", "RMSNorm"} <= seen[channels_last]


def test_channels_last_is_the_cpu_default_and_converts_the_weights_once() -> None:
    model = tiny_model()
    assert model.channels_last
    stream(model, torch.randn(1, 3, 16, 4, 4), 3)
    convs = [m for m in model.decoder.modules() if isinstance(m, nn.Conv2d | nn.Conv3d)]
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}
    assert all(m.weight.is_contiguous(memory_format=fmt[m.weight.dim()]) for m in convs)


def test_layouts_agree_and_each_streams_exactly() -> None:
    model = attention_model(seed=3)
    latents = torch.randn(1, 9, 16, 4, 6)
    videos = {}
    for channels_last in (True, False):
        model.channels_last = channels_last
        videos[channels_last] = stream(model, latents, 3)
        assert torch.equal(videos[channels_last], model.decode(latents))
    assert (videos[True] - videos[False]).abs().max() < 1e-5


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_decode_in_both_layouts(case: str) -> None:
    config, outputs = read_golden(case)
    model = load_vae(GOLDEN_DIR / case / "vae.safetensors", WanVAEConfig.from_dict(config["vae"]))
    first = config["video"]["block_frame_ranges"][0][1]
    golden = outputs["video_first_block"]
    for channels_last in (True, False):
        model.channels_last = channels_last
        video = (model.decode(outputs["latents"]) * 0.5 + 0.5).clamp(0.0, 1.0)
        assert (video[:, :first] - golden).abs().max() <= 1e-5


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("split", [(3,), (2, 1), (2, 4)])  # alone, history + 1 frame, history + 4
def test_time_taps_equal_the_joined_sequence(channels_last: bool, split: tuple[int, ...]) -> None:
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    parts = [torch.randn(1, 5, t, 3, 4).contiguous(memory_format=fmt) for t in split]
    joined = torch.cat(parts, dim=2)
    t_out = joined.shape[2] - 2
    expected = torch.cat([joined[:, :, i : i + t_out] for i in range(3)], dim=1)
    taps = _time_taps(parts, 3)
    assert torch.equal(taps, expected)
    assert _is_channels_last(taps) == channels_last


def test_causal_conv_history_with_fewer_frames_than_the_kernel() -> None:
    # One frame per call (the decoder's first stage): the cache must roll through the old history.
    torch.manual_seed(0)
    conv = CausalConv3d(4, 4, 3)
    conv.slot = 0
    x = torch.randn(1, 4, 5, 3, 3).contiguous(memory_format=torch.channels_last_3d)
    cache: list[Tensor | None] = [None]
    frames = torch.cat([conv(x[:, :, i : i + 1], cache) for i in range(5)], dim=2)
    whole = conv(x, [None])
    assert (frames - whole).abs().max() < 1e-5
