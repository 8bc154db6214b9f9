"""What each model family can do, as data, and the one place that refuses what it cannot.

Every front door (`inferix generate`, `python -m workers`, the worker service, `load_engine`) states
what the user asked of the engine as an `EngineRequest` and calls `check`: a family that cannot do
it gives the user one line saying which option, which family, and what to do instead. A new family
declares its `Capabilities`; no caller writes its own refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from inferix.errors import UserError

__all__ = ["MAGI", "MATRIXGAME", "WAN", "Capabilities", "EngineRequest", "check", "refusal"]


@dataclass(frozen=True)
class Capabilities:
    """A family's abilities. `name` is how errors call it."""

    name: str
    starts_from: Literal["prompt", "image"]
    quantize: bool  # --quant: 8-bit DiT linears
    kv_dtypes: tuple[str, ...]  # --kv-dtype values
    decoders: tuple[str, ...]  # --decoder kinds: "vae" (its own), "taehv"
    pods: bool  # sequence-parallel worker pods (torchrun)
    compiles: bool  # --compile and --cuda-graphs of its DiT step
    batching: bool  # its sessions' DiT calls share batched forwards on a worker
    snapshots: bool  # exact KV snapshots of a session (`engine.snapshot`): recovery replays at most N blocks


WAN = Capabilities(
    name="Self Forcing / CausVid / LongLive (Wan)",
    starts_from="prompt",
    quantize=True,
    kv_dtypes=("auto", "fp8", "int8"),
    decoders=("vae", "taehv"),
    pods=True,
    compiles=True,
    batching=True,
    snapshots=True,
)
MAGI = Capabilities(
    name="MAGI-1",
    starts_from="prompt",
    quantize=False,
    kv_dtypes=("auto",),
    decoders=("vae",),
    pods=False,
    compiles=False,
    batching=False,
    snapshots=False,
)
# MAGI-1's abilities, started from an image instead of text.
# Its VAE is the Wan 2.1 VAE, so taew2_1 decodes its latents too (MAGI-1's own latents are not Wan's).
MATRIXGAME = replace(MAGI, name="Matrix-Game 2.0", starts_from="image", decoders=("vae", "taehv"))


@dataclass(frozen=True)
class EngineRequest:
    """What a user asked of an engine, by option."""

    quant: str | None = None
    kv_dtype: str = "auto"
    decoder: str | None = None
    pod: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    snapshots: bool = False  # a worker asked to ship KV snapshots (--snapshot-every N > 0)


def refusal(caps: Capabilities, request: EngineRequest) -> str | None:
    """Why `caps` cannot serve `request` (the first reason), or None."""
    name = caps.name
    if request.quant not in (None, "none") and not caps.quantize:
        return f"--quant {request.quant}: {name} runs unquantized for now (Wan-family models quantize)"
    if request.kv_dtype not in caps.kv_dtypes:
        return f"--kv-dtype {request.kv_dtype}: --kv-dtype is not supported for {name} yet; leave it at 'auto'"
    kind = (request.decoder or "vae").split(":", 1)[0]
    if kind not in caps.decoders:
        return f"--decoder {request.decoder}: {name} decodes with its own VAE for now; leave --decoder out"
    if request.pod and not caps.pods:
        return f"{name} does not run as a sequence-parallel pod yet: start the worker on one device"
    if request.compile and request.cuda_graphs:
        return "--cuda-graphs: Wan-family models without --compile (choose one of the two)"
    for flag, asked in (("--compile", request.compile), ("--cuda-graphs", request.cuda_graphs)):
        if asked and not caps.compiles:
            return f"{flag}: {name} runs eagerly (Wan-family models compile and replay CUDA graphs)"
        if asked and request.pod:
            return f"{flag}: a sequence-parallel pod runs its DiT eagerly; start it without {flag}"
    if request.snapshots and not caps.snapshots:
        return f"--snapshot-every: {name} has no KV snapshots yet (it recovers by replay); use --snapshot-every 0"
    if request.snapshots and request.pod:
        return "--snapshot-every: a sequence-parallel pod recovers by replay, not snapshots; use --snapshot-every 0"
    if request.pod and request.kv_dtype != "auto":
        return f"--kv-dtype {request.kv_dtype}: a sequence-parallel pod keeps its KV cache in the model's dtype"
    return None


def check(caps: Capabilities, request: EngineRequest) -> None:
    """Raise a one-line `UserError` if `caps` cannot serve `request`."""
    reason = refusal(caps, request)
    if reason is not None:
        raise UserError(reason)
