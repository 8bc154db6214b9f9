"""Reading checkpoint files and loading them into modules, once, in the dtype and on the device asked for.

Every model of the engine (causal Wan DiT, Wan VAE, UMT5 text encoder) loads through `load_into`:
the module is built with its parameters on the meta device (no random init, no memory), the
checkpoint is checked against it (missing / unexpected keys, shapes: the error names the file and
the keys), and the checkpoint tensors themselves become the parameters (`assign=True`). A tensor
already in the right dtype and on the right device is used as is, without a copy; torch files are
memory-mapped, so such weights are read lazily from the page cache instead of being copied into
process memory. A tensor that needs converting is converted one at a time and its source dropped
right away, so a checkpoint is never held twice.

DiT checkpoint layouts understood by `load_dit`:

* Self Forcing: ``{"generator_ema": {"model.<name>": t}, "generator": {...}}`` (EMA by default,
  as the Self Forcing README runs ``inference.py --use_ema``);
* CausVid: ``{"generator": {"model.<name>": t}}`` (``model.`` is the ``WanDiffusionWrapper.model``
  attribute that both repositories wrap the DiT in);
* a flat state dict (``.safetensors``, ``.pth``, ``.pt``, ``.bin``) with our names;
* a Wan model folder: ``config.json`` + ``diffusion_pytorch_model.safetensors`` (or shards listed in
  ``diffusion_pytorch_model.safetensors.index.json``), with the original Wan-AI names (ours) or the
  HF diffusers ``WanTransformer3DModel`` names, which are renamed to ours (`from_diffusers_names`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from inferix.errors import CheckpointError, UserError

__all__ = [
    "DTYPES",
    "StateDict",
    "as_state_dict",
    "load_into",
    "parse_dtype",
    "read_checkpoint",
    "read_sharded",
    "read_state_dict",
    "seeded_state_dict",
]

StateDict = dict[str, Tensor]
ModuleT = TypeVar("ModuleT", bound=nn.Module)

SAFETENSORS_SUFFIX = ".safetensors"
TORCH_SUFFIXES = (".pth", ".pt", ".bin")
# How many key names an error message lists before it says "and N more".
MAX_LISTED_KEYS = 8

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def parse_dtype(value: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its command-line spelling (fp32 / bf16 / fp16 or the torch names)."""
    if isinstance(value, torch.dtype):
        if value not in DTYPES.values():
            raise UserError(f"unsupported weight dtype {value}; use one of fp32, bf16, fp16")
        return value
    try:
        return DTYPES[value.lower()]
    except KeyError:
        raise UserError(f"unknown dtype {value!r}; use one of {', '.join(DTYPES)}") from None


# ---- reading files ------------------------------------------------------------------------------
def read_checkpoint(path: str | Path, what: str = "checkpoint", hint: str = "") -> dict[str, Any]:
    """The top-level dict of a ``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin`` file, on the CPU.

    Torch files are read with ``weights_only=True`` (a checkpoint cannot run code) and memory-mapped
    when their format allows it. ``what`` names the file's role in messages ("VAE checkpoint"),
    ``hint`` says what the file should be.
    """
    path = Path(path)
    suffix = f" {hint}" if hint else ""
    if not path.exists():
        raise CheckpointError(f"{what} {path} does not exist.{suffix}")
    if path.is_dir():
        raise CheckpointError(
            f"{what} {path} is a directory; expected a checkpoint file "
            f"({SAFETENSORS_SUFFIX} or {' / '.join(TORCH_SUFFIXES)}).{suffix}"
        )
    if path.suffix not in (SAFETENSORS_SUFFIX, *TORCH_SUFFIXES):
        raise CheckpointError(
            f"{what} {path}: unsupported file type {path.suffix!r}; expected "
            f"{SAFETENSORS_SUFFIX} or {' / '.join(TORCH_SUFFIXES)}"
        )
    try:
        content: object = load_file(str(path)) if path.suffix == SAFETENSORS_SUFFIX else _torch_load(path)
    except Exception as exc:  # the loaders raise many unrelated types for a truncated or corrupt file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot read {what} {path}: the file is truncated, corrupt or not a "
            f"{'safetensors' if path.suffix == SAFETENSORS_SUFFIX else 'torch'} checkpoint ({first_line}); "
            "download it again"
        ) from exc
    if not isinstance(content, dict):
        raise CheckpointError(f"{what} {path} holds a {type(content).__name__}, not a dict of tensors")
    return content


def _torch_load(path: Path) -> object:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):
            raise
        # Files in the legacy (pre-zip) torch format cannot be mapped; read them into memory instead.
        return torch.load(path, map_location="cpu", weights_only=True)


def as_state_dict(content: Mapping[str, object], source: str | Path) -> StateDict:
    """``content`` as a flat name -> tensor dict, or an error naming ``source`` and the offending keys."""
    if not content:
        raise CheckpointError(f"{source} holds no tensors (an empty dict); expected a flat state dict of tensors")
    bad = [f"{key!r} ({type(value).__name__})" for key, value in content.items() if not isinstance(value, Tensor)]
    if bad:
        raise CheckpointError(
            f"{source} is not a flat state dict of tensors (name -> tensor): {_listed(bad)} hold something else"
        )
    return dict(content)  # type: ignore[arg-type]  # every value was checked above


def read_state_dict(path: str | Path, what: str = "checkpoint", hint: str = "") -> StateDict:
    """A flat name -> tensor dict from a checkpoint file (see `read_checkpoint`)."""
    return as_state_dict(read_checkpoint(path, what, hint), path)


# ---- loading into a module ----------------------------------------------------------------------
_meta_state = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_original_register_parameter = nn.Module.register_parameter


def _register_parameter(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
    _original_register_parameter(self, name, param)
    if param is not None and getattr(_meta_state, "active", False):
        self._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built in this thread inside the block get their parameters on the meta device.

    Unlike ``with torch.device("meta")``, tensors that are not parameters (the DiT's RoPE table,
    buffers) are still created for real: they are not in any checkpoint. Other threads are unaffected.
    """
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            nn.Module.register_parameter = _register_parameter  # type: ignore[method-assign]
        _patch_users += 1
    previous = getattr(_meta_state, "active", False)
    _meta_state.active = True
    try:
        yield
    finally:
        _meta_state.active = previous
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                nn.Module.register_parameter = _original_register_parameter  # type: ignore[method-assign]


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED_KEYS])
    more = len(items) - MAX_LISTED_KEYS
    return f"[{shown}]" + (f" and {more} more" if more > 0 else "")


def _check_against(
    expected: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str | Path, what: str, hint: str
) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    suffix = f"; {hint}" if hint else ""
    if missing or unexpected:
        detail = ""
        if state and not set(state) & set(expected):
            detail = (
                f" (no name matches at all: the checkpoint has e.g. {sorted(state)[0]!r}, the model expects "
                f"e.g. {sorted(expected)[0]!r})"
            )
        raise CheckpointError(
            f"{source} does not match the {what}: missing keys {_listed([repr(k) for k in missing])}, "
            f"unexpected keys {_listed([repr(k) for k in unexpected])}{detail}{suffix}"
        )
    wrong = [
        f"{name} {tuple(state[name].shape)} != {tuple(ref.shape)}"
        for name, ref in expected.items()
        if state[name].shape != ref.shape
    ]
    if wrong:
        raise CheckpointError(
            f"{source} does not match the {what} (checkpoint vs model shapes): {_listed(wrong)}{suffix}"
        )


def load_into(
    factory: Callable[[], ModuleT],
    state: StateDict,
    source: str | Path,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    what: str = "model",
    hint: str = "",
) -> ModuleT:
    """Build ``factory()`` without initialising it and make the tensors of ``state`` its parameters.

    ``state`` is consumed: its entries are removed as they are converted to ``dtype`` (floating
    tensors only; None keeps the stored dtype) and moved to ``device``, so that the source of a
    converted tensor can be freed at once. Keys and shapes are checked first; errors name ``source``
    (the file), the keys and ``hint`` (what to check). Returns the module in eval mode, without grads.
    """
    with _parameters_on_meta():
        module = factory()
    expected = module.state_dict()
    _check_against(expected, state, source, what, hint)
    converted: StateDict = {}
    for name in list(state):
        tensor = state.pop(name)
        target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        converted[name] = tensor.to(device=device, dtype=target)
    module.load_state_dict(converted, strict=True, assign=True)
    return module.eval().requires_grad_(False)


def seeded_state_dict(factory: Callable[[], nn.Module], seed: int) -> StateDict:
    """Deterministic random values for every state-dict entry of ``factory()``, for built-in test models.

    Drawn from one seeded generator in sorted-name order, independently of the modules' own init
    code, so the same seed gives the same weights on every machine: matrices and kernels
    ``N(0, 1/fan_in)``, norm scales (1-D ``weight``, ``gamma``) one, biases zero.
    """
    with _parameters_on_meta():
        reference = factory().state_dict()
    generator = torch.Generator().manual_seed(seed)
    state: StateDict = {}
    for name in sorted(reference):
        shape = reference[name].shape
        if name.endswith("bias"):
            state[name] = torch.zeros(shape)
        elif name.endswith("gamma") or len(shape) == 1:
            state[name] = torch.ones(shape)
        else:
            fan_in = reference[name].numel() // shape[0]
            state[name] = torch.randn(shape, generator=generator) * fan_in**-0.5
    return state


def read_sharded(index_path: Path, what: str = "shard") -> StateDict:
    """Every tensor of the shards an HF ``*.index.json`` lists, checked against its weight map."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"cannot read the shard index {index_path}: {exc}") from exc
    state: StateDict = {}
    for shard in shards:
        state.update(read_state_dict(index_path.parent / shard, what, f"It is listed in {index_path}."))
    absent = sorted(set(weight_map) - set(state))
    if absent:
        raise CheckpointError(f"{index_path} lists tensors its shards lack: {_listed(absent)}")
    return state
