"""`--compile`: the DiT's step compiled with `torch.compile`, warmed up before any session runs.

What compiles is `CausalWanDiT.denoise_step`: the tensor code of one DiT call once its KV cache
is begun (patch embedding, every block, the head, unpatchify). `forward_batch` runs it for every
forward of one call; its eager prologue keeps what reads or edits Python state (validation, the
cache's `begin` and its pool lock, the time-embedding and RoPE-table lookups). Batched forwards
(several sessions in one) and sequence-parallel ones stay eager.

Recompiles. Dynamo guards on the ints the cache reads (its page ranges) and on the shapes that
change while a window fills (the KV length). With automatic dynamic shapes (`dynamic=None`), an
int or a dim that changes a second time becomes symbolic, so a session's later blocks and other
sessions reuse the graphs. `warm_up` runs a throwaway session of the served latent size, a
denoising step and a context pass per block (the steps of a block have the same shapes and pages;
a context pass is a graph of its own, which stops at the last block's K/V), through the fill of its
window and two turns of its ring, so that those compiles happen at start-up, never in a user's
block. The graphs also guard on the pool's shape: the warm-up runs in the pool sessions will use.

Numerics: a compiled step equals the eager one within float rounding (inductor fuses and reorders
elementwise work), not bit for bit; so with `--compile` a session batched (eager) with others and
the same session alone (compiled) agree within that rounding only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from engine.families.wan.dit import CausalWanDiT, DiTCall
from engine.families.wan.pipeline import WanPipeline
from engine.kv.protocol import SelfAttentionCache
from inferix.spec.sampling import BlockConfig

MIN_RECOMPILE_LIMIT = 64


@dataclass(frozen=True)
class CompileOptions:
    """How `compile_dit` compiles: a `torch.compile` backend and mode."""

    backend: str = "inductor"
    mode: str | None = None


@dataclass(frozen=True)
class WarmUp:
    """What `warm_up` did: blocks run (a denoising step and a context pass each), graphs compiled
    (dynamo's count), seconds taken."""

    blocks: int
    graphs: int
    seconds: float


def compile_dit(dit: CausalWanDiT, options: CompileOptions = CompileOptions()) -> None:
    """From now on every forward of one call (`DiT(...)`, `forward_batch([call])`) of `dit` runs
    its compiled `denoise_step`; the first calls of each shape compile it (see `warm_up`).

    For inference only: the parameters stop requiring grad (as a loaded model's never do), so
    that no prompt's K/V differ from the warm-up's in `requires_grad`, which the graphs guard on.
    """
    if dit.parallel is not None:
        raise ValueError("a sequence-parallel DiT runs eagerly: compile it without a sequence-parallel hook")
    dit.requires_grad_(False)
    # Dynamo keeps every DiT's graphs under the one code object of `denoise_step`, 8 at most by
    # default: a process with a few compiled DiTs (dtypes, latent sizes) would silently run the
    # later ones eagerly. Each needs a few graphs (fill and roll per latent size).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MIN_RECOMPILE_LIMIT)
    dit.compiled_step = torch.compile(dit.denoise_step, backend=options.backend, mode=options.mode)


def warm_up_blocks(block: BlockConfig, num_blocks: int | None = None) -> int:
    """Blocks of a throwaway session that reach every shape and page range a session of blocks
    `block` runs through: a window's fill and one turn of its ring (each page range twice, so that
    dynamo makes it symbolic), or, globally, three cache lengths (at most `num_blocks`)."""
    nf = block.num_frame_per_block
    if block.is_global:
        return 3 if num_blocks is None else min(num_blocks, 3)
    rolling = block.local_attn_size - block.sink_size
    return math.ceil(block.local_attn_size / nf) + 2 * rolling // math.gcd(rolling, nf)


def warm_up(pipeline: WanPipeline, latent_height: int, latent_width: int, num_blocks: int | None = None) -> WarmUp:
    """Run a compiled DiT (`compile_dit`) through the calls of a session of this latent size, so
    that it compiles now and not in a user's first block.

    The throwaway session opens in the pipeline's pool, as the engine's sessions do (the graphs
    guard on the pool's shape), and is closed after. Without a shared pool each session sizes its
    own by its `num_blocks`: for global attention, pass the one sessions will use.
    """
    blocks = warm_up_blocks(pipeline.config.block, num_blocks)
    prompt = torch.zeros(1, 1, pipeline.dit.config.text_dim, device=pipeline.device)
    with pipeline.open_session(
        prompt, latent_height, latent_width, num_blocks=num_blocks or blocks, session_id="compile-warm-up"
    ) as session:
        return warm_up_cache(pipeline.dit, session.cache, pipeline.config.block, latent_height, latent_width, blocks)


def warm_up_cache(
    dit: CausalWanDiT,
    cache: SelfAttentionCache,
    block: BlockConfig,
    latent_height: int,
    latent_width: int,
    blocks: int | None = None,
) -> WarmUp:
    """`warm_up` on a fresh cache of the caller's (in the pool its sessions will use): for each of
    `blocks` blocks (default `warm_up_blocks(block)`) of `block`'s frames, a denoising step and a
    context pass (a graph of its own: it stops at the last block's K/V), float32 latents as a
    pipeline gives them. The cache is left holding the last blocks' (meaningless) K/V."""
    from torch._dynamo.utils import counters

    blocks = warm_up_blocks(block) if blocks is None else blocks
    nf = block.num_frame_per_block
    device = dit.patch_embedding.weight.device
    graphs = counters["stats"]["unique_graphs"]
    began = time.perf_counter()
    with torch.no_grad():
        prompt = dit.encode_prompt(torch.zeros(1, 1, dit.config.text_dim, device=device))
        x = torch.zeros(1, nf, dit.config.in_dim, latent_height, latent_width, device=device)
        t = torch.zeros(1, nf, device=device)
        for b in range(blocks):
            dit(x, t, prompt, cache, start_frame=b * nf)
            dit.forward_batch([DiTCall(x, t, prompt, cache, b * nf, kind="context_pass")])
    return WarmUp(blocks, counters["stats"]["unique_graphs"] - graphs, time.perf_counter() - began)
