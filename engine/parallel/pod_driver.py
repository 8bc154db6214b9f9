"""A pod: every rank holds the same pipeline; rank 0 drives, the other ranks follow in lockstep.

Rank 0 (where the worker service runs) turns each request into a `Command`, broadcasts it on a
small gloo control group, then executes it itself; every other rank sits in `follow`, receives
the same command and executes it too. Commands are deterministic (all randomness derives from
(seed, block, step)), so all ranks reach the same collectives in the same order with the same
shapes; only tensors of the block, never per-rank decisions, differ between them.

Everything after the DiT is rank 0's alone: finished blocks go to the `BlockSink` given to
`PodDriver` (the streaming VAE decode and the hand-off to the streamer), never to the followers.
The worker service holds each session as a `PodSession`: the surface of a `WanLoop`
(what `WanSession` and the service call), every call of which is a pod command.

Commands go out strictly one at a time: `PodDriver` sends and executes each under one lock, so two
threads of rank 0 can never interleave their collectives.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from engine.families.wan.pipeline import BlockOutput, DiTJob, ReplayBlock, WanLoop, WanPipeline
from engine.families.wan.vae import VAEDecodeState, WanVAE
from engine.kv.session_cache import PagedSessionCache, SessionUsage
from inferix.errors import InferixError

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
    blocks: list[ReplayBlock]
    next_block_index: int | None = None
    from_start: bool = True  # False: a later chunk of a replay in chunks


@dataclass(frozen=True)
class CloseSession:
    session_id: str


@dataclass(frozen=True)
class Offload:
    """Move a session's KV pages to host memory (every rank holds its own shard of them)."""

    session_id: str


@dataclass(frozen=True)
class Prefetch:
    """Start bringing an offloaded session's KV pages back to the device, on every rank."""

    session_id: str


@dataclass(frozen=True)
class Shutdown:
    pass


Command = OpenSession | SetPrompt | GenerateBlock | Replay | CloseSession | Offload | Prefetch | Shutdown
COMMANDS = (OpenSession, SetPrompt, GenerateBlock, Replay, CloseSession, Offload, Prefetch, Shutdown)
BlockSink = Callable[[str, BlockOutput], None]
# Followers wait in `receive` for as long as the worker is idle: far beyond the default process-group
# timeout (30 min), after which gloo would end the wait with an error and the pod would die.
CONTROL_TIMEOUT = timedelta(days=365)


class ControlChannel:
    """Rank 0 -> every rank: commands as pickled objects on a CPU (gloo) group.

    Commands are small (a prompt's embeddings at most); a separate gloo group keeps them off the
    NCCL stream and works before any GPU tensor exists. Its timeout is `CONTROL_TIMEOUT`, so an
    idle pod waits for its next command instead of timing out. Creating the group is a collective:
    every rank builds its channel at the same point of its start-up (after `SequenceParallel`).
    """

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        self.is_driver = dist.get_rank() == 0

    def send(self, command: Command) -> None:
        if not self.is_driver:
            raise RuntimeError("only rank 0 sends pod commands")
        dist.broadcast_object_list([_to_cpu(command)], src=0, group=self.group)

    def receive(self) -> Command:
        box: list[object] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        command = box[0]
        if not isinstance(command, COMMANDS):
            raise RuntimeError(f"pod control channel carried {type(command).__name__}, not a command")
        return command


def _to_cpu(command: Command) -> Command:
    if isinstance(command, OpenSession | SetPrompt):
        return dataclasses.replace(command, prompt_embeds=command.prompt_embeds.cpu())
    if isinstance(command, Replay):
        blocks = [
            dataclasses.replace(b, latents=b.latents.cpu(), prompt_embeds=b.prompt_embeds.cpu()) for b in command.blocks
        ]
        return Replay(command.session_id, blocks, command.next_block_index, command.from_start)
    return command


class PodEngine:
    """One rank's sessions; `execute` does the same thing on every rank of the pod."""

    def __init__(self, pipeline: WanPipeline) -> None:
        self.pipeline = pipeline
        self.sessions: dict[str, WanLoop] = {}

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
                dataclasses.replace(b, latents=b.latents.to(device), prompt_embeds=b.prompt_embeds.to(device))
                for b in command.blocks
            ]
            self._session(command.session_id).replay(blocks, command.next_block_index, from_start=command.from_start)
        elif isinstance(command, CloseSession):
            self._session(command.session_id).close()
            del self.sessions[command.session_id]
        elif isinstance(command, Offload):
            self._session(command.session_id).cache.offload()
        elif isinstance(command, Prefetch):
            self._session(command.session_id).cache.prefetch()
        return None

    def _session(self, session_id: str) -> WanLoop:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise InferixError(f"unknown session {session_id!r} on this pod") from None


class PodDriver:
    """Rank 0's handle on the pod: the calls the worker service makes.

    Thread-safe: each command is broadcast and executed under one lock, so commands reach every
    rank in one order and the collectives of two commands never interleave.
    """

    def __init__(self, engine: PodEngine, channel: ControlChannel, sink: BlockSink | None = None) -> None:
        self.engine = engine
        self.channel = channel
        self.sink = sink
        self._lock = threading.Lock()
        self._shut_down = False

    def _run(self, command: Command) -> BlockOutput | None:
        with self._lock:
            return self._run_locked(command)

    def _run_locked(self, command: Command) -> BlockOutput | None:
        if self._shut_down:
            raise InferixError(f"the pod is shut down: cannot run {type(command).__name__}")
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
        with self._lock:
            block = self._run_locked(GenerateBlock(session_id))
            assert block is not None
            if self.sink is not None:
                self.sink(session_id, block)
        return block

    def replay(
        self, session_id: str, blocks: list[ReplayBlock], next_block_index: int | None = None, from_start: bool = True
    ) -> None:
        """Rebuild the session's cache on every rank from committed blocks (e.g. after a crash)."""
        self._run(Replay(session_id, blocks, next_block_index, from_start))

    def close_session(self, session_id: str) -> None:
        self._run(CloseSession(session_id))

    def offload(self, session_id: str) -> None:
        """Move the session's KV pages to host memory on every rank (`KVCapacityError` if no room)."""
        self._run(Offload(session_id))

    def prefetch(self, session_id: str) -> None:
        self._run(Prefetch(session_id))

    def shutdown(self) -> None:
        """Release the followers (they return from `follow`); waits for the command in flight. Idempotent."""
        with self._lock:
            if not self._shut_down:
                self._shut_down = True
                self.channel.send(Shutdown())


class PodSessionCache:
    """`PodSession.cache`: offload / prefetch are pod commands; usage is rank 0's shard (every rank's
    page table is the same, so its page counts are the pod's)."""

    def __init__(self, driver: PodDriver, session_id: str, local: PagedSessionCache) -> None:
        self.driver = driver
        self.session_id = session_id
        self.local = local

    def offload(self) -> None:
        self.driver.offload(self.session_id)

    def prefetch(self) -> None:
        self.driver.prefetch(self.session_id)

    def usage(self) -> SessionUsage:
        return self.local.usage()

    @property
    def position_offset(self) -> int:
        return self.local.position_offset


class PodSession:
    """Rank 0's proxy of one session of the pod, with the surface of a `WanLoop` that
    `WanSession` and the worker service use. Opening it opens the session on every rank; every
    call that changes it is a pod command. Its counters are rank 0's own session's (all ranks agree).
    """

    def __init__(
        self,
        driver: PodDriver,
        session_id: str,
        prompt_embeds: Tensor,
        latent_height: int,
        latent_width: int,
        *,
        seed: int = 0,
        num_blocks: int | None = None,
    ) -> None:
        driver.open_session(session_id, prompt_embeds, latent_height, latent_width, seed=seed, num_blocks=num_blocks)
        self.driver = driver
        self.local: WanLoop = driver.engine.sessions[session_id]
        self.cache = PodSessionCache(driver, session_id, self.local.cache)

    @property
    def session_id(self) -> str:
        return self.local.session_id

    @property
    def next_block_index(self) -> int:
        return self.local.next_block_index

    @property
    def finished(self) -> bool:
        return self.local.finished

    def generate_block(self) -> BlockOutput:
        return self.driver.generate_block(self.session_id)

    def block_job(self, denoised: Callable[[BlockOutput], object] | None = None) -> DiTJob[BlockOutput]:
        """A job with no calls to batch: a pod runs each block on all its ranks, one session at a time
        (its frames are decoded once the block is done, so `denoised` is not called)."""
        yield from ()
        return self.generate_block()

    def set_prompt(self, prompt_embeds: Tensor, recache: bool = False) -> None:
        self.driver.set_prompt(self.session_id, prompt_embeds, recache)

    def replay(
        self, blocks: Sequence[ReplayBlock], next_block_index: int | None = None, *, from_start: bool = True
    ) -> None:
        self.driver.replay(self.session_id, list(blocks), next_block_index, from_start)

    def close(self) -> None:
        if not self.local.closed:
            self.driver.close_session(self.session_id)


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
    "COMMANDS",
    "CONTROL_TIMEOUT",
    "Command",
    "ControlChannel",
    "GenerateBlock",
    "Offload",
    "OpenSession",
    "PodDriver",
    "PodEngine",
    "PodSession",
    "PodSessionCache",
    "Prefetch",
    "Replay",
    "SetPrompt",
    "Shutdown",
    "VAEDecodeSink",
    "follow",
]
