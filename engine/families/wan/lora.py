"""LoRA adapters merged into a DiT's weights at load: W' = W + (alpha / rank) * B @ A.

LongLive 1.0 ships its generator as a base checkpoint plus a LoRA adapter saved by peft
(`get_peft_model_state_dict` of the PEFT-wrapped `CausalWanModel`, optionally under a
`generator_lora` key): `base_model.model.<module>.lora_A.weight` [rank, in] and `...lora_B.weight`
[out, rank] for every `nn.Linear` of the attention blocks. Merging once at load gives exactly the
function peft computes (base(x) + B(A(x)) * alpha / rank, dropout off at inference) with no extra
matmul per call, and the merged DiT is an ordinary one: quantization, compile, batching and
pods need nothing of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from inferix.errors import UserError

# `<module>.lora_A.weight` / `.lora_B.weight`, with peft's wrapper prefix and adapter name optional.
_LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?P<module>.+)\.lora_(?P<side>[AB])(?:\.[^.]+)?\.weight$")
_WRAPPER_KEY = "generator_lora"  # LongLive's training checkpoints keep the adapter under this key


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter file and how it was trained (LongLive: rank 256, alpha 256)."""

    path: Path
    rank: int
    alpha: float

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def lora_pairs(content: Mapping[str, object], adapter: LoraAdapter) -> dict[str, tuple[Tensor, Tensor]]:
    """The (A, B) per target module of an adapter file's content, checked against the adapter's
    rank; a one-line `UserError` naming the file for anything else."""
    inner = content.get(_WRAPPER_KEY, content)
    state = {k: v for k, v in inner.items() if isinstance(v, Tensor)} if isinstance(inner, Mapping) else {}
    if not state or len(state) != len(inner):  # type: ignore[arg-type]
        raise UserError(f"{adapter.path}: not a LoRA adapter (expected a dict of '<module>.lora_A.weight' tensors)")
    sides: dict[str, dict[str, Tensor]] = {}
    for key, tensor in state.items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise UserError(
                f"{adapter.path}: '{key}' is not a LoRA weight (expected '<module>.lora_A.weight' / 'lora_B')"
            )
        sides.setdefault(match["module"], {})[match["side"]] = tensor
    pairs: dict[str, tuple[Tensor, Tensor]] = {}
    for module, found in sorted(sides.items()):
        if set(found) != {"A", "B"}:
            raise UserError(
                f"{adapter.path}: module '{module}' has lora_{''.join(found)} only; it needs lora_A and lora_B"
            )
        a, b = found["A"], found["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != adapter.rank or b.shape[1] != adapter.rank:
            raise UserError(
                f"{adapter.path}: module '{module}' has lora_A {list(a.shape)} and lora_B {list(b.shape)}, not "
                f"rank {adapter.rank} ([{adapter.rank}, in] and [out, {adapter.rank}]); check files.lora_rank"
            )
        pairs[module] = (a, b)
    return pairs


def merge_lora(state: dict[str, Tensor], content: Mapping[str, object], adapter: LoraAdapter) -> dict[str, Tensor]:
    """`state` with the adapter (`content`: its file's) merged into the weights it targets (in
    float32, stored back in each weight's dtype); every target must exist with the matching shape."""
    merged = dict(state)
    for module, (a, b) in lora_pairs(content, adapter).items():
        name = f"{module}.weight"
        weight = state.get(name)
        if weight is None:
            raise UserError(
                f"{adapter.path}: the adapter targets '{module}', which the DiT has no weight of; "
                "is it an adapter for another model?"
            )
        if tuple(weight.shape) != (b.shape[0], a.shape[1]):
            raise UserError(
                f"{adapter.path}: module '{module}' is {list(weight.shape)} in the DiT but the adapter's B @ A is "
                f"[{b.shape[0]}, {a.shape[1]}]; is it an adapter for another model size?"
            )
        delta = b.to(torch.float32) @ a.to(torch.float32)
        merged[name] = (weight.to(torch.float32) + adapter.scale * delta).to(weight.dtype)
    return merged
