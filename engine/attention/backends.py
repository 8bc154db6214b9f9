"""Attention kernels behind one small interface.

All tensors use the [B, L, H, D] layout of the Wan code. `dense` attends over contiguous K/V;
`paged` attends over pages of a KV pool given a page list, so a backend with a native paged
kernel (flash-attn's `block_table`) never materialises the gathered cache.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

BackendName = Literal["auto", "sdpa", "flash"]
_FLASH_PAGE_MULTIPLE = 256  # flash-attn's paged KV needs page sizes divisible by 256
# Cached tokens per session up to which one attention call for several sessions (their K/V gathered
# into one tensor) beats a call each reading its pages in place: beyond it the copies cost more.
GATHER_KV_LIMIT = 2048


class AttentionBackend:
    """Default backend: PyTorch SDPA (works on every device and dtype)."""

    name = "sdpa"

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)

    def paged(self, q: Tensor, k_pages: Tensor, v_pages: Tensor, page_ids: Tensor) -> Tensor:
        """Attend over pages `page_ids` (in that order) of k_pages/v_pages [P, page_size, H, D]."""
        k = k_pages.index_select(0, page_ids).flatten(0, 1).unsqueeze(0)
        v = v_pages.index_select(0, page_ids).flatten(0, 1).unsqueeze(0)
        return self.dense(q, k, v)

    def batches_pages(self, q: Tensor, k_pages: Tensor, kv_tokens: int) -> bool:
        """Whether `paged_batch` pays for sessions of `kv_tokens` cached tokens (else: a call each)."""
        return kv_tokens <= GATHER_KV_LIMIT

    def paged_batch(self, q: Tensor, k_pages: Tensor, v_pages: Tensor, page_ids: list[Tensor]) -> Tensor:
        """Attention of several sessions at once: q [n, L, H, D], row i over pages `page_ids[i]`
        (every list as long). One gather and one kernel call instead of n."""
        n = q.shape[0]
        ids = torch.cat(page_ids)
        k = k_pages.index_select(0, ids).view(n, -1, *k_pages.shape[2:])
        v = v_pages.index_select(0, ids).view(n, -1, *v_pages.shape[2:])
        return self.dense(q, k, v)


class FlashAttentionBackend(AttentionBackend):
    """flash-attn 2 on CUDA with fp16/bf16 tensors; falls back to SDPA for anything else."""

    name = "flash"

    def __init__(self) -> None:
        import flash_attn

        self._flash = flash_attn

    @staticmethod
    def _usable(t: Tensor) -> bool:
        return t.is_cuda and t.dtype in (torch.float16, torch.bfloat16)

    def dense(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if not self._usable(q):
            return super().dense(q, k, v)
        return self._flash.flash_attn_func(q, k, v)

    def paged(self, q: Tensor, k_pages: Tensor, v_pages: Tensor, page_ids: Tensor) -> Tensor:
        page_size = k_pages.shape[1]
        if not self._usable(q) or page_size % _FLASH_PAGE_MULTIPLE != 0:
            return super().paged(q, k_pages, v_pages, page_ids)
        block_table = page_ids.to(device=q.device, dtype=torch.int32).unsqueeze(0)
        seqlens = torch.tensor([page_ids.numel() * page_size], device=q.device, dtype=torch.int32)
        return self._flash.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=block_table)

    def batches_pages(self, q: Tensor, k_pages: Tensor, kv_tokens: int) -> bool:
        native = self._usable(q) and k_pages.shape[1] % _FLASH_PAGE_MULTIPLE == 0  # reads pages in place
        return native or super().batches_pages(q, k_pages, kv_tokens)

    def paged_batch(self, q: Tensor, k_pages: Tensor, v_pages: Tensor, page_ids: list[Tensor]) -> Tensor:
        page_size = k_pages.shape[1]
        if not self._usable(q) or page_size % _FLASH_PAGE_MULTIPLE != 0:
            return super().paged_batch(q, k_pages, v_pages, page_ids)
        block_table = torch.stack(page_ids).to(device=q.device, dtype=torch.int32)
        seqlens = torch.full((q.shape[0],), page_ids[0].numel() * page_size, device=q.device, dtype=torch.int32)
        return self._flash.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=block_table)


def flash_attention_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def get_backend(name: str = "auto") -> AttentionBackend:
    """Return the attention backend called `name` ('auto', 'sdpa' or 'flash')."""
    if name == "sdpa":
        return AttentionBackend()
    if name == "flash":
        if not flash_attention_available():
            raise ValueError(
                "attention backend 'flash' is unavailable: it needs CUDA and the flash-attn package "
                "(pip install flash-attn); use attention_backend='sdpa' or 'auto'"
            )
        return FlashAttentionBackend()
    if name == "auto":
        return FlashAttentionBackend() if flash_attention_available() else AttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; expected one of 'auto', 'sdpa', 'flash'")
