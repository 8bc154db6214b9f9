"""Prompt cleaning and tokenization for the UMT5 text encoder, without the ``transformers`` package.

Wan2.1 tokenizes with ``AutoTokenizer.from_pretrained('google/umt5-xxl')`` after a "whitespace"
clean, pads and truncates to ``text_len`` and appends EOS. We reproduce that from the files of a
local tokenizer directory: ``tokenizer.json`` through the ``tokenizers`` library (the fast tokenizer
that AutoTokenizer picks), else ``spiece.model`` through ``sentencepiece``.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import ftfy
import sentencepiece
import torch
from tokenizers import Tokenizer
from torch import Tensor

from inferix.errors import UserError

__all__ = ["PromptTokenizer", "TokenizerBackend", "clean_prompt", "load_tokenizer_backend"]

logger = logging.getLogger(__name__)

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "spiece.model"
# T5-family special tokens, as named in google/umt5-xxl's tokenizer.json.
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"

# Unicode White_Space, i.e. what the reference's ``regex`` module matches with \s. Python's re also
# counts the separators U+001C..U+001F as whitespace; excluding them keeps the cleaning identical.
_WHITESPACE_RUN = re.compile(r"[^\S\x1c-\x1f]+")


def clean_prompt(text: str) -> str:
    """Normalise a prompt like the reference tokenizer's ``clean='whitespace'`` mode.

    Fixes mojibake and odd Unicode (ftfy), decodes HTML entities twice (prompts scraped from the web
    are often double-escaped: ``&amp;amp;``), then collapses whitespace runs to one space and strips.
    The DiT was trained on prompts cleaned this way, so skipping it changes the conditioning.
    """
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return _WHITESPACE_RUN.sub(" ", text).strip()


class TokenizerBackend(Protocol):
    """What PromptTokenizer needs from a tokenizer library: plain ids and the two special ids."""

    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special tokens."""
        ...


class _HuggingFaceJsonBackend:
    """A ``tokenizer.json`` (HF fast tokenizer) read with the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for unreadable/invalid files
            raise UserError(f"cannot read tokenizer file {path}: {exc}") from exc
        # Length handling is ours (EOS + pad/truncate to text_len); settings stored in the file must
        # not truncate or pad first.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.eos_id = _required_id(self._tokenizer.token_to_id(EOS_TOKEN), EOS_TOKEN, path)
        self.pad_id = _required_id(self._tokenizer.token_to_id(PAD_TOKEN), PAD_TOKEN, path)
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        # add_special_tokens=False skips the file's post-processor, which would append its own EOS.
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


class _SentencePieceBackend:
    """A ``spiece.model`` read with ``sentencepiece`` (the slow T5 tokenizer's source of truth)."""

    def __init__(self, path: Path) -> None:
        try:
            self._processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError depending on the failure
            raise UserError(f"cannot read sentencepiece model {path}: {exc}") from exc
        self.eos_id = _required_id(self._processor.eos_id(), EOS_TOKEN, path)
        self.pad_id = _required_id(self._processor.pad_id(), PAD_TOKEN, path)
        self.vocab_size = self._processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return list(self._processor.encode(text, out_type=int))


def _required_id(token_id: int | None, token: str, path: Path) -> int:
    """Special-token id, or a UserError: without EOS/pad the encoder input cannot be built."""
    if token_id is None or token_id < 0:
        raise UserError(f"tokenizer {path} has no {token} token; a T5/umt5 tokenizer is required")
    return token_id


def load_tokenizer_backend(tokenizer_dir: Path, release: str = "google/umt5-xxl") -> TokenizerBackend:
    """The T5-family tokenizer of a local folder: ``tokenizer.json`` (preferred, as AutoTokenizer picks
    the fast one) or ``spiece.model``; `release` names where to get the files in errors."""
    if not tokenizer_dir.is_dir():
        raise UserError(
            f"tokenizer directory {tokenizer_dir} does not exist or is not a directory; point it at a "
            f"local copy of the tokenizer of {release} (containing {TOKENIZER_JSON} or {SENTENCEPIECE_MODEL})"
        )
    if (tokenizer_dir / TOKENIZER_JSON).is_file():
        return _HuggingFaceJsonBackend(tokenizer_dir / TOKENIZER_JSON)
    if (tokenizer_dir / SENTENCEPIECE_MODEL).is_file():
        return _SentencePieceBackend(tokenizer_dir / SENTENCEPIECE_MODEL)
    raise UserError(
        f"tokenizer directory {tokenizer_dir} contains neither {TOKENIZER_JSON} nor "
        f"{SENTENCEPIECE_MODEL}; download the tokenizer files of {release} into it"
    )


class PromptTokenizer:
    """Cleans prompts and turns them into fixed-length ``(ids, mask)`` batches for the UMT5 encoder.

    Every prompt becomes its tokens + EOS, truncated to ``text_len`` (EOS is kept as the last token)
    and right-padded with the pad id; ``mask`` is 1 on tokens and EOS, 0 on padding.
    """

    def __init__(self, tokenizer_dir: str | Path, text_len: int = 512) -> None:
        if text_len < 1:
            raise UserError(f"text_len must be >= 1 (room for EOS), got {text_len}")
        self.tokenizer_dir = Path(tokenizer_dir)
        self.text_len = text_len
        self._backend = load_tokenizer_backend(self.tokenizer_dir)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can emit; the encoder's embedding must be at least this big."""
        return self._backend.vocab_size

    def __call__(self, prompts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Tokenize a batch: ``ids [B, text_len]`` and ``mask [B, text_len]``, both int64 on the CPU."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of strings, not a single string")
        if not prompts:
            raise UserError("no prompts given; pass at least one prompt")
        ids = torch.full((len(prompts), self.text_len), self._backend.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(prompts), self.text_len), dtype=torch.int64)
        for row, prompt in enumerate(prompts):
            tokens = self._tokens(prompt)
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            mask[row, : len(tokens)] = 1
        return ids, mask

    def _tokens(self, prompt: str) -> list[int]:
        """Token ids + EOS of one prompt, at most ``text_len`` long."""
        cleaned = clean_prompt(prompt)
        if not cleaned:
            raise UserError(f"prompt {prompt!r} is empty after whitespace cleaning; describe the scene")
        tokens = self._backend.encode(cleaned)
        if len(tokens) >= self.text_len:
            logger.warning(
                "prompt truncated from %d to %d tokens (text_len %d includes EOS): %.60r...",
                len(tokens),
                self.text_len - 1,
                self.text_len,
                cleaned,
            )
            tokens = tokens[: self.text_len - 1]
        return [*tokens, self._backend.eos_id]
