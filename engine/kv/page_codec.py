"""8-bit pages (`kv_dtype="fp8"` or `"int8"`): K and V are stored in 8 bits with one fp32 scale per
(layer, page, head) for each, symmetric (scale = amax / 448 for fp8 e4m3, amax / 127 for int8).
Every write of a page re-quantizes it with a fresh scale: a page is a whole number of a frame's
tokens and every denoising step of a block rewrites its frames whole, so the scale always fits
the page's current contents. Reads dequantize page by page into `dtype` (a fresh tensor, never a
view) before any attention kernel runs; the host tier moves the 8-bit pages with their scales.
"""

from __future__ import annotations

import torch
from torch import Tensor

KV_DTYPES = ("auto", "fp8", "int8")
# The largest stored magnitude of each 8-bit format: a (page, head)'s amax maps onto it.
_QMAX = {"fp8": 448.0, "int8": 127.0}
# fp8 e4m3 pages are kept as their raw bytes: CPU kernels lack index_copy for float8 types.
_STORAGE = {"fp8": torch.uint8, "int8": torch.int8}
_SCALE_BYTES = 4  # fp32


def check_kv_dtype(kv_dtype: str) -> str:
    """`kv_dtype` if it names a storage mode, else a ValueError naming the allowed values."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {', '.join(map(repr, KV_DTYPES))}, got {kv_dtype!r}")
    return kv_dtype


def quantize_pages(x: Tensor, kv_dtype: str) -> tuple[Tensor, Tensor]:
    """8-bit pages of x [n, page_size, H, D] and their fp32 scales [n, H] (symmetric, per page and head)."""
    qmax = _QMAX[kv_dtype]
    x = x.float()
    amax = x.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))  # an all-zero page stays zero
    q = (x / scale[:, None, :, None]).clamp(-qmax, qmax)
    if kv_dtype == "int8":
        return q.round().to(torch.int8), scale
    return q.to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize_pages(q: Tensor, scale: Tensor, kv_dtype: str, dtype: torch.dtype) -> Tensor:
    """Pages [n, page_size, H, D] in `dtype` from 8-bit pages and their scales [n, H]."""
    values = q.view(torch.float8_e4m3fn) if kv_dtype == "fp8" else q
    return (values.float() * scale[:, None, :, None]).to(dtype)
