"""The static-buffer step behind `--cuda-graphs`, checked on the CPU (the capture needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from engine.cuda_graphs import StaticStep, use_cuda_graphs
from engine.families.wan.pipeline import WanPipeline
from engine.kv import KVPool
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig
from tests.engine.tiny import LATENT_H, LATENT_W, prompt, tiny_dit

ROLLING = BlockConfig(num_frame_per_block=2, local_attn_size=5, sink_size=1)


def pooled_pipeline(block: BlockConfig) -> WanPipeline:
    config = PipelineConfig(block=block, sampling=SamplingConfig(denoising_steps=(1000, 750, 500)))
    dit = tiny_dit()
    pipeline = WanPipeline(dit, config)
    pipeline.pool = KVPool(pipeline.pool_spec(LATENT_H, LATENT_W, 40))
    return pipeline


def video(pipeline: WanPipeline, seed: int, blocks: int = 6) -> list[torch.Tensor]:
    with pipeline.open_session(prompt(seed), LATENT_H, LATENT_W, seed=seed, num_blocks=blocks) as session:
        return [b.latents for b in session]


@pytest.mark.parametrize("block", [ROLLING, BlockConfig(num_frame_per_block=2)], ids=["rolling", "global"])
def test_the_static_buffer_step_gives_the_eager_frames_bit_for_bit(block: BlockConfig) -> None:
    eager = pooled_pipeline(block)
    static = pooled_pipeline(block)
    step = StaticStep(static.dit, static.pool)
    static.dit.compiled_step = step
    other = static.pool.open_session("neighbour", LATENT_H * LATENT_W // 4)  # the sessions' pages move
    for seed in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(video(eager, seed), video(static, seed), strict=True))
        other.begin(seed - 1, 1)
    # One set of buffers per step shape: the window's fill, then one for every rolling block; each
    # twice, for the denoising steps and for the context pass (which stops at the last K/V).
    shapes = len(step.buffers)
    assert shapes == 2 * (3 if block == ROLLING else 6)
    assert sum(key[-1] for key in step.buffers) == shapes // 2
    tables = {key: b.cache.read_ids.data_ptr() for key, b in step.buffers.items()}
    video(static, 3)
    assert len(step.buffers) == shapes
    assert tables == {key: b.cache.read_ids.data_ptr() for key, b in step.buffers.items()}  # refilled in place


def test_static_steps_stop_at_their_limit_and_run_eagerly_beyond() -> None:
    eager = pooled_pipeline(BlockConfig(num_frame_per_block=2))
    static = pooled_pipeline(BlockConfig(num_frame_per_block=2))
    step = StaticStep(static.dit, static.pool, max_graphs=2)
    static.dit.compiled_step = step
    assert all(torch.equal(a, b) for a, b in zip(video(eager, 1), video(static, 1), strict=True))
    assert len(step.buffers) == 2


def test_cuda_graphs_need_a_cuda_pool() -> None:
    pipeline = pooled_pipeline(ROLLING)
    assert pipeline.pool is not None
    with pytest.raises(ValueError, match="needs the model and its KV pool on a CUDA device"):
        use_cuda_graphs(pipeline.dit, pipeline.pool)
