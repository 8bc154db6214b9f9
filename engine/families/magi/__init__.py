"""MAGI-1 (SandAI): chunk-wise autoregressive video DiT, its T5 text encoder and ViT VAE."""
