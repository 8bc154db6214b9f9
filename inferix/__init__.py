"""Inferix: inference engine and service mesh for block-diffusion video world models."""

__version__ = "0.1.0"
