"""Decoders shared by model families: alternatives to a family's own VAE for its latents (TAEHV)."""
