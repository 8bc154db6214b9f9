"""The DiT quantization modes (``--quant``) and what each stores and computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from inferix.errors import UserError

__all__ = ["QUANT_MODES", "QuantMode", "parse_quant"]

WeightScale = Literal["row", "tensor"]


@dataclass(frozen=True)
class QuantMode:
    """One ``--quant`` value.

    ``weight_dtype``: how the quantized linears store their weights (None: not quantized).
    ``weight_scale``: one symmetric scale per output row, or one for the whole matrix.
    ``activations``: whether activations are quantized too (dynamically, one scale per token), so
    that the matmul itself runs in 8 bits; otherwise the weights are dequantized for each call.
    """

    name: str
    weight_dtype: torch.dtype | None
    weight_scale: WeightScale
    activations: bool
    description: str

    @property
    def enabled(self) -> bool:
        return self.weight_dtype is not None

    @property
    def is_fp8(self) -> bool:
        return self.weight_dtype == torch.float8_e4m3fn

    def stores_like(self, other: QuantMode) -> bool:
        """Whether a checkpoint quantized for ``other`` holds exactly the tensors this mode needs."""
        return (self.weight_dtype, self.weight_scale) == (other.weight_dtype, other.weight_scale)


_MODES = (
    QuantMode("none", None, "row", False, "weights in the run's --dtype"),
    QuantMode("int8", torch.int8, "row", True, "W8A8: int8 weights per output channel, int8 activations per token"),
    QuantMode("int8-wo", torch.int8, "row", False, "int8 weights per output channel, dequantized per call"),
    QuantMode("fp8", torch.float8_e4m3fn, "row", True, "fp8 e4m3 weights per output row, fp8 activations per token"),
    QuantMode("fp8-tensor", torch.float8_e4m3fn, "tensor", True, "fp8 e4m3 weights with one scale per matrix"),
)
QUANT_MODES: dict[str, QuantMode] = {mode.name: mode for mode in _MODES}


def parse_quant(value: str | QuantMode | None) -> QuantMode:
    """The mode named by ``value`` (None: ``none``); an unknown name is a UserError listing the choices."""
    if isinstance(value, QuantMode):
        return value
    name = "none" if value is None else value.strip().lower()
    if name not in QUANT_MODES:
        raise UserError(f"--quant {value!r} is not a quantization mode; choose one of {', '.join(QUANT_MODES)}")
    return QUANT_MODES[name]
