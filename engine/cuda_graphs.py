"""`--cuda-graphs`: a DiT denoising step replayed from a captured CUDA graph.

A graph replays fixed kernels on fixed addresses, so everything a step reads or writes lives in
static buffers of one shape: the latents, the time modulations, the RoPE rotations, the prompt's
cross-attention K/V of every layer, and the session's KV pages as two fixed-size block tables
(the pages the step writes, the pages attention reads, in the order it reads them). Before each
replay the step copies its session's values and page ids into those buffers; the KV pool's
tensors never move, so one graph serves every session whose call has the same shapes and table
sizes: a window's fill captures one graph per cache length, its rolling phase one in all; the
context passes, which stop at the last layer's K/V and return no flow, have graphs of their own.

Attention in a graph gathers the read pages by id (a capture cannot read a host-side page range),
then runs the backend's dense kernel; the gather reads the pages in the order the eager path
reads them, so a replayed step gives the eager step's bits on the same device.

`StaticStep` is that code path without the capture: it prepares and fills the same buffers and
runs the step eagerly on them, on any device. `CudaGraphStep` captures it on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.attention.backends import AttentionBackend
from engine.families.wan.dit import CausalWanDiT
from engine.kv.pool import KVPool
from engine.kv.protocol import SelfAttentionCache
from engine.kv.session_cache import PagedSessionCache

# Distinct step shapes captured at most (a window's fill is one per cache length); beyond, eager.
MAX_GRAPHS = 32


class StaticPagedCache:
    """A session cache seen through fixed-size block tables: `write_ids` (the step's K/V pages) and
    `read_ids` (what attention reads, in order), tensors that are refilled, never re-made."""

    def __init__(self, pool: KVPool, write_pages: int, read_pages: int) -> None:
        device = pool.k.device
        self.pool = pool
        self.write_ids = torch.zeros(write_pages, dtype=torch.long, device=device)
        self.read_ids = torch.zeros(read_pages, dtype=torch.long, device=device)

    def load(self, cache: PagedSessionCache) -> None:
        """Copy a begun session cache's page tables into the block tables."""
        self.write_ids.copy_(torch.tensor(cache.write_pages(), dtype=torch.long), non_blocking=True)
        self.read_ids.copy_(torch.tensor(cache.read_pages(), dtype=torch.long), non_blocking=True)

    def begin(self, start_frame: int, num_frames: int) -> None:
        raise RuntimeError("a static cache is loaded from a begun session cache (StaticPagedCache.load)")

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, backend: AttentionBackend) -> Tensor:
        self.store(layer, k, v)
        keys, values = self.pool.fetch_pages(layer, self.read_ids)  # dequantized when the pool is 8-bit
        return backend.dense(q, keys.unsqueeze(0), values.unsqueeze(0))

    def store(self, layer: int, k: Tensor, v: Tensor) -> None:
        spec = self.pool.spec
        shape = (-1, spec.page_size, spec.num_heads, spec.head_dim)
        self.pool.write(layer, self.write_ids, k[0].reshape(shape), v[0].reshape(shape))


# (latents shape, prompt K shape, pages written, pages read, dtype, cache only: a context pass)
StepKey = tuple[tuple[int, ...], tuple[int, ...], int, int, torch.dtype, bool]


@dataclass
class StepInputs:
    """The tensors `CausalWanDiT.denoise_step` takes besides its cache, in its argument order."""

    x: Tensor
    e0: Tensor
    e_head: Tensor
    rotations: Tensor
    keys: list[Tensor]
    values: list[Tensor]

    def tensors(self) -> list[Tensor]:
        return [self.x, self.e0, self.e_head, self.rotations, *self.keys, *self.values]

    def tensors_as_args(self) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
        return self.x, self.e0, self.e_head, self.rotations, self.keys, self.values

    def empty_like(self) -> StepInputs:
        def like(t: Tensor) -> Tensor:
            return torch.empty_like(t)

        return StepInputs(
            like(self.x),
            like(self.e0),
            like(self.e_head),
            like(self.rotations),
            [like(k) for k in self.keys],
            [like(v) for v in self.values],
        )


@dataclass
class _StepBuffers:
    """The static inputs, block tables and output of one step shape."""

    inputs: StepInputs
    cache: StaticPagedCache
    cache_only: bool
    out: Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None

    def fill(self, inputs: StepInputs, cache: PagedSessionCache) -> None:
        for static, value in zip(self.inputs.tensors(), inputs.tensors(), strict=True):
            static.copy_(value)
        self.cache.load(cache)


class StaticStep:
    """`CausalWanDiT.denoise_step` on static buffers, one set per step shape (see the module doc).

    Called like `denoise_step`; a call whose cache is not a paged session cache of `pool` runs
    `denoise_step` directly. Installed as `dit.compiled_step`, it runs every single-call forward.
    """

    def __init__(self, dit: CausalWanDiT, pool: KVPool, max_graphs: int = MAX_GRAPHS) -> None:
        self.dit = dit
        self.pool = pool
        self.max_graphs = max_graphs
        self.buffers: dict[StepKey, _StepBuffers] = {}

    def __call__(
        self,
        x: Tensor,
        e0: Tensor,
        e_head: Tensor,
        rotations: Tensor,
        keys: list[Tensor],
        values: list[Tensor],
        cache: SelfAttentionCache | None,
        cache_only: bool = False,
    ) -> Tensor | None:
        inputs = StepInputs(x, e0, e_head, rotations, keys, values)
        if not isinstance(cache, PagedSessionCache) or cache.pool is not self.pool:
            return self.dit.denoise_step(*inputs.tensors_as_args(), cache, cache_only=cache_only)
        key: StepKey = (
            tuple(x.shape),
            tuple(keys[0].shape),
            len(cache.write_pages()),
            len(cache.read_pages()),
            x.dtype,
            cache_only,
        )
        buffers = self.buffers.get(key)
        if buffers is None:
            if len(self.buffers) >= self.max_graphs:
                return self.dit.denoise_step(*inputs.tensors_as_args(), cache, cache_only=cache_only)
            buffers = _StepBuffers(inputs.empty_like(), StaticPagedCache(self.pool, key[2], key[3]), cache_only)
            self.buffers[key] = buffers
        buffers.fill(inputs, cache)
        out = self.run(buffers)
        return None if out is None else out.clone()

    def run(self, buffers: _StepBuffers) -> Tensor | None:
        """The step on the filled buffers (eagerly here; `CudaGraphStep` replays a capture)."""
        args = buffers.inputs.tensors_as_args()
        return self.dit.denoise_step(*args, buffers.cache, cache_only=buffers.cache_only)


class CudaGraphStep(StaticStep):
    """`StaticStep` whose step shapes are captured once as CUDA graphs, then replayed."""

    WARM_UP_RUNS = 2  # eager runs on a side stream before a capture (cuBLAS / allocator set-up)

    def __init__(self, dit: CausalWanDiT, pool: KVPool, max_graphs: int = MAX_GRAPHS) -> None:
        if not pool.k.is_cuda:
            raise ValueError("--cuda-graphs needs the model and its KV pool on a CUDA device")
        super().__init__(dit, pool, max_graphs)
        self.memory_pool = torch.cuda.graph_pool_handle()  # one pool: the graphs share their memory

    def run(self, buffers: _StepBuffers) -> Tensor | None:
        if buffers.graph is None:
            self._capture(buffers)
        assert buffers.graph is not None
        buffers.graph.replay()
        return buffers.out  # None for a context pass's graph: it only writes K/V pages

    def _capture(self, buffers: _StepBuffers) -> None:
        # Warm-up runs write the session's own K/V to its own pages, as the replay then does again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.WARM_UP_RUNS):
                super().run(buffers)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.memory_pool):
            buffers.out = super().run(buffers)
        buffers.graph = graph


def use_cuda_graphs(dit: CausalWanDiT, pool: KVPool) -> CudaGraphStep:
    """Run every single-call forward of `dit` on sessions of `pool` from captured CUDA graphs."""
    if dit.parallel is not None:
        raise ValueError("a sequence-parallel DiT runs eagerly: CUDA graphs need one process per step")
    if dit.compiled_step is not None:
        raise ValueError("--cuda-graphs and --compile are separate modes here: choose one")
    step = CudaGraphStep(dit, pool)
    dit.compiled_step = step
    return step
