"""The models built into the package, by name. Torch-free, so launchers can check a name cheaply."""

BUILTIN_MODELS = ("toyworld", "tiny")  # toyworld: trained weights shipped in the package; tiny: random weights
DEFAULT_MODEL = "toyworld"  # what runs without --model

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODEL"]
