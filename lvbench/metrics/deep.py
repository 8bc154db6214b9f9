"""Deep backends: the published VBench / LV-Bench scorers on weights the user keeps locally.

The architectures come from `transformers` (CLIP vision tower with projection, ViT for DINO), the
maintained library here that runs without torchvision (timm, open_clip and pyiqa all import
torchvision, which does not load with this project's torch). Preprocessing and formulas follow
VBench (`vbench/utils.py`, `background_consistency.py`, `subject_consistency.py`,
`aesthetic_quality.py`) and are done in torch:

* CLIP (background, aesthetic): Resize(224, bicubic) of the shorter side, CenterCrop(224), /255,
  Normalize(CLIP mean, std); features = image embeddings (after the visual projection).
* DINO (subject): Resize(224, bilinear) of the shorter side, no crop, Normalize(ImageNet mean,
  std) applied to 0..255 pixel values *without* dividing by 255 — VBench's `dino_transform`
  does exactly that, and published subject-consistency numbers depend on it; features = the
  final-norm CLS token, position embeddings interpolated to the frame's aspect ratio.
* LAION aesthetic: mean over frames of head(normalize(CLIP-L/14 embedding)) / 10.

Weights (the files `inferix lvbench eval` flags point at):

* `--clip-b32 DIR`: a local copy of the Hugging Face repo `openai/clip-vit-base-patch32`
  (config.json and model.safetensors or pytorch_model.bin);
* `--clip-l14 DIR`: likewise `openai/clip-vit-large-patch14`;
* `--aesthetic-head FILE`: `sa_0_4_vit_l_14_linear.pth` of LAION-AI/aesthetic-predictor, a state
  dict {weight [1, 768], bias [1]};
* `--dino DIR`: likewise `facebook/dino-vitb16`;
* `--musiq FILE`: `musiq_spaq_ckpt-358bb6af.pth` of IQA-PyTorch (pyiqa), run by pyiqa's MUSIQ.

These are the transformers conversions of the reference checkpoints (OpenAI `ViT-B-32.pt` /
`ViT-L-14.pt`, `dino_vitbase16_pretrain.pth`); they compute the same functions up to float
rounding (VBench runs OpenAI CLIP in fp16 on CUDA, here it runs in the weights' dtype), and DINO's
position-embedding interpolation may differ slightly for non-square frames.

MUSIQ comes from pyiqa, imported only when `--musiq` is given. AMT-S, VBench's frame interpolator
for motion smoothness, ships in no maintained package (VBench vendors it), so motion always uses
the weight-free linear-blend backend.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from inferix.errors import UserError
from lvbench.metrics.base import (
    MetricName,
    center_crop,
    check_frames,
    resize_shorter,
    to_tensor,
    vbench_consistency,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise UserError(
            "the deep LV-Bench backends need the `transformers` package: pip install -e '.[lvbench]'"
        ) from exc
    return transformers


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """Loading a vision tower from a full CLIP checkpoint lists every unused text weight; hide that."""
    logging = _transformers().utils.logging
    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _model_folder(folder: str | Path, flag: str, example: str) -> Path:
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise UserError(
            f"{flag} {path}: expected a transformers model folder (config.json + model.safetensors), "
            f"e.g. a local copy of {example}"
        )
    return path


def _normalize(images: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=images.dtype).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=images.dtype).view(1, 3, 1, 1)
    return (images - m) / s


class _Encoder(ABC):
    """Per-frame features in batches; the model may live on any device and in any float dtype."""

    def __init__(self, model: nn.Module, batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.batch_size = batch_size
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype

    @abstractmethod
    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """float [B, 3, H, W] in 0..255 -> the model's pixel input."""

    @abstractmethod
    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixel input -> features [B, D]."""

    @torch.no_grad()
    def encode(self, frames: np.ndarray) -> torch.Tensor:
        """uint8 [T, H, W, 3] -> float32 features [T, D] on the CPU."""
        out = []
        for start in range(0, len(frames), self.batch_size):
            pixels = self.preprocess(to_tensor(frames[start : start + self.batch_size]))
            out.append(self.forward(pixels.to(self.device, self.dtype)).float().cpu())
        return torch.cat(out)


class ClipImageEncoder(_Encoder):
    """CLIP image embeddings (vision tower + visual projection) with VBench's `clip_transform`."""

    def __init__(self, model: PreTrainedModel, batch_size: int = 16) -> None:
        super().__init__(model, batch_size)
        self.size = int(model.config.image_size)
        self.dim = int(model.config.projection_dim)

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, flag: str, example: str, device: str = "cpu", batch_size: int = 16
    ) -> ClipImageEncoder:
        path = _model_folder(folder, flag, example)
        transformers = _transformers()
        config = transformers.CLIPVisionConfig.from_pretrained(path)
        # A full CLIP checkpoint keeps the projection width at its top level.
        top = json.loads((path / "config.json").read_text())
        config.projection_dim = int(top.get("projection_dim", config.projection_dim))
        with _quiet_loading():
            model = transformers.CLIPVisionModelWithProjection.from_pretrained(
                path, config=config, local_files_only=True
            )
        return cls(model.to(device), batch_size)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        images = center_crop(resize_shorter(images, self.size, "bicubic"), self.size)
        return _normalize(images / 255.0, CLIP_MEAN, CLIP_STD)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels).image_embeds


class DinoEncoder(_Encoder):
    """DINO ViT CLS features with VBench's `dino_transform` (0..255 pixels, see the module notes)."""

    def __init__(self, model: PreTrainedModel, batch_size: int = 16) -> None:
        super().__init__(model, batch_size)
        self.size = int(model.config.image_size)

    @classmethod
    def from_pretrained(cls, folder: str | Path, device: str = "cpu", batch_size: int = 16) -> DinoEncoder:
        path = _model_folder(folder, "--dino", "facebook/dino-vitb16")
        with _quiet_loading():
            model = _transformers().ViTModel.from_pretrained(path, add_pooling_layer=False, local_files_only=True)
        return cls(model.to(device), batch_size)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        return _normalize(resize_shorter(images, self.size, "bilinear"), IMAGENET_MEAN, IMAGENET_STD)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state[:, 0]


@dataclass(frozen=True)
class ClipBackground:
    """VBench background consistency: consistency of CLIP ViT-B/32 image embeddings."""

    encoder: ClipImageEncoder
    name: MetricName = "background"
    backend: str = "clip"
    weight_free: bool = False
    min_frames: int = 1

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        return vbench_consistency(self.encoder.encode(frames))


@dataclass(frozen=True)
class DinoSubject:
    """VBench subject consistency: consistency of DINO ViT-B/16 CLS features."""

    encoder: DinoEncoder
    name: MetricName = "subject"
    backend: str = "dino"
    weight_free: bool = False
    min_frames: int = 1

    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        return vbench_consistency(self.encoder.encode(frames))


def load_aesthetic_head(path: str | Path, dim: int) -> nn.Linear:
    """The LAION linear aesthetic predictor: a state dict {weight [1, dim], bias [1]}."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--aesthetic-head {path}: no such file (sa_0_4_vit_l_14_linear.pth from LAION-AI)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    weight = state.get("weight") if isinstance(state, dict) else None
    if weight is None or tuple(weight.shape) != (1, dim) or "bias" not in state:
        shape = None if weight is None else list(weight.shape)
        raise UserError(
            f"--aesthetic-head {path}: expected a linear head with weight [1, {dim}] and bias [1] matching the "
            f"CLIP embedding width, got weight {shape}"
        )
    head = nn.Linear(dim, 1)
    head.load_state_dict(state)
    return head.eval()


@dataclass(frozen=True)
class LaionAesthetic:
    """VBench aesthetic quality: mean over frames of LAION head(normalize(CLIP ViT-L/14 embedding)) / 10."""

    encoder: ClipImageEncoder
    head: nn.Linear
    name: MetricName = "aesthetic"
    backend: str = "laion-aesthetic"
    weight_free: bool = False
    min_frames: int = 1

    @torch.no_grad()
    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        features = F.normalize(self.encoder.encode(frames), dim=-1, p=2)
        return float((self.head(features).squeeze(-1) / 10).mean())


@dataclass(frozen=True)
class MusiqClarity:
    """VBench imaging quality (LV-Bench clarity): mean MUSIQ-SPAQ score over frames, 0..100.

    Each frame is scaled by 1/255 after VBench's "longer" preprocessing: when its longer side is
    above 512 pixels it is resized (bilinear, no antialias) so that side is 512.
    """

    model: nn.Module
    name: MetricName = "clarity"
    backend: str = "musiq"
    weight_free: bool = False
    min_frames: int = 1
    max_side: int = 512

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu") -> MusiqClarity:
        """pyiqa's MUSIQ on `musiq_spaq_ckpt-358bb6af.pth`.

        pyiqa (and the torchvision it imports) is not an extra of this project: with a CPU-only
        torch build no published torchvision wheel loads. Install it where it does (a CUDA torch
        from PyPI and the matching torchvision): `pip install pyiqa`.
        """
        path = Path(path)
        if not path.is_file():
            raise UserError(f"--musiq {path}: no such file (musiq_spaq_ckpt-358bb6af.pth from IQA-PyTorch)")
        try:
            from pyiqa.archs.musiq_arch import MUSIQ
        except Exception as exc:  # ImportError, or torchvision failing to register its ops
            raise UserError(
                f"--musiq needs pyiqa and a torchvision that loads with this torch ({type(exc).__name__}: {exc}); "
                "pip install pyiqa where torchvision matches your torch, or use the weight-free clarity backend"
            ) from exc
        return cls(MUSIQ(pretrained_model_path=str(path)).to(device).eval())

    def preprocess(self, frame: torch.Tensor) -> torch.Tensor:
        h, w = frame.shape[-2:]
        if max(h, w) > self.max_side:
            scale = self.max_side / max(h, w)
            frame = F.interpolate(frame, size=(int(scale * h), int(scale * w)), mode="bilinear", align_corners=False)
        return frame / 255.0

    @torch.no_grad()
    def score(self, frames: np.ndarray) -> float:
        check_frames(frames, self.min_frames, self.name)
        param = next(self.model.parameters())
        total = 0.0
        for i in range(len(frames)):  # MUSIQ takes one image at a time, at its own size
            pixels = self.preprocess(to_tensor(frames[i : i + 1])).to(param.device, param.dtype)
            total += float(self.model(pixels))
        return total / len(frames)
