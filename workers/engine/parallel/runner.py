"""A pod: every rank holds the same pipeline; rank 0 drives, the other ranks follow in lockstep.

Rank 0 (where the worker service runs) turns each request into a `Command`, broadcasts it on a
small gloo control group, then executes it itself; every other rank sits in `follow`, receives
the same command and executes it too. Commands are deterministic (all randomness derives from
(seed, block, step)), so all ranks reach the same collectives in the same order with the same
shapes; only tensors of the block, never per-rank decisions, differ between them.

Everything after the DiT is rank 0's alone: finished blocks go to the `BlockSink` given to
`PodDriver` (the streaming VAE decode and the hand-off to the streamer), never to the followers.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from inferix.errors import InferixError
from workers.engine.models.wan.vae import VAEDecodeState, WanVAE
from workers.engine.pipeline import BlockDiffusionPipeline, BlockOutput, CommittedBlock, GenerationSession

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenSession:
    session_id: str
    prompt_embeds: Tensor
    latent_height: int
    latent_width: int
    seed: int
    num_blocks: int | None = None


@dataclass(frozen=True)
class SetPrompt:
    session_id: str
    prompt_embeds: Tensor
    recache: bool = False


@dataclass(frozen=True)
class GenerateBlock:
    session_id: str


@dataclass(frozen=True)
class Replay:
    """Recovery by recompute: rebuild a session's (sharded) KV cache from its committed blocks."""

    session_id: str
    blocks: list[CommittedBlock]
    next_block: int | None = None


@dataclass(frozen=True)
class CloseSession:
    session_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = OpenSession | SetPrompt | GenerateBlock | Replay | CloseSession | Shutdown
BlockSink = Callable[[str, BlockOutput], None]


class ControlChannel:
    """Rank 0 -> every rank: commands as pickled objects on a CPU (gloo) group.

    Commands are small (a prompt's embeddings at most); a separate gloo group keeps them off the
    NCCL stream and works before any GPU tensor exists.
    """

    def __init__(self) -> None:
        self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        self.is_driver = dist.get_rank() == 0

    def send(self, command: Command) -> None:
        if not self.is_driver:
            raise RuntimeError("only rank 0 sends pod commands")
        dist.broadcast_object_list([_to_cpu(command)], src=0, group=self.group)

    def receive(self) -> Command:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        command = box[0]
        if not isinstance(command, OpenSession | SetPrompt | GenerateBlock | Replay | CloseSession | Shutdown):
            raise RuntimeError(f"pod control channel carried {type(command).__name__}, not a command")
        return command


def _to_cpu(command: Command) -> Command:
    if isinstance(command, OpenSession | SetPrompt):
        return dataclasses.replace(command, prompt_embeds=command.prompt_embeds.cpu())
    if isinstance(command, Replay):
        blocks = [CommittedBlock(b.start_frame, b.latents.cpu(), b.prompt_embeds.cpu()) for b in command.blocks]
        return Replay(command.session_id, blocks, command.next_block)
    return command


class PodEngine:
    """One rank's sessions; `execute` does the same thing on every rank of the pod."""

    def __init__(self, pipeline: BlockDiffusionPipeline) -> None:
        self.pipeline = pipeline
        self.sessions: dict[str, GenerationSession] = {}

    def execute(self, command: Command) -> BlockOutput | None:
        if isinstance(command, OpenSession):
            if command.session_id in self.sessions:
                raise InferixError(f"session {command.session_id!r} is already open on this pod")
            self.sessions[command.session_id] = self.pipeline.open_session(
                command.prompt_embeds.to(self.pipeline.device),
                command.latent_height,
                command.latent_width,
                seed=command.seed,
                num_blocks=command.num_blocks,
                session_id=command.session_id,
            )
        elif isinstance(command, SetPrompt):
            embeds = command.prompt_embeds.to(self.pipeline.device)
            self._session(command.session_id).set_prompt(embeds, command.recache)
        elif isinstance(command, GenerateBlock):
            return self._session(command.session_id).generate_block()
        elif isinstance(command, Replay):
            device = self.pipeline.device
            blocks = [
                CommittedBlock(b.start_frame, b.latents.to(device), b.prompt_embeds.to(device)) for b in command.blocks
            ]
            self._session(command.session_id).replay(blocks, command.next_block)
        elif isinstance(command, CloseSession):
            self._session(command.session_id).close()
            del self.sessions[command.session_id]
        return None

    def _session(self, session_id: str) -> GenerationSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise InferixError(f"unknown session {session_id!r} on this pod") from None


class PodDriver:
    """Rank 0's handle on the pod: the calls the worker service makes."""

    def __init__(self, engine: PodEngine, channel: ControlChannel, sink: BlockSink | None = None) -> None:
        self.engine = engine
        self.channel = channel
        self.sink = sink

    def _run(self, command: Command) -> BlockOutput | None:
        self.channel.send(command)
        return self.engine.execute(command)

    def open_session(
        self,
        session_id: str,
        prompt_embeds: Tensor,
        latent_height: int,
        latent_width: int,
        *,
        seed: int = 0,
        num_blocks: int | None = None,
    ) -> None:
        self._run(OpenSession(session_id, prompt_embeds, latent_height, latent_width, seed, num_blocks))

    def set_prompt(self, session_id: str, prompt_embeds: Tensor, recache: bool = False) -> None:
        self._run(SetPrompt(session_id, prompt_embeds, recache))

    def generate_block(self, session_id: str) -> BlockOutput:
        """Every rank steps this block together; then rank 0 alone hands it to the sink."""
        block = self._run(GenerateBlock(session_id))
        assert block is not None
        if self.sink is not None:
            self.sink(session_id, block)
        return block

    def replay(self, session_id: str, blocks: list[CommittedBlock], next_block: int | None = None) -> None:
        """Rebuild the session's cache on every rank from committed blocks (e.g. after a crash)."""
        self._run(Replay(session_id, blocks, next_block))

    def close_session(self, session_id: str) -> None:
        self._run(CloseSession(session_id))

    def shutdown(self) -> None:
        """Release the followers (they return from `follow`)."""
        self.channel.send(Shutdown())


def follow(engine: PodEngine, channel: ControlChannel) -> None:
    """A follower rank: execute rank 0's commands until it shuts the pod down.

    Errors of ours (`InferixError`: unknown session, KV pool full, ...) are raised on every rank
    alike before any collective, so the follower logs them and keeps serving, as rank 0 does after
    reporting them. Anything else ends the process, and torchrun tears the pod down.
    """
    while True:
        command = channel.receive()
        if isinstance(command, Shutdown):
            return
        try:
            engine.execute(command)
        except InferixError as exc:
            LOG.info("rank %d: %s failed like on rank 0: %s", dist.get_rank(), type(command).__name__, exc)


@dataclass
class VAEDecodeSink:
    """A `BlockSink` that stream-decodes every session's blocks with the Wan VAE (rank 0 only).

    `frames[session_id]` collects the decoded pixel frames [1, T, 3, H, W]; the worker service
    forwards them to the streamer instead.
    """

    vae: WanVAE
    states: dict[str, VAEDecodeState] = field(default_factory=dict)
    frames: dict[str, list[Tensor]] = field(default_factory=dict)

    def __call__(self, session_id: str, block: BlockOutput) -> None:
        state = self.states.setdefault(session_id, self.vae.new_decode_state())
        weight = next(self.vae.parameters())
        video = self.vae.decode_block(block.latents.to(device=weight.device, dtype=weight.dtype), state)
        self.frames.setdefault(session_id, []).append(video.cpu())

    def video(self, session_id: str) -> Tensor:
        return torch.cat(self.frames[session_id], dim=1)


__all__ = [
    "BlockSink",
    "CloseSession",
    "Command",
    "ControlChannel",
    "GenerateBlock",
    "OpenSession",
    "PodDriver",
    "PodEngine",
    "Replay",
    "SetPrompt",
    "Shutdown",
    "VAEDecodeSink",
    "follow",
]
