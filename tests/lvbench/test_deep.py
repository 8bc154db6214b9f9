"""Deep backends on tiny randomly initialised networks: loading, shapes, dtypes, devices, formulas.

Real weights (CLIP ViT-B/32 and ViT-L/14, the LAION head, DINO ViT-B/16, MUSIQ-SPAQ) are hundreds
of megabytes and cannot be downloaded here, so these tests build the same architectures at a tiny
size, save them in the format of the real files and load them through the same code. MUSIQ runs
through pyiqa, which cannot be imported with this torch (its torchvision does not load), so its
scoring protocol is checked with a small stand-in network and its loader for the clear error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from inferix.errors import UserError
from lvbench.metrics import DeepWeights, build_suite
from lvbench.metrics.deep import (
    ClipBackground,
    ClipImageEncoder,
    DinoEncoder,
    DinoSubject,
    LaionAesthetic,
    MusiqClarity,
    load_aesthetic_head,
)
from tests.lvbench import synthetic

PROJECTION = 12


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny full CLIP checkpoint (text tower included), laid out like openai/clip-vit-base-patch32."""
    torch.manual_seed(0)
    vision = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 2}
    text = {"hidden_size": 16, "intermediate_size": 20, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = transformers.CLIPConfig(
        vision_config={**vision, "image_size": 224, "patch_size": 32},
        text_config={**text, "vocab_size": 64, "max_position_embeddings": 16},
        projection_dim=PROJECTION,
    )
    folder = tmp_path_factory.mktemp("clip")
    transformers.CLIPModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dino_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ViT laid out like facebook/dino-vitb16."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, image_size=224, patch_size=16
    )
    folder = tmp_path_factory.mktemp("dino")
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def head_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("aesthetic") / "sa_0_4_vit_l_14_linear.pth"
    torch.save(nn.Linear(PROJECTION, 1).state_dict(), path)
    return path


def frames(count: int = 5, height: int = 40, width: int = 72) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def test_clip_encoder_loads_a_full_clip_checkpoint_and_embeds_any_frame_size(clip_dir: Path) -> None:
    encoder = ClipImageEncoder.from_pretrained(clip_dir, "--clip-b32", "openai/clip-vit-base-patch32", batch_size=2)
    assert (encoder.size, encoder.dim) == (224, PROJECTION)
    features = encoder.encode(frames(5))  # 3 batches, the last one partial
    assert features.shape == (5, PROJECTION) and features.dtype == torch.float32 and features.device.type == "cpu"
    assert torch.allclose(features, encoder.encode(frames(5)[::-1].copy()).flip(0), atol=1e-5)  # per-frame, order-free


def test_clip_encoder_runs_in_bfloat16_and_returns_float32(clip_dir: Path) -> None:
    fp32 = ClipImageEncoder.from_pretrained(clip_dir, "--clip-b32", "x")
    bf16 = ClipImageEncoder(cast(transformers.PreTrainedModel, fp32.model.to(torch.bfloat16)))
    features = bf16.encode(frames(2))
    assert features.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    reference = ClipImageEncoder.from_pretrained(clip_dir, "--clip-b32", "x").encode(frames(2))
    assert torch.allclose(features, reference, atol=0.1)


def test_background_and_subject_consistency_on_static_video(clip_dir: Path, dino_dir: Path) -> None:
    static = synthetic.static(6)
    background = ClipBackground(ClipImageEncoder.from_pretrained(clip_dir, "--clip-b32", "x"))
    subject = DinoSubject(DinoEncoder.from_pretrained(dino_dir))
    assert background.score(static) == pytest.approx(1.0, abs=1e-6)
    assert subject.score(static) == pytest.approx(1.0, abs=1e-6)
    assert 0.0 <= background.score(synthetic.colour_drifting(6)) <= 1.0


def test_dino_encoder_keeps_the_aspect_ratio(dino_dir: Path) -> None:
    encoder = DinoEncoder.from_pretrained(dino_dir, batch_size=4)
    pixels = encoder.preprocess(torch.rand(1, 3, 480, 832) * 255)
    assert pixels.shape == (1, 3, 224, 388)  # no crop: the position embeddings are interpolated
    assert pixels.max() > 100  # VBench's dino_transform normalises 0..255 values without /255
    features = encoder.encode(frames(3, 48, 80))
    assert features.shape == (3, 32) and features.dtype == torch.float32


def test_laion_aesthetic_is_the_mean_of_the_head_over_normalised_embeddings(clip_dir: Path, head_file: Path) -> None:
    encoder = ClipImageEncoder.from_pretrained(clip_dir, "--clip-l14", "openai/clip-vit-large-patch14")
    head = load_aesthetic_head(head_file, encoder.dim)
    clip = frames(4)
    embeddings = torch.nn.functional.normalize(encoder.encode(clip), dim=-1)
    with torch.no_grad():
        expected = float((head(embeddings).squeeze(-1) / 10).mean())
    assert LaionAesthetic(encoder, head).score(clip) == pytest.approx(expected, rel=1e-6)


def test_aesthetic_head_must_match_the_clip_width(head_file: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"weight \[1, 768\].*got weight \[1, 12\]"):
        load_aesthetic_head(head_file, 768)
    with pytest.raises(UserError, match="no such file"):
        load_aesthetic_head(tmp_path / "missing.pth", 768)


def test_weights_select_the_deep_backends(clip_dir: Path, dino_dir: Path, head_file: Path, tmp_path: Path) -> None:
    suite = build_suite(DeepWeights(clip_b32=clip_dir, clip_l14=clip_dir, aesthetic_head=head_file, dino=dino_dir))
    assert {n: (m.backend, m.weight_free) for n, m in suite.items()} == {
        "clarity": ("laplacian-variance", True),
        "motion": ("linear-blend", True),
        "aesthetic": ("laion-aesthetic", False),
        "background": ("clip", False),
        "subject": ("dino", False),
    }
    with pytest.raises(UserError, match="needs both --clip-l14 and --aesthetic-head"):
        build_suite(DeepWeights(clip_l14=clip_dir))
    with pytest.raises(UserError, match="--dino .*expected a transformers model folder"):
        build_suite(DeepWeights(dino=tmp_path))


class StandIn(nn.Module):
    """Plays pyiqa's MUSIQ contract: one image in [0, 1] -> a score; records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(100.0))
        self.seen: list[tuple[tuple[int, ...], float, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((tuple(x.shape), float(x.min()), float(x.max())))
        return self.scale * x.mean().view(1, 1)


def test_musiq_protocol_longer_side_512_and_unit_range() -> None:
    model = StandIn()
    clarity = MusiqClarity(model)
    clip = frames(3, 600, 1000)
    score = clarity.score(clip)
    assert [shape for shape, _, _ in model.seen] == [(1, 3, 307, 512)] * 3  # one frame at a time, longer side 512
    assert all(lo >= 0.0 and hi <= 1.0 for _, lo, hi in model.seen)
    means = [float(clarity.preprocess(torch.from_numpy(f).permute(2, 0, 1)[None].float()).mean()) for f in clip]
    assert score == pytest.approx(100 * float(np.mean(means)), rel=1e-5)  # the mean of the per-frame scores
    MusiqClarity(StandIn()).score(frames(1, 40, 72))  # small frames are not resized


def test_musiq_loader_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="no such file"):
        MusiqClarity.from_pretrained(tmp_path / "musiq_spaq_ckpt-358bb6af.pth")
    checkpoint = tmp_path / "musiq.pth"
    checkpoint.write_bytes(b"\0")
    monkeypatch.setitem(sys.modules, "pyiqa", None)  # pyiqa unavailable, whatever this machine has
    with pytest.raises(UserError, match="--musiq needs pyiqa"):
        MusiqClarity.from_pretrained(checkpoint)
