"""Which reduced precisions this machine's CPU computes natively, and the engine's check of a CPU dtype.

bf16 matmuls and convolutions run natively on x86 CPUs with AVX512-BF16 (Cooper Lake, Zen 4 and
later) or AMX-BF16 (Sapphire Rapids and later), fp16 ones with AVX512-FP16 or AMX-FP16; on Arm,
with the BF16 and half-precision SIMD extensions. Elsewhere PyTorch emulates them: on an AVX2-only
CPU its bf16 matmul runs a generic kernel about 8x slower than fp32 (a 1344x384 @ 384x1536 linear:
193 ms vs 25 ms, one thread), so a bf16 engine there is several times slower than fp32, not faster
(bench/precision.py measures the whole DiT step).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["CpuPrecision", "cpu_precision", "emulated_dtype_reason", "onednn_dtype", "warn_if_emulated"]

log = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
# /proc/cpuinfo flags (x86 "flags", Arm "Features") of native bf16 / fp16 arithmetic.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16", "asimdhp"})
_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class CpuPrecision:
    """The facts behind a CPU dtype choice."""

    capability: str  # PyTorch's CPU kernel level: "AVX2", "AVX512", "DEFAULT", ...
    flags: frozenset[str]  # the CPU feature flags, as /proc/cpuinfo lists them (empty where unreadable)
    onednn_bf16: bool  # oneDNN accepts bf16 here (with AVX512 it may still emulate it)
    onednn_fp16: bool

    @property
    def native_bf16(self) -> bool:
        return bool(self.flags & BF16_FLAGS)

    @property
    def native_fp16(self) -> bool:
        return bool(self.flags & FP16_FLAGS)

    def native(self, dtype: torch.dtype) -> bool:
        """Whether matmuls in ``dtype`` run in hardware (fp32 always does)."""
        if dtype == torch.bfloat16:
            return self.native_bf16
        if dtype == torch.float16:
            return self.native_fp16
        return True


def _cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of the first CPU in ``cpuinfo`` (all cores of a machine share them)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.cache
def cpu_precision() -> CpuPrecision:
    """This machine's CPU (read once)."""
    onednn = torch.backends.mkldnn.is_available()
    return CpuPrecision(
        capability=torch.backends.cpu.get_cpu_capability(),
        flags=_cpu_flags(),
        onednn_bf16=onednn and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        onednn_fp16=onednn and bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
    )


def onednn_dtype(dtype: torch.dtype) -> bool:
    """Whether oneDNN (PyTorch's CPU convolutions) takes tensors of ``dtype`` on this machine."""
    if not torch.backends.mkldnn.is_available():
        return False
    cpu = cpu_precision()
    return (
        dtype == torch.float32
        or (dtype == torch.bfloat16 and cpu.onednn_bf16)
        or (dtype == torch.float16 and cpu.onednn_fp16)
    )


def _matmul_ms(dtype: torch.dtype, size: int = 256, repeats: int = 3) -> float:
    """Best-of-``repeats`` milliseconds of one [size, size] @ [size, size] matmul in ``dtype``, on one
    thread (threads waiting for cores that other work holds would blur the comparison)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a @ b  # warm-up: kernel selection, first touch of the output
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best * 1e3


def emulated_dtype_reason(dtype: torch.dtype) -> str | None:
    """Why weights in ``dtype`` would run slower than fp32 on this CPU (measured), or None if native."""
    cpu = cpu_precision()
    if cpu.native(dtype):
        return None
    name = _NAMES[dtype]
    wanted = sorted(BF16_FLAGS if dtype == torch.bfloat16 else FP16_FLAGS)
    reduced, full = _matmul_ms(dtype), _matmul_ms(torch.float32)
    return (
        f"this CPU ({cpu.capability}) has no native {name} arithmetic (none of the flags {', '.join(wanted)}), "
        f"so PyTorch emulates {name}: a 256x256 matmul on one core takes {reduced:.2f} ms in {name} vs "
        f"{full:.2f} ms in fp32 here ({reduced / full:.1f}x)"
    )


def warn_if_emulated(dtype: torch.dtype, device: torch.device | str) -> None:
    """Log a warning when ``dtype`` weights are asked for on a CPU that only emulates that dtype."""
    if torch.device(device).type != "cpu" or dtype not in _NAMES:
        return
    reason = emulated_dtype_reason(dtype)
    if reason is not None:
        log.warning("--dtype %s on the CPU will be slower than fp32: %s; use fp32 here", _NAMES[dtype], reason)
