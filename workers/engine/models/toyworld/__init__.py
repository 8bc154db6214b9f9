"""Toyworld: a procedural 2-D world, its measurements, and the trainer of a tiny causal Wan model of it."""
