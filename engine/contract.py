"""The engine contract: what every model family's engine and session provide, and what they make.

Callers (`inferix generate`, the worker service, the benches) hold an `Engine` and its `Session`s and
never ask which family they are: a family that cannot do something says so in its `Capabilities`,
and `EngineBase` / `SessionTail` turn the request into one clear error. `engine.registry` finds the
family of a model and builds its engine.

A session is opened from a `SessionRequest`: a prompt (text models) or a start image (image-to-world
models), a size, a seed, a length and optional actions. It yields `VideoBlock`s: clean latents (what
the mesh commits, `CommittedBlock`) and uint8 frames (what the streamer shows). A session restores
from committed blocks, switches prompt or holds an action from the next block, and parks its KV
pages on the host (offload / prefetch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from engine.batching import BlockBatcher, ForwardStats
from engine.capabilities import Capabilities, EngineRequest, check
from engine.compiled import CompileOptions, WarmUp
from engine.kv.pool import KVPool
from engine.kv.session_cache import SessionUsage
from engine.snapshot import SessionSnapshot
from inferix.errors import UserError
from inferix.spec.action_schema import ActionSchema
from inferix.spec.actions import ActionTrack, HeldAction
from inferix.spec.blocks import CommittedBlock

__all__ = [
    "Engine",
    "EngineBase",
    "ImageInput",
    "Session",
    "SessionRequest",
    "VideoBlock",
    "committed_latents",
    "to_uint8_frames",
]

# A start image: uint8 [H, W, 3] RGB, the path of a PNG / JPEG, or its bytes (as the mesh sends it).
ImageInput = np.ndarray | str | Path | bytes


@dataclass
class VideoBlock:
    index: int
    start_frame: int  # latent-frame index of latents[:, 0]
    first_frame: int  # pixel-frame index of frames[0] in the whole video
    latents: Tensor  # [1, F, C, h, w] float32 on the CPU
    frames: np.ndarray  # uint8 [T, H, W, 3]
    prompt: str
    denoise_s: float
    context_s: float
    decode_s: float
    carry: Tensor | None = None  # MAGI-1: the in-flight window [1, F, C, h, w] after this chunk
    recached: bool = False  # its prompt switch re-encoded the KV cache before it (a replay re-runs that)

    @property
    def total_s(self) -> float:
        return self.denoise_s + self.context_s + self.decode_s

    def committed(self) -> CommittedBlock:
        """What the mesh stores of this block, for recovery by recompute."""
        latents = self.latents[0].contiguous().numpy().astype("<f4")
        carry = None if self.carry is None else self.carry[0].contiguous().numpy().astype("<f4")
        return CommittedBlock(
            self.index,
            self.start_frame,
            tuple(latents.shape),
            latents.tobytes(),
            self.prompt,
            () if carry is None else tuple(carry.shape),
            b"" if carry is None else carry.tobytes(),
            recached=self.recached,
        )


@dataclass(frozen=True)
class SessionRequest:
    """What a session is made from. `prompt` for a model that starts from text, `image` for one that
    starts from an image (`Capabilities.starts_from`); None sizes: the model's own."""

    prompt: str | None = None
    image: ImageInput | None = None
    width: int | None = None
    height: int | None = None
    seed: int = 0
    num_blocks: int | None = None
    session_id: str | None = None
    actions: ActionTrack | None = None


class Session(Protocol):
    """One session of any family (`SessionTail` implements the common part). `prompt_text`: the
    prompt its next block is made with ("" for a model steered by actions only)."""

    width: int
    height: int
    prompt_text: str

    @property
    def schema(self) -> ActionSchema | None: ...

    @property
    def session_id(self) -> str: ...

    @property
    def next_block_index(self) -> int: ...

    @property
    def finished(self) -> bool: ...

    def next_block(self) -> VideoBlock: ...

    def block_job(self) -> Any: ...

    def restore(self, committed: Sequence[CommittedBlock], *, from_start: bool = True) -> list[int]: ...

    def snapshot(self) -> SessionSnapshot: ...

    def load_snapshot(self, snapshot: SessionSnapshot) -> None: ...

    def set_prompt(self, text: str, recache: bool = False) -> None: ...

    def hold(self, action: HeldAction) -> None: ...

    def offload(self) -> None: ...

    def prefetch(self) -> None: ...

    def kv_usage(self) -> SessionUsage: ...

    def new_redecode_state(self) -> Any: ...

    def redecode_state_at(self, snapshot: SessionSnapshot) -> Any: ...

    def redecode(self, block: CommittedBlock, state: Any) -> np.ndarray: ...

    def close(self) -> None: ...

    def __iter__(self) -> Iterator[VideoBlock]: ...

    def __enter__(self) -> Session: ...

    def __exit__(self, *exc: object) -> None: ...


class Engine(Protocol):
    """A loaded model of any family: opens sessions, batches their blocks, compiles where it can."""

    capabilities: ClassVar[Capabilities]

    @property
    def model(self) -> Any: ...

    @property
    def pool(self) -> KVPool | None: ...

    @property
    def action_schema(self) -> ActionSchema | None: ...

    def open_session(self, request: SessionRequest) -> Session: ...

    def batcher(
        self, max_tokens: int | None = None, on_forward: Callable[[ForwardStats], None] | None = None
    ) -> BlockBatcher: ...

    def compile(
        self,
        *,
        width: int | None = None,
        height: int | None = None,
        num_blocks: int | None = None,
        options: CompileOptions | None = None,
    ) -> WarmUp: ...

    def use_cuda_graphs(
        self, *, width: int | None = None, height: int | None = None, num_blocks: int | None = None
    ) -> WarmUp: ...


class EngineBase:
    """The part of the contract every family's engine shares: checking a request against the
    family's capabilities, and refusing what the family cannot do, in one place."""

    capabilities: ClassVar[Capabilities]
    model: Any  # the family's loaded weights; every one has a `name`

    @property
    def action_schema(self) -> ActionSchema | None:
        """What the model's player sends (None: a model steered by text only)."""
        return None

    def open_session(self, request: SessionRequest) -> Session:
        """A session of `request`; a prompt where the model starts from an image, or the reverse, is
        refused with what the model needs."""
        if self.capabilities.starts_from == "image":
            if request.image is None:
                raise UserError(f"{self.model.name} is image-to-world: it needs a start image (--image)")
        elif not request.prompt:
            raise UserError(f"{self.model.name} starts from a text prompt: pass one (--prompt)")
        return self._open(request)

    def _open(self, request: SessionRequest) -> Session:
        raise NotImplementedError

    def compile(
        self,
        *,
        width: int | None = None,
        height: int | None = None,
        num_blocks: int | None = None,
        options: CompileOptions | None = None,
    ) -> WarmUp:
        """Refused here; a family whose capabilities say it compiles overrides this."""
        check(self.capabilities, EngineRequest(compile=True))
        raise NotImplementedError(f"{self.capabilities.name} says it compiles but does not override compile()")

    def use_cuda_graphs(
        self, *, width: int | None = None, height: int | None = None, num_blocks: int | None = None
    ) -> WarmUp:
        """Refused here; a family whose capabilities say it replays CUDA graphs overrides this."""
        check(self.capabilities, EngineRequest(cuda_graphs=True))
        raise NotImplementedError(f"{self.capabilities.name} says it compiles but does not override use_cuda_graphs()")


def committed_latents(block: CommittedBlock) -> Tensor:
    """A committed block's clean latents as the engine holds them: [1, frames, channels, h, w] float32."""
    array = np.frombuffer(block.latents, dtype="<f4").reshape(block.shape)
    return torch.from_numpy(array.copy()).unsqueeze(0)


def to_uint8_frames(video: Tensor) -> np.ndarray:
    """VAE output [1, T, 3, H, W] in [-1, 1] -> uint8 [T, H, W, 3] (x*0.5+0.5, rounded)."""
    unit = (video[0].float() * 0.5 + 0.5).clamp(0, 1)
    return (unit * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu().numpy()
