"""`QuantLinear`: a linear layer whose weight is stored in 8 bits with symmetric scales."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.quant.kernels import (
    dequantize_weight,
    fp8_matmul,
    int8_linear,
    pack_int8_weight,
    quantize_weight,
    register_packed,
)
from engine.quant.modes import QuantMode

__all__ = ["QuantLinear"]


class QuantLinear(nn.Module):
    """``nn.Linear`` with an 8-bit ``weight`` [out, in] and an fp32 ``weight_scale`` ([out] or [1]).

    The bias stays in the compute dtype, and the output has the input's dtype. The state dict holds
    ``weight`` (int8 / float8_e4m3fn), ``weight_scale`` and ``bias``: what a quantized checkpoint stores.
    """

    weight: Tensor
    weight_scale: Tensor

    def __init__(
        self, in_features: int, out_features: int, bias: bool, mode: QuantMode, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        if mode.weight_dtype is None:
            raise ValueError("QuantLinear needs a quantizing mode, not 'none'")
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        rows = out_features if mode.weight_scale == "row" else 1
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=mode.weight_dtype, device=device))
        self.register_buffer("weight_scale", torch.empty(rows, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None
        self._packed_key = -1  # of the int8 weight in the CPU kernel's layout (`register_packed`; not saved)

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: QuantMode) -> QuantLinear:
        """Quantize ``linear``'s weight (from its values as fp32); the bias is kept as it is."""
        assert mode.weight_dtype is not None
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, mode, linear.weight.device)
        weight, scale = quantize_weight(linear.weight, mode.weight_dtype, mode.weight_scale == "row")
        layer.weight, layer.weight_scale = weight, scale
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
        layer.prepare()
        return layer

    def prepare(self) -> None:
        """Pack the weight for the int8 kernel (after loading or moving; a no-op elsewhere)."""
        packed = pack_int8_weight(self.weight) if self.mode.activations and not self.mode.is_fp8 else None
        self._packed_key = register_packed(packed, self)

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__(state)
        if not self.weight.is_meta:  # a copy (deepcopy, pickle) packs its own weight
            self.prepare()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> QuantLinear:
        # A dtype conversion of the model (.to(bf16)) changes the bias and the compute dtype only:
        # the 8-bit weight and its fp32 scales only follow a change of device.
        weight, scale = self.weight, self.weight_scale
        super()._apply(fn, recurse)
        device = self.weight.device
        self.weight, self.weight_scale = weight.to(device), scale.to(device)
        if not weight.is_meta:
            self.prepare()
        return self

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)
        if not self.mode.activations:
            y = F.linear(rows, dequantize_weight(self.weight, self.weight_scale, x.dtype), self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        if self.mode.is_fp8:
            out = fp8_matmul(rows, self.weight, self.weight_scale)
            if self.bias is not None:
                out = out.add_(self.bias)
        else:
            out = int8_linear(rows, self.weight, self.weight_scale, self.bias, self._packed_key)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, quant={self.mode.name}"
