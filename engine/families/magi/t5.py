"""T5 v1.1 encoder and tokenizer for MAGI-1's text conditioning, without the ``transformers`` package.

The reference runs HF ``T5EncoderModel`` (DeepFloyd ``t5-v1_1-xxl``) in fp32 on prompts tokenized with
``padding='max_length', max_length=800, truncation=True``. Parameter names here are HF's, so an HF folder
(``config.json`` + ``model.safetensors`` / shards / ``pytorch_model.bin``) loads unchanged. The math
follows HF's T5 because the DiT was trained on exactly these embeddings: gated tanh-GELU FFN, RMS norm
without mean subtraction, no biases, no ``1/sqrt(d)`` attention scaling, one relative-position bias
table (block 0) shared by every block, padding added as ``finfo.min`` to the bias, softmax in fp32.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import StateDict, load_into, read_sharded, read_state_dict
from engine.families.wan.text_encoder import relative_position_buckets
from engine.families.wan.tokenizer import load_tokenizer_backend
from inferix.errors import CheckpointError, UserError

__all__ = [
    "MagiTokenizer",
    "T5Config",
    "T5Encoder",
    "load_t5",
    "normalize_t5_state_dict",
]

CONFIG_FILE = "config.json"
# HF weight layouts, in the order HF's from_pretrained prefers them.
SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_FILE = "model.safetensors"
TORCH_INDEX = "pytorch_model.bin.index.json"
TORCH_FILE = "pytorch_model.bin"
SHARED_KEY = "shared.weight"
TIED_EMBED_KEY = "encoder.embed_tokens.weight"
# Parts of a full T5ForConditionalGeneration checkpoint that the encoder does not use (HF's
# T5EncoderModel ignores them the same way).
DECODER_PREFIXES = ("decoder.", "lm_head.")

# The reference tokenizes to caption_max_length, which must be 800 (see captions.py).
DEFAULT_MAX_LENGTH = 800

_SUPPORTED_FFN = "gated-gelu"
_GELU_SCALE = math.sqrt(2.0 / math.pi)
_REQUIRED_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
_SIZE_FIELDS = (*_REQUIRED_FIELDS, "relative_attention_num_buckets", "relative_attention_max_distance")


# ---- config ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class T5Config:
    """The encoder hyper-parameters of an HF ``T5Config`` (T5 v1.1: gated-GELU FFN only)."""

    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self) -> None:
        bad = [
            f"{name}={value!r}"
            for name in _SIZE_FIELDS
            if not isinstance(value := getattr(self, name), int) or isinstance(value, bool) or value < 1
        ]
        if bad:
            raise UserError(f"T5 config: {', '.join(bad)}; these sizes must be positive integers")
        if self.relative_attention_num_buckets < 4:
            raise UserError("T5 config: relative_attention_num_buckets must be >= 4 (two directions, exact + log)")
        if not self.layer_norm_epsilon > 0:
            raise UserError(f"T5 config: layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}")

    @property
    def inner_dim(self) -> int:
        """Width of q/k/v: ``num_heads * d_kv`` (need not equal ``d_model``)."""
        return self.num_heads * self.d_kv

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], source: str | Path = "T5 config") -> T5Config:
        """Read an HF ``T5Config`` dict (``config.json``); ``source`` names it in error messages.

        Optional fields take HF's defaults; ``feed_forward_proj`` must be ``gated-gelu`` (T5 v1.1), as
        HF's own default ``relu`` (original T5) has a different FFN and different weight names.
        """
        ffn = config.get("feed_forward_proj", "relu")
        if ffn != _SUPPORTED_FFN:
            raise UserError(
                f"{source}: feed_forward_proj {ffn!r} is not supported; only T5 v1.1 encoders "
                f"({_SUPPORTED_FFN!r}, e.g. DeepFloyd/t5-v1_1-xxl) are"
            )
        missing = [key for key in _REQUIRED_FIELDS if key not in config]
        if missing:
            raise UserError(f"{source} lacks {', '.join(missing)}; expected an HF T5Config (config.json)")
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{key: config[key] for key in names if key in config})


# ---- model ----------------------------------------------------------------------------------------
def _clamp_fp16(x: Tensor) -> Tensor:
    """HF's fp16 overflow guard after each sublayer: infs become +-(max - 1000), finite values stay."""
    if x.dtype == torch.float16 and torch.isinf(x).any():
        limit = torch.finfo(torch.float16).max - 1000
        return x.clamp(min=-limit, max=limit)
    return x


def gelu_new(x: Tensor) -> Tensor:
    """HF's ``gelu_new`` (tanh-approximate GELU) spelled out as HF computes it.

    ``F.gelu(approximate='tanh')`` is the same function but rounds differently (~1e-7); this order of
    operations reproduces the reference bit for bit where the matmuls do.
    """
    return 0.5 * x * (1.0 + torch.tanh(_GELU_SCALE * (x + 0.044715 * torch.pow(x, 3.0))))


class T5LayerNorm(nn.Module):
    """RMS norm ``w * x * rsqrt(mean(x^2) + eps)``: no mean subtraction, no bias, statistics in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: Tensor) -> Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class T5Attention(nn.Module):
    """Bias-free multi-head self-attention; ``relative_attention_bias`` exists in block 0 only."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.q = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.k = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.v = nn.Linear(config.d_model, config.inner_dim, bias=False)
        self.o = nn.Linear(config.inner_dim, config.d_model, bias=False)
        self.relative_attention_bias = (
            nn.Embedding(config.relative_attention_num_buckets, config.num_heads)
            if has_relative_attention_bias
            else None
        )

    def forward(self, x: Tensor, position_bias: Tensor) -> Tensor:
        """``x [B, L, D]``, ``position_bias [B or 1, heads, L, L]`` (relative bias + padding mask)."""
        batch, length, _ = x.shape

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, length, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        # T5 folds the 1/sqrt(d) scaling into q's initialisation, so the raw dot product is what was trained.
        scores = torch.matmul(q, k.transpose(3, 2)) + position_bias
        probs = F.softmax(scores.float(), dim=-1).type_as(scores)
        return self.o(torch.matmul(probs, v).transpose(1, 2).reshape(batch, length, -1))


class T5LayerSelfAttention(nn.Module):
    """Pre-norm residual self-attention sublayer (HF ``layer.0``)."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool) -> None:
        super().__init__()
        self.SelfAttention = T5Attention(config, has_relative_attention_bias)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)

    def forward(self, x: Tensor, position_bias: Tensor) -> Tensor:
        return _clamp_fp16(x + self.SelfAttention(self.layer_norm(x), position_bias))


class T5DenseGatedActDense(nn.Module):
    """``wo(gelu_tanh(wi_0 x) * wi_1 x)``: the T5 v1.1 gated-GELU FFN."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.wo(gelu_new(self.wi_0(x)) * self.wi_1(x))


class T5LayerFF(nn.Module):
    """Pre-norm residual FFN sublayer (HF ``layer.1``)."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.DenseReluDense = T5DenseGatedActDense(config)
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)

    def forward(self, x: Tensor) -> Tensor:
        return _clamp_fp16(x + self.DenseReluDense(self.layer_norm(x)))


class T5Block(nn.Module):
    """One encoder block: ``layer = [self-attention, FFN]``, HF's layout."""

    def __init__(self, config: T5Config, has_relative_attention_bias: bool) -> None:
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(config, has_relative_attention_bias), T5LayerFF(config)])

    def forward(self, x: Tensor, position_bias: Tensor) -> Tensor:
        return self.layer[1](self.layer[0](x, position_bias))


class T5Stack(nn.Module):
    """The ``encoder`` submodule: blocks and the final norm (the embedding is ``T5Encoder.shared``)."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.block = nn.ModuleList(
            T5Block(config, has_relative_attention_bias=i == 0) for i in range(config.num_layers)
        )
        self.final_layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)


class T5Encoder(nn.Module):
    """HF ``T5EncoderModel`` (v1.1) with its parameter names; ``forward`` returns ``last_hidden_state``.

    The token embedding is only ``shared.weight``: HF ties ``encoder.embed_tokens.weight`` to it, and
    `load_state_dict` accepts state dicts with either name or both (`normalize_t5_state_dict`).
    """

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict`` after folding the tied embedding name into ``shared.weight``."""
        return super().load_state_dict(normalize_t5_state_dict(dict(state_dict)), strict=strict, assign=assign)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """``last_hidden_state [B, L, d_model]`` for token ``ids [B, L]`` and attention ``mask [B, L]``.

        ``mask`` is 1 on real tokens (incl. EOS) and 0 on padding. Padded keys are ignored, but padded
        rows still get values and are NOT zeroed: the reference masks them later (caption rows).
        """
        if ids.ndim != 2 or mask.shape != ids.shape:
            raise ValueError(f"ids and mask must both be [batch, length], got {tuple(ids.shape)}, {tuple(mask.shape)}")
        x = self.shared(ids)
        position_bias = self._position_bias(ids.shape[1], ids.device, x.dtype) + self._padding_bias(mask, x.dtype)
        for block in self.encoder.block:
            x = block(x, position_bias)
        return self.encoder.final_layer_norm(x)

    def _position_bias(self, length: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Block 0's relative-position bias ``[1, heads, L, L]``, reused by every block (T5 shares it)."""
        first = cast(T5LayerSelfAttention, cast(T5Block, self.encoder.block[0]).layer[0])
        table = first.SelfAttention.relative_attention_bias
        assert table is not None, "block 0 always owns the relative-position table"
        buckets = relative_position_buckets(
            length, self.config.relative_attention_num_buckets, self.config.relative_attention_max_distance, device
        )
        return table(buckets).permute(2, 0, 1).unsqueeze(0).to(dtype)

    @staticmethod
    def _padding_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
        """``[B, 1, 1, L]``: 0 on real keys, ``finfo.min`` on padding (finite, so an all-pad row is no NaN)."""
        return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def normalize_t5_state_dict(state: StateDict) -> StateDict:
    """An HF T5 state dict with the encoder's names only (returns ``state``, edited in place).

    ``encoder.embed_tokens.weight`` is HF's tied alias of ``shared.weight``: it becomes ``shared.weight``
    when that is absent and is dropped otherwise. Decoder and LM-head tensors of a full seq2seq
    checkpoint are dropped.
    """
    tied = state.pop(TIED_EMBED_KEY, None)
    if tied is not None and SHARED_KEY not in state:
        state[SHARED_KEY] = tied
    for name in [name for name in state if name.startswith(DECODER_PREFIXES)]:
        del state[name]
    return state


# ---- loading an HF folder -------------------------------------------------------------------------
def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {what} {path}: {exc}") from exc
    if not isinstance(content, dict):
        raise CheckpointError(f"{what} {path} must hold a JSON object")
    return content


def _read_weights(folder: Path) -> tuple[StateDict, Path]:
    """(state dict, the file or index it came from) of an HF model folder."""
    for name in (SAFETENSORS_INDEX, SAFETENSORS_FILE, TORCH_INDEX, TORCH_FILE):
        path = folder / name
        if path.is_file():
            is_index = name.endswith(".index.json")
            state = read_sharded(path, "T5 shard") if is_index else read_state_dict(path, "T5 weights")
            return state, path
    raise CheckpointError(
        f"T5 folder {folder} holds no weights; looked for {SAFETENSORS_INDEX}, {SAFETENSORS_FILE}, "
        f"{TORCH_INDEX} and {TORCH_FILE} (an HF T5EncoderModel folder, e.g. DeepFloyd/t5-v1_1-xxl)"
    )


def load_t5(folder: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> T5Encoder:
    """The T5 encoder of an HF folder (``config.json`` + weights), in eval mode, in ``dtype`` on ``device``.

    Built on the meta device and given the checkpoint tensors themselves (``assign=True``), so the
    19 GB fp32 t5-v1_1-xxl is neither randomly initialised nor held twice. The reference runs fp32.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"T5 folder {folder} does not exist or is not a directory")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"T5 folder {folder} has no {CONFIG_FILE} (the HF T5Config of the encoder)")
    config = T5Config.from_hf(_read_json(config_path, "T5 config"), config_path)
    state, source = _read_weights(folder)
    return load_into(
        lambda: T5Encoder(config),
        normalize_t5_state_dict(state),
        source,
        dtype=dtype,
        device=device,
        what="T5 encoder",
        hint=f"check that {folder} is an HF T5 v1.1 encoder matching its {CONFIG_FILE}",
    )


# ---- tokenizer ------------------------------------------------------------------------------------
class MagiTokenizer:
    """HF ``T5Tokenizer(padding='max_length', truncation=True)`` semantics from a local folder.

    Reads ``tokenizer.json`` (preferred, as AutoTokenizer) or ``spiece.model``. Prompts must already be
    cleaned (`engine.families.magi.clean_caption.clean_prompt`).
    """

    def __init__(self, folder: str | Path, max_length: int = DEFAULT_MAX_LENGTH) -> None:
        if max_length < 1:
            raise UserError(f"tokenizer max_length must be >= 1 (room for EOS), got {max_length}")
        self.folder = Path(folder)
        self.max_length = max_length
        self._backend = load_tokenizer_backend(self.folder, release="DeepFloyd/t5-v1_1-xxl")

    @property
    def eos_id(self) -> int:
        return self._backend.eos_id

    @property
    def pad_id(self) -> int:
        return self._backend.pad_id

    def encode(self, text: str) -> tuple[Tensor, Tensor]:
        """``(ids [1, max_length], mask [1, max_length])`` int64: tokens + EOS, right-padded.

        Like HF, the tokens are cut to ``max_length - 1`` first, so EOS is always the last real token.
        """
        tokens = [*self._backend.encode(text)[: self.max_length - 1], self._backend.eos_id]
        ids = torch.full((1, self.max_length), self._backend.pad_id, dtype=torch.int64)
        mask = torch.zeros((1, self.max_length), dtype=torch.int64)
        ids[0, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
        mask[0, : len(tokens)] = 1
        return ids, mask
