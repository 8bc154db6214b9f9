"""The parts of `scripts/gpu_check.py` (`make gpu-check`), one job per module."""
