"""8-bit matmuls of the quantized linears: symmetric scales, real int8 / fp8 kernels where torch has them.

int8 (W8A8): y = (x_q @ w_q^T) * w_scale * x_scale + bias, with the products summed in int32 (exact).
- On x86 CPUs oneDNN's int8 GEMM runs it (``torch.ops.onednn.qlinear_pointwise``, the kernel of
  PyTorch's x86 quantization), faster than the fp32 GEMM on large enough matrices. Without VNNI (AVX2 only) it
  multiplies u8 x s8 pairs with ``vpmaddubsw``, whose int16 pair sums saturate beyond 32767, so
  activations use 7 bits there (±63: 2·127·127 < 32768); with VNNI / AMX, or on CUDA, they use 8.
- On CUDA, ``torch._int_mm``. Elsewhere ``torch._int_mm``'s reference kernel (exact, slow).
Each row's result depends only on that row (one scale per token, exact integer sums), so a
session's tokens give the same bits alone or batched with other sessions.

fp8 (e4m3): ``torch._scaled_mm`` with one scale per token and one per weight row (or matrix).
CUDA runs it in fp8 tensor cores (compute capability 8.9+: Ada, Hopper and later). On the CPU the
same op dequantizes to fp32: the weights are stored in 8 bits, the math is fp32 and slower than
an fp32 linear (storage-only; ``bench/quant.py`` measures it).
"""

from __future__ import annotations

import functools
import itertools
import logging
import platform
import weakref

import torch
from torch import Tensor

from engine.precision import cpu_precision
from inferix.errors import UserError

__all__ = [
    "FP8_MAX",
    "INT8_MAX",
    "check_quant_device",
    "dequantize_weight",
    "fp8_matmul",
    "int8_activation_levels",
    "int8_linear",
    "int8_matmul",
    "int8_path",
    "pack_int8_weight",
    "quantize_tokens",
    "quantize_weight",
    "register_packed",
]

log = logging.getLogger(__name__)

INT8_MAX = 127
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
# CPU flags of int8 dot products that sum into int32 directly (no int16 saturation).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
# Below this magnitude a row or token is treated as all zeros (its scale would underflow).
_TINY = 1e-12


def _x86_onednn() -> bool:
    return torch.backends.mkldnn.is_available() and platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def int8_path(device_type: str) -> str:
    """Which kernel runs int8 matmuls on ``device_type``: "onednn", "cuda-int-mm" or "reference-int-mm"."""
    if device_type == "cuda":
        return "cuda-int-mm"
    return "onednn" if device_type == "cpu" and _x86_onednn() else "reference-int-mm"


@functools.cache
def int8_activation_levels(device_type: str) -> int:
    """Largest |quantized activation|: 63 where the int8 kernel sums pairs in int16, else 127."""
    if int8_path(device_type) == "onednn" and not cpu_precision().flags & VNNI_FLAGS:
        return 63
    return INT8_MAX


def check_quant_device(fp8: bool, device: torch.device | str) -> None:
    """Refuse fp8 on a CUDA GPU without fp8 tensor cores (one line naming the GPU and what to use);
    on the CPU, say that fp8 only saves memory there."""
    device = torch.device(device)
    if fp8 and device.type == "cpu":
        log.warning(
            "--quant fp8 on the CPU stores the weights in 8 bits but computes in fp32 (torch._scaled_mm "
            "dequantizes): half the memory, slower than fp32; --quant int8 runs an int8 GEMM here"
        )
    if not fp8 or device.type != "cuda":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise UserError(
            f"--quant fp8 needs an NVIDIA GPU with fp8 tensor cores (compute capability 8.9+: Ada, Hopper or "
            f"newer); {device} is {name} (sm_{major}{minor}); use --quant int8 there"
        )


def quantize_weight(weight: Tensor, dtype: torch.dtype, per_row: bool) -> tuple[Tensor, Tensor]:
    """(8-bit weight [out, in], fp32 scale [out] or [1]) of a linear weight, symmetric, from its fp32 values."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1) if per_row else w.abs().amax().reshape(1)
    levels = INT8_MAX if dtype == torch.int8 else FP8_MAX
    scale = amax.clamp(min=_TINY) / levels
    q = w / scale.unsqueeze(1)
    if dtype == torch.int8:
        return q.round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8), scale
    return q.clamp_(-FP8_MAX, FP8_MAX).to(dtype), scale


def dequantize_weight(weight: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """The weight in ``dtype`` (computed in fp32): the int8-weight-only path and a layer kept in high precision."""
    return (weight.float() * scale.unsqueeze(1)).to(dtype)


def _token_scales(x: Tensor, levels: float) -> Tensor:
    """One fp32 scale per row of ``x`` [M, K]: its absolute maximum over ``levels``."""
    return x.float().abs().amax(dim=1, keepdim=True).clamp_(min=_TINY).div_(levels)


def quantize_tokens(x: Tensor, levels: int, zero_point: int = 0) -> tuple[Tensor, Tensor]:
    """(round(x / scale) + ``zero_point`` per row of ``x`` [M, K], still as floats; the scales [M, 1]).

    One fused multiply-add and a rounding in place: the activation side of an int8 linear is
    memory-bound on a CPU, so every pass over x counts. |x / scale| <= levels by the choice of scale.
    """
    scale = _token_scales(x, levels)
    shifted = torch.addcmul(torch.tensor(float(zero_point), device=x.device), x.float(), scale.reciprocal())
    return shifted.round_(), scale


@functools.cache
def _zero_points(rows: int) -> Tensor:
    """oneDNN's weight zero points of a symmetric int8 weight (all 0), made once per row count."""
    return torch.zeros(rows, dtype=torch.long)


def pack_int8_weight(weight: Tensor) -> Tensor | None:
    """oneDNN's packed form of an int8 weight [out, in] on the CPU (None where another kernel runs)."""
    if int8_path(weight.device.type) != "onednn":
        return None
    return torch.ops.onednn.qlinear_prepack(weight, None)


def int8_matmul(x: Tensor, weight: Tensor, scale: Tensor, packed: Tensor | None, bias: Tensor | None) -> Tensor:
    """``x`` [M, K] @ the int8 ``weight`` [N, K]^T (+ ``bias``) in fp32, activations quantized per token."""
    path = int8_path(x.device.type)
    levels = int8_activation_levels(x.device.type)
    if path == "onednn":
        assert packed is not None, "an int8 linear on the CPU needs its packed weight (QuantLinear packs it)"
        zero_point = levels + 1  # u8 = q + zp in [1, 2*levels + 1]
        u8, x_scale = quantize_tokens(x, levels, zero_point)
        zeros = _zero_points(scale.numel())
        acc = torch.ops.onednn.qlinear_pointwise(
            u8.to(torch.uint8), 1.0, zero_point, packed, scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        )  # the exact integer sums times the weight scales, in fp32
    else:
        q, x_scale = quantize_tokens(x, levels)
        q8 = q.to(torch.int8)
        rows = q8.shape[0]
        if path == "cuda-int-mm" and rows <= 16:  # cuBLAS int8 GEMM wants more than 16 rows
            q8 = torch.cat([q8, q8.new_zeros(17 - rows, q8.shape[1])])
        acc = torch._int_mm(q8, weight.t())[:rows].float().mul_(scale)
    return acc.mul_(x_scale) if bias is None else torch.addcmul(bias.float(), acc, x_scale)


# oneDNN's packed int8 weights, by the key of their layer: an opaque (mkldnn) tensor cannot enter a
# graph torch.compile traces, so the compiled step calls `int8_linear` with the key instead.
_PACKED: dict[int, Tensor] = {}
_keys = itertools.count()


def register_packed(packed: Tensor | None, owner: object) -> int:
    """A key under which ``packed`` stays known to `int8_linear` as long as ``owner`` lives (-1: None)."""
    if packed is None:
        return -1
    key = next(_keys)
    _PACKED[key] = packed
    weakref.finalize(owner, _PACKED.pop, key, None)
    return key


@torch.library.custom_op("inferix::int8_linear", mutates_args=())
def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, packed_key: int) -> Tensor:
    """`int8_matmul` as one opaque op (eager and compiled alike) with the packed weight found by key."""
    return int8_matmul(x, weight, scale, _PACKED.get(packed_key), bias)


@int8_linear.register_fake
def _(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, packed_key: int) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def fp8_matmul(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """``x`` [M, K] @ the fp8 ``weight`` [N, K]^T, activations quantized to fp8 per token; fp32 on the
    CPU, bf16 on CUDA (what its row-wise scaled GEMM writes)."""
    x_scale = _token_scales(x, FP8_MAX)
    q = x.float().div(x_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    w_scale = scale.reshape(1, -1).expand(1, weight.shape[0]).contiguous()
    out = torch.float32 if x.device.type == "cpu" else torch.bfloat16
    return torch._scaled_mm(q, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=out)
