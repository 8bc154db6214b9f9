"""UMT5-XXL encoder: the text encoder of Wan2.1 and of the Self Forcing / CausVid models built on it.

Parameter names follow the reference ``T5Encoder`` state dict exactly, so the released
``models_t5_umt5-xxl-enc-bf16.pth`` (and the golden ``text.safetensors``) load with ``strict=True``.
The math follows the reference too, including its quirks, because the DiT was trained on exactly
these embeddings: no ``1/sqrt(d)`` attention scaling, a relative-position bias table per block
(umt5 has ``shared_pos=False``), the T5 RMS norm without mean subtraction, a gated tanh-GELU FFN,
softmax in fp32 whatever the compute dtype, and the fp16 overflow clamp.

Two outputs exist because the reference exposes two: :meth:`UMT5Encoder.forward` is the raw encoder
output, :meth:`UMT5Encoder.prompt_embeds` additionally zeroes every row at or after the prompt length,
which is what Wan's text-encoder wrapper hands to the DiT. :class:`PromptEncoder` goes from prompt
strings to those embeddings and caches them, since a session re-encodes only when its prompt changes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import load_into, read_state_dict
from engine.families.wan.tokenizer import PromptTokenizer
from inferix.errors import UserError
from inferix.spec.architectures import UMT5Config

__all__ = [
    "PromptEncoder",
    "UMT5Encoder",
    "relative_position_buckets",
]


def relative_position_buckets(length: int, num_buckets: int, max_dist: int, device: torch.device) -> Tensor:
    """Bidirectional T5 bucket index of every (query, key) pair: an int64 ``[length, length]`` tensor.

    Half of the buckets are for keys before the query, half for keys after it. Inside each half,
    distances below a quarter of ``num_buckets`` get a bucket each and larger distances share
    log-spaced buckets up to ``max_dist``. The log is taken in fp32 in the reference's order of
    operations so that distances on a bucket boundary land in the same bucket as the checkpoint saw.
    """
    positions = torch.arange(length, device=device)
    relative = positions[None, :] - positions[:, None]  # key - query
    half = num_buckets // 2
    max_exact = half // 2
    direction = (relative > 0).long() * half
    distance = relative.abs()
    # Clamping keeps log() finite for the short distances, whose result is discarded by the where().
    scaled = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_dist / max_exact)
    far = (max_exact + (scaled * (half - max_exact)).long()).clamp(max=half - 1)
    return direction + torch.where(distance < max_exact, distance, far)


def _clamp_fp16(x: Tensor) -> Tensor:
    """Pull fp16 overflow back into range, as the reference does after every residual add.

    umt5 activations exceed the fp16 range; without this an fp16 run would turn into inf/NaN. Only
    applied when an inf is present, exactly like the reference, so finite values are never changed.
    """
    if x.dtype == torch.float16 and torch.isinf(x).any():
        limit = torch.finfo(torch.float16).max - 1000
        return x.clamp(min=-limit, max=limit)
    return x


class T5RMSNorm(nn.Module):
    """T5 layer norm: scale by the root mean square (no mean subtraction, no bias), stats in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        normed = x * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(self.weight)


class RelativePositionBias(nn.Module):
    """Learned per-head attention bias looked up by relative-position bucket."""

    def __init__(self, num_buckets: int, num_heads: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_buckets, num_heads)

    def forward(self, buckets: Tensor) -> Tensor:
        """``buckets [Lq, Lk]`` -> bias ``[1, heads, Lq, Lk]``."""
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)


class T5SelfAttention(nn.Module):
    """Multi-head self-attention without bias terms and without the 1/sqrt(head_dim) scaling.

    T5 folds the scaling into the initialisation of ``q``, so the checkpoint expects raw dot products.
    """

    def __init__(self, dim: int, dim_attn: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim_attn, bias=False)
        self.k = nn.Linear(dim, dim_attn, bias=False)
        self.v = nn.Linear(dim, dim_attn, bias=False)
        self.o = nn.Linear(dim_attn, dim, bias=False)

    def forward(self, x: Tensor, bias: Tensor) -> Tensor:
        """``x [B, L, dim]``, ``bias [B or 1, heads, L, L]`` (position bias + padding mask)."""
        batch, length, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = q @ k.transpose(-1, -2) + bias
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = (probs @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.o(out)


class GatedFeedForward(nn.Module):
    """``fc2(fc1(x) * gelu_tanh(gate(x)))``; ``gate`` is a Sequential so its weight is ``gate.0.weight``."""

    def __init__(self, dim: int, dim_ffn: int) -> None:
        super().__init__()
        self.gate = nn.Sequential(nn.Linear(dim, dim_ffn, bias=False), nn.GELU(approximate="tanh"))
        self.fc1 = nn.Linear(dim, dim_ffn, bias=False)
        self.fc2 = nn.Linear(dim_ffn, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.fc1(x) * self.gate(x))


class UMT5Block(nn.Module):
    """Pre-norm encoder block with its own relative-position table (umt5 does not share them)."""

    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.norm1 = T5RMSNorm(config.dim, config.eps)
        self.attn = T5SelfAttention(config.dim, config.dim_attn, config.num_heads)
        self.norm2 = T5RMSNorm(config.dim, config.eps)
        self.ffn = GatedFeedForward(config.dim, config.dim_ffn)
        self.pos_embedding = RelativePositionBias(config.num_buckets, config.num_heads)

    def forward(self, x: Tensor, buckets: Tensor, padding: Tensor) -> Tensor:
        """``buckets [L, L]`` relative-position buckets; ``padding [B, 1, 1, L]`` True for keys to ignore."""
        pos_bias = self.pos_embedding(buckets)
        # Padding keys get the most negative finite value (not -inf) like the reference, so a row whose
        # keys are all padding still yields a finite (uniform) softmax instead of NaN.
        bias = torch.where(padding, torch.finfo(x.dtype).min, pos_bias.to(x.dtype))
        x = _clamp_fp16(x + self.attn(self.norm1(x), bias))
        return _clamp_fp16(x + self.ffn(self.norm2(x)))


class UMT5Encoder(nn.Module):
    """The UMT5 encoder stack: token embedding, ``num_layers`` blocks, final RMS norm."""

    def __init__(self, config: UMT5Config) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.dim)
        self.blocks = nn.ModuleList(UMT5Block(config) for _ in range(config.num_layers))
        self.norm = T5RMSNorm(config.dim, config.eps)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: UMT5Config,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> UMT5Encoder:
        """Load a reference state dict (``.pth``/``.pt`` or ``.safetensors``) into an eval-mode encoder.

        The parameters are created on the meta device and the checkpoint tensors become them
        (`engine.checkpoint.load_into`), so the 5.7B-parameter umt5-xxl is neither randomly
        initialised nor held twice in memory.
        """
        state = read_state_dict(
            path,
            "text encoder checkpoint",
            "Expected the umt5 encoder weights, e.g. models_t5_umt5-xxl-enc-bf16.pth from the Wan2.1 release.",
        )
        return load_into(
            lambda: cls(config),
            state,
            path,
            dtype=dtype,
            device=device,
            what="UMT5 encoder",
            hint="check num_layers / dim of the text encoder config and that the file is the encoder-only "
            "umt5 checkpoint (e.g. models_t5_umt5-xxl-enc-bf16.pth)",
        )

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """Raw encoder output ``[B, L, dim]`` for token ``ids [B, L]`` and attention ``mask [B, L]``.

        ``mask`` is 1 for real tokens (prompt + EOS) and 0 for padding; padded keys are ignored by
        attention, but padded rows still get (meaningless) values, see :meth:`prompt_embeds`.
        """
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(
                f"ids and mask must both be [batch, length], got {tuple(ids.shape)} and {tuple(mask.shape)}"
            )
        x = self.token_embedding(ids)
        buckets = relative_position_buckets(ids.shape[1], self.config.num_buckets, self.config.max_dist, ids.device)
        padding = (mask == 0)[:, None, None, :]
        for block in self.blocks:
            x = block(x, buckets, padding)
        return self.norm(x)

    def prompt_embeds(self, ids: Tensor, mask: Tensor) -> Tensor:
        """Encoder output with every row at or after the prompt length set to 0: what the DiT consumes.

        The DiT cross-attends to all ``text_len`` rows without a mask, so these zeros are part of
        the conditioning the model was trained with.
        """
        x = self(ids, mask)
        lengths = mask.gt(0).sum(dim=1)
        is_padding = torch.arange(ids.shape[1], device=ids.device)[None, :] >= lengths[:, None]
        return x.masked_fill(is_padding[..., None], 0.0)


class PromptEncoder:
    """Prompt strings -> DiT text conditioning ``[B, text_len, dim]`` (padding rows zero), with an LRU cache.

    Interactive sessions switch between a handful of prompts, and umt5-xxl is the most expensive
    model to run per prompt, so the embeddings of the ``cache_size`` most recently used prompts are
    kept on the encoder's device, keyed by the prompt string as given. Computation happens on the
    encoder's device and in its dtype; the result has that device and dtype too.
    """

    def __init__(self, tokenizer: PromptTokenizer, encoder: UMT5Encoder, cache_size: int = 16) -> None:
        if cache_size < 1:
            raise UserError(f"prompt cache_size must be >= 1, got {cache_size}")
        if tokenizer.text_len != encoder.config.text_len:
            raise UserError(
                f"tokenizer text_len ({tokenizer.text_len}) differs from the text encoder's "
                f"text_len ({encoder.config.text_len}); build both from the same config"
            )
        if tokenizer.vocab_size > encoder.config.vocab_size:
            raise UserError(
                f"tokenizer {tokenizer.tokenizer_dir} has {tokenizer.vocab_size} tokens but the text "
                f"encoder only embeds {encoder.config.vocab_size}; use the tokenizer that matches the "
                "checkpoint (google/umt5-xxl for Wan2.1)"
            )
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.cache_size = cache_size
        self.cache_hits = 0
        self.cache_misses = 0
        self._cache: OrderedDict[str, Tensor] = OrderedDict()

    def encode(self, prompts: list[str]) -> Tensor:
        """Embeddings of ``prompts`` in order; prompts not in the cache are encoded as one batch."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings, not a single string")
        if not prompts:
            raise UserError("no prompts given; pass at least one prompt")
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        fresh = self._encode_uncached(missing) if missing else {}
        self.cache_misses += len(missing)
        self.cache_hits += len(prompts) - len(missing)
        rows = []
        for prompt in prompts:
            if prompt in fresh:
                rows.append(fresh[prompt])
            else:
                self._cache.move_to_end(prompt)
                rows.append(self._cache[prompt])
        for prompt, embeds in fresh.items():
            self._cache[prompt] = embeds
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        # stack copies, so a caller editing the result in place cannot corrupt the cache.
        return torch.stack(rows)

    @torch.no_grad()
    def _encode_uncached(self, prompts: list[str]) -> dict[str, Tensor]:
        ids, mask = self.tokenizer(prompts)
        device = self.encoder.token_embedding.weight.device
        embeds = self.encoder.prompt_embeds(ids.to(device), mask.to(device))
        # clone: a cached row must not keep the whole batch's storage alive after its neighbours are evicted
        return {prompt: row.clone() for prompt, row in zip(prompts, embeds, strict=True)}
