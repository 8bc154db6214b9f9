"""Golden cases of the TAEHV decoder: one-shot decode, every streamed block and the encoder.

A case folder (e.g. tests/golden/taew2_1_tiny) holds ``config.json`` with a ``layout`` entry that
names the weight file (``layout.weights_file``, ``.pth`` or ``.safetensors``), ``inputs.safetensors``
(``latents`` NTCHW, optionally ``encoder_frames``) and ``outputs.safetensors`` (``video_parallel``,
``stream_block{b}`` for blocks of ``outputs.streaming.blocks_latent_frames`` latent frames,
``encoded_parallel`` / ``encoded_sequential``). Everything else -- latent channels, patch size,
decoder variant -- is read from the weights, so cases of other layouts (taew2_2, super) check the
same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from engine.decoders.taehv import TAEHV, load_taehv
from engine.golden import Comparison, max_abs_diff, run_checks
from inferix.errors import UserError

__all__ = ["is_taehv_case", "verify_taehv_case"]


def is_taehv_case(config: dict[str, Any]) -> bool:
    """A TAEHV case: its config's ``layout`` names a decoder and a weight file."""
    layout = config.get("layout")
    return isinstance(layout, dict) and "decoder" in layout and "weights_file" in layout


class _Case:
    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.folder = folder
        self.name = folder.name
        self.config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        self.device, self.dtype = device, dtype
        self._model: TAEHV | None = None
        self._files: dict[str, dict[str, Tensor]] = {}

    def tensors(self, stem: str) -> dict[str, Tensor]:
        if stem not in self._files:
            path = self.folder / f"{stem}.safetensors"
            if not path.is_file():
                raise UserError(f"{path}: missing golden file (expected next to config.json)")
            self._files[stem] = load_file(str(path))
        return self._files[stem]

    def model(self) -> TAEHV:
        if self._model is None:
            weights = self.folder / str(self.config["layout"]["weights_file"])
            self._model = load_taehv(weights, dtype=self.dtype, device=self.device)
        return self._model

    def compare(self, name: str, got: Tensor, tol: float) -> Comparison:
        want = self.tensors("outputs")[name]
        if tuple(got.shape) != tuple(want.shape):
            shapes = f"shape {tuple(got.shape)} != reference {tuple(want.shape)}"
            return Comparison(self.name, name, float("inf"), tol, error=shapes)
        return Comparison(self.name, name, max_abs_diff(got.float().cpu(), want.float()), tol)


def _check_one_shot(case: _Case, tol: float) -> Iterator[Comparison]:
    latents = case.tensors("inputs")["latents"]
    yield case.compare("video_parallel", case.model().decode_video(latents), tol)


def _check_stream(case: _Case, tol: float) -> Iterator[Comparison]:
    latents = case.tensors("inputs")["latents"]
    outputs = case.tensors("outputs")
    blocks = case.config.get("outputs", {}).get("streaming", {}).get("blocks_latent_frames")
    if blocks is None:  # without a recorded split: blocks of 3 latent frames, as Self Forcing's
        count = sum(1 for key in outputs if key.startswith("stream_block"))
        blocks = [3] * count
    model = case.model()
    state = model.new_decode_state()
    start = 0
    for index, size in enumerate(blocks):
        frames = model.decode_stream(latents[:, start : start + size], state)
        start += size
        yield case.compare(f"stream_block{index}", frames, tol)


def _check_encoder(case: _Case, tol: float) -> Iterator[Comparison]:
    inputs = case.tensors("inputs")
    if "encoder_frames" not in inputs:
        return
    encoded = case.model().encode_video(inputs["encoder_frames"])
    for name in ("encoded_parallel", "encoded_sequential"):
        if name in case.tensors("outputs"):
            yield case.compare(name, encoded, tol)


def verify_taehv_case(
    folder: Path, tolerance: float, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> list[Comparison]:
    """Every comparison of a TAEHV case folder (a check that cannot run is one failed comparison)."""
    case = _Case(folder, torch.device(device), dtype)
    with torch.no_grad():
        return run_checks(
            case.name,
            [
                ("decode one-shot", lambda: _check_one_shot(case, tolerance)),
                ("decode streamed", lambda: _check_stream(case, tolerance)),
                ("encode", lambda: _check_encoder(case, tolerance)),
            ],
        )
