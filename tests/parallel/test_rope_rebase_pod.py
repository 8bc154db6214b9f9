"""A sequence-parallel pod re-bases like one process: every rank turns its own shard of the cache.

The tiny DiT's RoPE table holds 24 latent frames (tests/engine/wan/test_rope_rebase.py); block 8 is the
first past it. Each rank's cache holds a shard of heads (Ulysses) or of every frame's tokens (Ring);
a re-base turns every cached key by the same time positions, so each rank turns its shard alone,
no collective. The pod must match the single-rank engine within 1e-5 (latents and the gathered cache),
and a session rebuilt on the pod by replay across the crossing must continue bit-identically.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import Tensor

from engine.families.wan.pipeline import ReplayBlock, WanPipeline
from engine.parallel.context import SequenceParallel
from engine.parallel.plan import ParallelPlan
from inferix.spec.sampling import BlockConfig
from tests.engine.tiny import TINY_DIT, prompt, tiny_pipeline
from tests.parallel.pod import run_ranks

TOL = 1e-5
SHORT_TABLE = dataclasses.replace(TINY_DIT, rope_max_positions=24)
WINDOW = BlockConfig(num_frame_per_block=3, local_attn_size=9, sink_size=3)
BLOCKS = 12  # re-bases at block 8, by 18 positions
H, W = 4, 6  # 6 tokens per frame, 2 heads
PLANS = [ParallelPlan(2, 1), ParallelPlan(1, 2, "pass-kv"), ParallelPlan(1, 2, "pass-q")]


def session_run(pipe: WanPipeline, parallel: SequenceParallel | None = None) -> dict[str, list[Tensor]]:
    """BLOCKS blocks, a prompt change with recache after the crossing; the final cache; a replay."""
    out: dict[str, list[Tensor]] = {"latents": [], "kv": [], "replayed": []}
    committed = []
    with pipe.open_session(prompt(0), H, W, seed=7, num_blocks=BLOCKS) as session:
        for index in range(BLOCKS):
            if index == 10:
                session.set_prompt(prompt(1), recache=True)
            block = session.generate_block()
            out["latents"].append(block.latents)
            committed.append(ReplayBlock(block.start_frame, block.latents, prompt(0)))
        assert session.cache.position_offset == 18
        frames = len(session.cache.frames)
        for layer in range(TINY_DIT.num_layers):
            for local in session.cache.layer_kv(layer):
                out["kv"].append(local if parallel is None else parallel.gather_cache_kv(local, frames))
    with pipe.open_session(prompt(0), H, W, seed=7, num_blocks=BLOCKS, session_id="replayed") as replayed:
        replayed.replay(committed[:9], next_block_index=9)
        out["replayed"].append(replayed.generate_block().latents)
    return out


def sharded_runs(rank: int) -> dict[str, dict[str, list[Tensor]]]:
    runs = {}
    for plan in PLANS:
        pipe = tiny_pipeline(WINDOW, dit_config=SHORT_TABLE)
        parallel = SequenceParallel(plan)
        pipe.dit.set_sequence_parallel(parallel)
        runs[plan.name] = session_run(pipe, parallel)
    return runs


def max_diff(a: list[Tensor], b: list[Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_every_rank_re_bases_its_shard_like_the_single_rank_engine(tmp_path: Path) -> None:
    per_rank = run_ranks(sharded_runs, 2, tmp_path)
    reference = session_run(tiny_pipeline(WINDOW, dit_config=SHORT_TABLE))
    for plan in PLANS:
        ours, other = per_rank[0][plan.name], per_rank[1][plan.name]
        assert max_diff(ours["latents"], other["latents"]) == 0.0  # ranks step the same gathered prediction
        diffs = (max_diff(ours["latents"], reference["latents"]), max_diff(ours["kv"], reference["kv"]))
        assert max(diffs) <= TOL, (plan.name, diffs)
        assert torch.equal(ours["replayed"][0], ours["latents"][9]), plan.name
