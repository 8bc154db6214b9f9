"""The caption rows MAGI-1's DiT cross-attends to (``y`` / ``y_masks``), per chunk.

With the released ``PAD_HQ=1 PAD_DURATION=1`` every chunk's caption is the T5 output with two special
rows in front, ``[DURATION_k, HQ, caption[:798]]`` where ``k = min(chunks still to come, 7)``, and the
"null" (unconditional) caption is the DiT's learned ``null_caption_embedding`` with its first 50 rows
valid. Only rows whose mask is 1 reach the cross-attention (`valid_rows`).
"""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from inferix.errors import UserError

__all__ = [
    "CAPTION_ROWS",
    "NULL_CAPTION_VALID_ROWS",
    "SpecialTokens",
    "caption_rows",
    "load_special_tokens",
    "null_rows",
    "valid_rows",
]

# The reference truncates padded captions to a hard-coded 800 rows and stacks them with the 800-row
# null embedding, so T5 must run with caption_max_length = 800.
CAPTION_ROWS = 800
NULL_CAPTION_VALID_ROWS = 50
# Rows of special_tokens.npz "other_tokens": HQ_TOKEN, then DURATION_TOKEN_1..8 (1..8 chunks to come,
# the last meaning "8 or more").
_OTHER_TOKENS = "other_tokens"
_HQ_ROW = 1
_FIRST_DURATION_ROW = 7
NUM_DURATIONS = 8


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The special caption rows used with ``PAD_HQ`` and ``PAD_DURATION``, float32 ``[Dc]`` each.

    ``durations[k]`` is prepended to a chunk followed by ``k`` more chunks (``k`` capped at 7).
    """

    hq: Tensor
    durations: Tensor  # [8, Dc]

    @property
    def dim(self) -> int:
        return self.hq.shape[-1]

    def duration(self, chunks_after: int) -> Tensor:
        """The duration row of a chunk followed by ``chunks_after`` chunks."""
        return self.durations[min(chunks_after, NUM_DURATIONS - 1)]


def load_special_tokens(path: str | Path) -> SpecialTokens:
    """Read ``special_tokens.npz`` (the reference's ``example/assets/special_tokens.npz``).

    The reference stores the rows as fp16 (``astype(np.float16)``) before casting them to the caption
    dtype, so they are rounded to fp16 here too: the DiT was run on the rounded values.
    """
    path = Path(path)
    try:
        with np.load(path) as archive:
            arrays = {name: np.asarray(archive[name]) for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise UserError(f"cannot read special tokens file {path} (an .npz archive): {exc}") from exc
    other = arrays.get(_OTHER_TOKENS)
    if other is None:
        raise UserError(f"special tokens file {path} has no {_OTHER_TOKENS!r} array (it has {sorted(arrays)})")
    needed = _FIRST_DURATION_ROW + NUM_DURATIONS
    if other.ndim != 2 or other.shape[0] < needed:
        raise UserError(
            f"special tokens file {path}: {_OTHER_TOKENS} has shape {other.shape}; expected [>= {needed}, caption dim]"
        )
    rows = torch.from_numpy(other.astype(np.float16)).float()
    return SpecialTokens(hq=rows[_HQ_ROW], durations=rows[_FIRST_DURATION_ROW : _FIRST_DURATION_ROW + NUM_DURATIONS])


def caption_rows(
    caption_embs: Tensor, mask: Tensor, chunk: int, chunk_num: int, special: SpecialTokens
) -> tuple[Tensor, Tensor]:
    """Caption rows ``[800, Dc]`` and their float mask ``[800]`` of chunk ``chunk`` (0-based) of ``chunk_num``.

    ``caption_embs [800, Dc]`` is the T5 output (padding rows included), ``mask [800]`` its attention
    mask. The reference prepends HQ, then the duration row in front of it, and cuts back to 800 rows.
    """
    if caption_embs.ndim != 2 or caption_embs.shape[0] != CAPTION_ROWS or mask.shape != caption_embs.shape[:1]:
        raise UserError(
            f"caption rows need T5 output [{CAPTION_ROWS}, D] and mask [{CAPTION_ROWS}] (caption_max_length must be "
            f"{CAPTION_ROWS}); got {tuple(caption_embs.shape)} and {tuple(mask.shape)}"
        )
    if caption_embs.shape[1] != special.dim:
        raise UserError(f"caption dim {caption_embs.shape[1]} differs from the special tokens' dim {special.dim}")
    if not 0 <= chunk < chunk_num:
        raise ValueError(f"chunk {chunk} is outside 0..{chunk_num - 1}")
    prefix = torch.stack([special.duration(chunk_num - 1 - chunk), special.hq]).to(caption_embs)
    rows = torch.cat([prefix, caption_embs[: CAPTION_ROWS - 2]])
    row_mask = torch.cat([torch.ones(2, dtype=rows.dtype, device=rows.device), mask[: CAPTION_ROWS - 2].to(rows)])
    return rows, row_mask


def null_rows(null_caption_embedding: Tensor) -> tuple[Tensor, Tensor]:
    """The unconditional caption: ``null_caption_embedding [800, Dc]`` and a mask with its first 50 rows valid."""
    if null_caption_embedding.ndim != 2 or null_caption_embedding.shape[0] != CAPTION_ROWS:
        raise UserError(
            f"null_caption_embedding must be [{CAPTION_ROWS}, D], got {tuple(null_caption_embedding.shape)}"
        )
    mask = torch.zeros(CAPTION_ROWS, dtype=null_caption_embedding.dtype, device=null_caption_embedding.device)
    mask[:NULL_CAPTION_VALID_ROWS] = 1
    return null_caption_embedding, mask


def valid_rows(rows: Tensor, mask: Tensor) -> Tensor:
    """The rows whose mask is set, in order ``[n_valid, Dc]``: the cross-attention keys of a chunk."""
    if mask.shape != rows.shape[:1]:
        raise ValueError(f"mask {tuple(mask.shape)} does not match rows {tuple(rows.shape)}")
    return rows[mask.bool()]
