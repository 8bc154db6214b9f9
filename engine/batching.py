"""Continuous batching: many sessions' block jobs advanced together, one batched DiT forward per step.

A session's block is a job (`WanLoop.block_job`): a generator that yields every DiT call
it needs -- the denoising steps, the context pass, the context passes of a prompt change with
re-cache -- and is sent each flow prediction. `BlockBatcher.step` gathers the pending call of every
job it runs, groups the calls by latent size (sessions of another resolution never share a
forward), packs each group into forwards of at most `max_tokens` token rows, oldest job first, and
sends each job its flow. Jobs join at any step (a session's next block starts at once) and leave
when their block is done, so the batch changes block by block while every job advances one call
per step: no session runs ahead while another waits.

A job may hand out an `Early` output on the way (a block's frames, before its context pass): the
batcher keeps it until the next step for `take_early` and advances the job to its next call in the
same step.

Batching never changes a session's numbers: `CausalWanDiT.forward_batch` computes every row as it
would alone (see its docstring), so a block is bit-identical whatever runs beside it. One caveat
is measured, not assumed: CPU BLAS kernels treat a few small row counts on their own (fp32
matmuls of 1-3, 5-7 and 9-11 rows on an AVX2 CPU, of 1-5 rows 128 wide and 1-15 rows 384 wide on an
AVX512 one give other bits alone than inside a larger matrix), so the batcher probes each row count
once with every linear layer shape of the DiT and runs a call of a count that is not batch-invariant
alone (e.g. a one-frame re-cache pass of a tiny model). On CUDA, cuBLAS picks kernels by the whole
matrix: batched results differ from solo ones in the last bits (bench/RESULTS.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.families.wan.dit import CausalWanDiT, DiTCall
from engine.families.wan.pipeline import DiTJob, Early
from engine.quant.linear import QuantLinear
from inferix.profiling import profile

T = TypeVar("T")
# Token rows per forward at most, by device (`default_max_tokens`). On a GPU, a few 480p blocks (1560
# tokens per latent frame x 3 frames each) per forward, without its activations growing unbounded. On
# a CPU, batching pays by sharing each op's fixed cost among small calls; once a forward has a few
# thousand rows there is none left to share, and larger ones only thrash the caches (measured in
# bench/RESULTS.md: 8 sessions of 1344 rows batched were 0.8x one at a time).
CUDA_MAX_TOKENS = 16384
CPU_MAX_TOKENS = 2048


def default_max_tokens(device: torch.device | str) -> int:
    return CPU_MAX_TOKENS if torch.device(device).type == "cpu" else CUDA_MAX_TOKENS


@dataclass(frozen=True)
class ForwardStats:
    """One batched forward: how many sessions' calls, their token rows, how long it took, and the
    kinds of call in it ("denoise_step", "context_pass")."""

    sessions: int
    tokens: int
    seconds: float
    kinds: frozenset[str]


@dataclass(eq=False)
class BatchJob(Generic[T]):
    """A job in a batcher; `result` (or `error`) once `done`, with how it ran: from its start to its
    end (`seconds`), in `forwards` forwards of `mean_batch` sessions on average."""

    job: DiTJob[T]
    call: DiTCall | None = None
    done: bool = False
    result: T | None = None
    error: BaseException | None = None
    started_s: float = 0.0
    finished_s: float = 0.0
    forwards: int = 0
    batched_with: int = 0  # the sessions of all its forwards, summed

    @property
    def seconds(self) -> float:
        return self.finished_s - self.started_s

    @property
    def mean_batch(self) -> float:
        return self.batched_with / self.forwards if self.forwards else 1.0

    def value(self) -> T:
        """The job's result, or its error raised."""
        if not self.done:
            raise RuntimeError("the job has not finished")
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class BlockBatcher:
    """Runs jobs of sessions of one model together; `step()` from one thread at a time."""

    def __init__(
        self,
        dit: CausalWanDiT,
        max_tokens: int | None = None,
        on_forward: Callable[[ForwardStats], None] | None = None,
    ) -> None:
        """`max_tokens`: token rows per forward at most (None: `default_max_tokens` of the DiT's device)."""
        if max_tokens is None:
            max_tokens = default_max_tokens(dit.patch_embedding.weight.device)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.dit = dit
        self.max_tokens = max_tokens
        self.on_forward = on_forward
        self._lock = threading.Lock()  # add() may come from another thread than step()
        self._arriving: list[BatchJob[object]] = []
        self._running: list[BatchJob[object]] = []  # oldest first: the order the packing follows
        self._early: list[tuple[BatchJob[object], object]] = []  # handed out in the last step
        self._invariant: dict[tuple[int, torch.dtype], bool] = {}
        # (in, out) of the DiT's linear layers, whatever its family: those a forward runs over its joined
        # rows are among them (the others only make the probe stricter).
        self._linear_shapes = sorted(
            {(m.in_features, m.out_features) for m in dit.modules() if isinstance(m, nn.Linear | QuantLinear)}
        )

    def add(self, job: DiTJob[T]) -> BatchJob[T]:
        """Queue a job; it starts at the next step."""
        with self._lock:
            entry: BatchJob[T] = BatchJob(job)
            self._arriving.append(entry)  # type: ignore[arg-type]
        return entry

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._arriving or self._running)

    def take_early(self) -> list[tuple[BatchJob[object], object]]:
        """The `Early` outputs jobs handed out in the last step, in order, with their jobs (call it
        between steps; the next step drops those not taken)."""
        early, self._early = self._early, []
        return early

    @property
    def running(self) -> int:
        """Jobs that have started and not finished."""
        return len(self._running)

    @torch.no_grad()
    def step(self) -> list[BatchJob[object]]:
        """Start the arriving jobs, run one DiT call of every running job; the jobs finished."""
        with self._lock:
            arriving, self._arriving = self._arriving, []
        self._early = []
        finished = [entry for entry in arriving if not self._advance(entry, start=True)]
        self._running.extend(entry for entry in arriving if not entry.done)
        for calls in self._forwards():
            finished.extend(self._run(calls))
        self._running = [entry for entry in self._running if not entry.done]
        return finished

    def fail_all(self, error: BaseException) -> list[BatchJob[object]]:
        """End every queued and running job with `error` (after a step failed outside any job)."""
        with self._lock:
            entries, self._arriving = [*self._running, *self._arriving], []
        self._running, self._early = [], []
        for entry in entries:
            entry.job.close()
            entry.error, entry.done, entry.call = error, True, None
        return entries

    def run(self, jobs: Iterable[DiTJob[T]]) -> list[T]:
        """Run these jobs together to the end; their results in order (the first error raised)."""
        entries = [self.add(job) for job in jobs]
        while not all(entry.done for entry in entries):
            self.step()
        return [entry.value() for entry in entries]

    # ---- internals ------------------------------------------------------------------------
    def _forwards(self) -> list[list[BatchJob[object]]]:
        """The running jobs split into forwards: by latent size and device, then by `max_tokens`."""
        groups: dict[tuple[object, ...], list[BatchJob[object]]] = {}
        for entry in self._running:
            assert entry.call is not None
            x = entry.call.x
            groups.setdefault((tuple(x.shape[3:]), x.dtype, x.device), []).append(entry)
        forwards = []
        for group in groups.values():
            current: list[BatchJob[object]] = []
            tokens = 0
            for entry in group:
                rows = self._rows(entry)
                # A call of max_tokens rows shares no forward: it is not probed (a real model's probe is slow).
                if rows >= self.max_tokens or not self._batch_invariant(entry, rows):
                    forwards.append([entry])
                    continue
                if current and tokens + rows > self.max_tokens:
                    forwards.append(current)
                    current, tokens = [], 0
                current.append(entry)
                tokens += rows
            if current:
                forwards.append(current)
        return forwards

    def _batch_invariant(self, entry: BatchJob[object], rows: int) -> bool:
        """Whether every linear layer of a forward gives `rows` rows the same bits inside a larger
        batch as alone (probed once per row count, with each of the DiT's layer shapes: the range of
        row counts that BLAS treats on their own grows with the input width, e.g. 1-5 rows at 128
        wide and 1-15 at 384 on an AVX512 CPU; assumed on CUDA, where it is measured instead)."""
        assert entry.call is not None
        x = entry.call.x
        if x.device.type != "cpu":
            return True
        key = (rows, x.dtype)
        if key not in self._invariant:
            self._invariant[key] = all(
                _rows_invariant(rows, in_features, out_features, x.dtype)
                for in_features, out_features in self._linear_shapes
            )
        return self._invariant[key]

    def _rows(self, entry: BatchJob[object]) -> int:
        assert entry.call is not None
        pt, ph, pw = self.dit.config.patch_size
        _, frames, _, h, w = entry.call.x.shape
        return (frames // pt) * (h // ph) * (w // pw)

    def _run(self, entries: list[BatchJob[object]]) -> list[BatchJob[object]]:
        """One forward over these jobs' calls; the jobs that finished."""
        ready = []
        for entry in entries:  # a session whose pool is full fails alone
            assert entry.call is not None
            try:
                self.dit.begin(entry.call)
                ready.append(entry)
            except Exception as exc:  # noqa: BLE001 - handed to the job, which may handle it
                self._advance(entry, error=exc)
        if not ready:
            return [e for e in entries if e.done]
        calls = [entry.call for entry in ready if entry.call is not None]
        kinds = frozenset(call.kind for call in calls)
        began = time.perf_counter()
        try:
            with profile(next(iter(kinds)) if len(kinds) == 1 else "batched_step", sessions=len(calls)):
                flows = self.dit.forward_batch(calls, begun=True)
        except Exception as exc:  # noqa: BLE001 - every job of the forward gets the error
            for entry in ready:
                self._advance(entry, error=exc)
            return [e for e in entries if e.done]
        if self.on_forward is not None:
            rows = sum(self._rows(entry) for entry in ready)
            self.on_forward(ForwardStats(len(ready), rows, time.perf_counter() - began, kinds))
        for entry, flow in zip(ready, flows, strict=True):
            entry.forwards += 1
            entry.batched_with += len(ready)
            self._advance(entry, flow=flow)
        return [e for e in entries if e.done]

    def _advance(
        self,
        entry: BatchJob[object],
        *,
        start: bool = False,
        flow: Tensor | None = None,
        error: BaseException | None = None,
    ) -> bool:
        """Move the job to its next call; False once it has finished (its result or error kept)."""
        try:
            if start:
                entry.started_s = time.perf_counter()
                call = next(entry.job)
            elif error is not None:
                call = entry.job.throw(error)
            else:
                call = entry.job.send(flow)
            while isinstance(call, Early):
                self._early.append((entry, call.value))
                call = entry.job.send(None)
            entry.call = call
            return True
        except StopIteration as stop:
            entry.result = stop.value
        except Exception as exc:  # noqa: BLE001 - the job's own failure is its result
            entry.error = exc
        entry.done = True
        entry.call = None
        entry.finished_s = time.perf_counter()
        return False


def _rows_invariant(rows: int, in_features: int, out_features: int, dtype: torch.dtype) -> bool:
    """Whether `F.linear` of this shape gives `rows` rows the same bits alone as at three offsets of a
    matrix 64 rows larger (random values: BLAS picks its kernels by shape, not by value)."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator).to(dtype)
    bias = torch.randn(out_features, generator=generator).to(dtype)
    batch = torch.randn(rows + 64, in_features, generator=generator).to(dtype)
    together = F.linear(batch, weight, bias)
    return all(
        torch.equal(F.linear(batch[offset : offset + rows], weight, bias), together[offset : offset + rows])
        for offset in (0, 37, 64)
    )
