"""Tiny random-weight models for engine tests."""

from __future__ import annotations

import torch

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.pipeline import WanPipeline
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig

TINY_DIT = WanDiTConfig(text_len=8, dim=32, ffn_dim=64, freq_dim=16, text_dim=16, num_heads=2, num_layers=2)
LATENT_H, LATENT_W = 4, 6  # 2x3 = 6 tokens per latent frame


def tiny_dit(seed: int = 0, config: WanDiTConfig = TINY_DIT) -> CausalWanDiT:
    torch.manual_seed(seed)
    return CausalWanDiT(config, attention_backend="sdpa").eval()


def tiny_pipeline(
    block: BlockConfig | None = None,
    seed: int = 0,
    steps: tuple[float, ...] = (1000, 750, 500),
    dit_config: WanDiTConfig = TINY_DIT,
) -> WanPipeline:
    config = PipelineConfig(block=block or BlockConfig(), sampling=SamplingConfig(denoising_steps=steps))
    return WanPipeline(tiny_dit(seed, dit_config), config)


def prompt(seed: int, tokens: int = 5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(1, tokens, TINY_DIT.text_dim, generator=generator)


__all__ = ["LATENT_H", "LATENT_W", "TINY_DIT", "prompt", "tiny_dit", "tiny_pipeline"]
