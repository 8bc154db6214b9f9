"""Which DiT layers are quantized, and quantized DiT state dicts: ours and the public ``scaled_fp8`` one.

Quantized: every linear inside the transformer blocks (self- and cross-attention q, k, v, o and
the two FFN layers): over 97% of a Wan DiT's weights. Kept in the run's dtype, as the seed system
and LongLive do, because they are small and their error reaches every token: the patch embedding,
the text and time embedders, the time projection (the modulation of every block), the blocks'
modulation tables, the norms, and the head.

A quantized checkpoint stores, per quantized linear ``<name>``: ``<name>.weight`` (int8 or
float8_e4m3fn), ``<name>.weight_scale`` (fp32, [out] or [1]) and ``<name>.bias``; everything else
as in an unquantized one. The ``scaled_fp8`` layout of ComfyUI's fp8 Wan files (fp8 weights with a
scalar ``<name>.scale_weight`` each, and a ``scaled_fp8`` marker tensor) is read too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor, nn

from engine.quant.kernels import dequantize_weight
from engine.quant.linear import QuantLinear
from engine.quant.modes import QUANT_MODES, QuantMode
from inferix.errors import CheckpointError

__all__ = [
    "QUANTIZED_LINEAR",
    "is_quantized_linear",
    "quantize_linears",
    "quantized_skeleton",
    "run_mode",
    "stored_quant",
    "weight_bytes",
]

StateDict = dict[str, Tensor]
ModuleT = Callable[[], nn.Module]
ModuleV = TypeVar("ModuleV", bound=nn.Module)

# Module names of the linears that are quantized (see the module docstring).
QUANTIZED_LINEAR = re.compile(r"blocks\.\d+\.(self_attn\.[qkvo]|cross_attn\.[qkvo]|ffn\.[02])")
SCALE = "weight_scale"
PUBLIC_SCALE = "scale_weight"  # ComfyUI's scaled_fp8 layout
PUBLIC_MARKER = "scaled_fp8"
_EIGHT_BIT = (torch.int8, torch.float8_e4m3fn)


def is_quantized_linear(name: str) -> bool:
    return QUANTIZED_LINEAR.fullmatch(name) is not None


def _linears(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Linear) and is_quantized_linear(n)]


def _replace(root: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, layer)


def quantize_linears(module: ModuleV, mode: QuantMode) -> ModuleV:
    """Quantize ``module``'s quantizable linears in place (from their current values); returns it."""
    for name, linear in _linears(module):
        _replace(module, name, QuantLinear.from_linear(linear, mode))
    return module


def quantized_skeleton(factory: ModuleT, mode: QuantMode) -> ModuleT:
    """A factory of ``factory()``'s module with empty (meta) `QuantLinear`s in place of its quantizable
    linears: what a quantized state dict loads into."""

    def build() -> nn.Module:
        module = factory()
        for name, linear in _linears(module):
            bias = linear.bias is not None
            _replace(module, name, QuantLinear(linear.in_features, linear.out_features, bias, mode, "meta"))
        return module

    return build


def _from_public_layout(state: StateDict, source: str | Path) -> StateDict:
    """Our layout of a ``scaled_fp8`` state dict: scales renamed, layers we keep in high precision
    dequantized (to fp32), and linears stored unscaled quantized on load by the caller."""
    converted: StateDict = {}
    for name, tensor in state.items():
        if name == PUBLIC_MARKER or name.endswith("." + PUBLIC_SCALE):
            continue
        layer = name.removesuffix(".weight")
        scale = state.get(f"{layer}.{PUBLIC_SCALE}") if name.endswith(".weight") else None
        if tensor.dtype == torch.float8_e4m3fn and scale is None:
            raise CheckpointError(f"{source}: fp8 tensor {name!r} has no {layer}.{PUBLIC_SCALE} (scaled_fp8 layout)")
        if scale is None:
            converted[name] = tensor
        elif is_quantized_linear(layer):
            converted[name], converted[f"{layer}.{SCALE}"] = tensor, scale.float().reshape(1)
        else:
            converted[name] = dequantize_weight(tensor, scale.float().reshape(1), torch.float32)
    return converted


def stored_quant(
    state: StateDict, source: str | Path, shard_of: Callable[[str], str | None] | None = None
) -> tuple[StateDict, QuantMode | None]:
    """(``state`` in our layout, how it is quantized, or None for full-precision weights).

    Errors name ``source`` (and, through ``shard_of``, the shard file of a tensor of a sharded
    folder) and the first offending tensor: 8-bit weights without scales (an unknown layout), a mix
    of quantized and unquantized linears, and linears quantized in different ways.
    """

    def where(key: str) -> str:
        shard = shard_of(key) if shard_of is not None else None
        return f" (in {shard})" if shard else ""

    if PUBLIC_MARKER in state or any(k.endswith("." + PUBLIC_SCALE) for k in state):
        state = _from_public_layout(state, source)
    layers = sorted({k.rsplit(".", 1)[0] for k in state if is_quantized_linear(k.rsplit(".", 1)[0])})
    scaled = [layer for layer in layers if f"{layer}.{SCALE}" in state]
    eight_bit = [k for k, t in state.items() if t.dtype in _EIGHT_BIT]
    if not scaled:
        if eight_bit:
            raise CheckpointError(
                f"{source}: tensor {eight_bit[0]!r} is stored in {state[eight_bit[0]].dtype} in a quantized layout "
                f"Inferix does not read (no '<layer>.{SCALE}' or '<layer>.{PUBLIC_SCALE}' scales); quantize the "
                "full-precision checkpoint with `inferix quantize` instead"
            )
        return state, None
    unscaled = [layer for layer in layers if layer not in scaled]
    if unscaled:
        raise CheckpointError(
            f"{source} mixes quantized and unquantized weights: {scaled[0]!r}{where(f'{scaled[0]}.weight')} has a "
            f"{SCALE}, {unscaled[0]!r}{where(f'{unscaled[0]}.weight')} (and {len(unscaled) - 1} more) has none; "
            "every shard must come from the same `inferix quantize` run"
        )
    first = state[f"{scaled[0]}.weight"]
    kinds = {(state[f"{layer}.weight"].dtype, state[f"{layer}.{SCALE}"].numel() == 1) for layer in scaled}
    if len(kinds) > 1 or first.dtype not in _EIGHT_BIT:
        raise CheckpointError(
            f"{source}: the quantized linears do not share one weight dtype and scale granularity "
            f"(found {sorted((str(d), 'per-tensor' if t else 'per-row') for d, t in kinds)}); re-quantize it"
        )
    per_tensor = first.numel() > 1 and state[f"{scaled[0]}.{SCALE}"].numel() == 1
    name = {torch.int8: "int8"}.get(first.dtype, "fp8-tensor" if per_tensor else "fp8")
    return state, QUANT_MODES[name]


def weight_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer of ``module`` (8-bit weights and their scales included)."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def run_mode(requested: QuantMode | None, stored: QuantMode | None, source: str | Path) -> QuantMode:
    """The mode a DiT runs in: ``requested`` (``--quant`` / the preset; None: unset) for a
    full-precision checkpoint, the checkpoint's own for a quantized one unless ``requested`` reads
    the same tensors (int8 weights run as ``int8`` or ``int8-wo``)."""
    if stored is None:
        return requested or QUANT_MODES["none"]
    if requested is None or requested.stores_like(stored):
        return requested or stored
    return _refuse(requested, stored, source)


def _refuse(requested: QuantMode, stored: QuantMode, source: str | Path) -> QuantMode:
    raise CheckpointError(
        f"{source} holds {stored.name}-quantized weights, which cannot run as --quant {requested.name}; "
        "point --model at the full-precision checkpoint to quantize it another way"
    )
