"""CPU precision detection, checked against this machine's own facts, and the engine's bf16/fp16 warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine.families.wan.loader import load_wan_model
from engine.precision import cpu_precision, emulated_dtype_reason, onednn_dtype, warn_if_emulated

CPUINFO = Path("/proc/cpuinfo")


def flags_of_every_core() -> list[set[str]]:
    """The flag set of each core listed in /proc/cpuinfo (x86 "flags", Arm "Features")."""
    return [
        set(line.split(":", 1)[1].split())
        for line in CPUINFO.read_text().splitlines()
        if line.split(":", 1)[0].strip() in ("flags", "Features")
    ]


@pytest.mark.skipif(not CPUINFO.is_file(), reason="needs Linux /proc/cpuinfo")
def test_detection_agrees_with_proc_cpuinfo() -> None:
    cores = flags_of_every_core()
    assert cores and all(flags == cores[0] for flags in cores)
    cpu = cpu_precision()
    assert cpu.flags == cores[0]
    assert cpu.native_bf16 == bool({"avx512_bf16", "amx_bf16", "bf16"} & cores[0])
    assert cpu.native_fp16 == bool({"avx512_fp16", "amx_fp16", "asimdhp"} & cores[0])
    assert cpu.native(torch.float32)


def test_detection_agrees_with_torch() -> None:
    cpu = cpu_precision()
    assert cpu.capability == torch.backends.cpu.get_cpu_capability()
    if cpu.capability == "AVX2":  # PyTorch's AVX2 kernels mean no AVX512 at all, so no AVX512-BF16
        assert not {"avx512_bf16", "avx512_fp16"} & cpu.flags
    assert cpu.onednn_bf16 == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert cpu.onednn_fp16 == bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    if "avx512_bf16" in cpu.flags or "amx_bf16" in cpu.flags:
        assert cpu.onednn_bf16  # oneDNN takes bf16 wherever the hardware computes it
    assert onednn_dtype(torch.float32) == torch.backends.mkldnn.is_available()
    assert onednn_dtype(torch.bfloat16) == (torch.backends.mkldnn.is_available() and cpu.onednn_bf16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_dtypes_get_a_measured_reason(dtype: torch.dtype) -> None:
    reason = emulated_dtype_reason(dtype)
    assert (reason is None) == cpu_precision().native(dtype)
    if reason is not None:
        name = "bf16" if dtype == torch.bfloat16 else "fp16"
        assert f"no native {name} arithmetic" in reason and f"ms in {name} vs" in reason and "ms in fp32" in reason


def test_loading_warns_only_for_an_emulated_cpu_dtype(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine.precision"):
        warn_if_emulated(torch.float32, "cpu")
        warn_if_emulated(torch.bfloat16, "cuda")
        assert not caplog.records
        load_wan_model("tiny", dtype="bf16")
    warnings = [r.getMessage() for r in caplog.records]
    if cpu_precision().native_bf16:
        assert not warnings
    else:
        assert len(warnings) == 1 and warnings[0].startswith("--dtype bf16 on the CPU will be slower than fp32")
