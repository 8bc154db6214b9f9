"""What a model and a session are, as data: model presets (architectures, sampling, video
defaults, files), the size and cost of a session, and prompt schedules with their validation.

Torch-free and shared by every layer: the scheduler validates and sizes sessions with it, the SDK
and the CLI build schedules with it, and the engine builds its networks from it.
"""

from inferix.spec.presets import ModelFiles, ModelPreset, VideoDefaults, available_presets, load_preset
from inferix.spec.schedule import (
    MAX_PROMPT_BYTES,
    PromptChange,
    check_prompt_text,
    parse_prompt_schedule,
    validate_schedule,
)
from inferix.spec.sizing import SessionShape, native_latent_size, session_shape

__all__ = [
    "MAX_PROMPT_BYTES",
    "ModelFiles",
    "ModelPreset",
    "PromptChange",
    "SessionShape",
    "VideoDefaults",
    "available_presets",
    "check_prompt_text",
    "load_preset",
    "native_latent_size",
    "parse_prompt_schedule",
    "session_shape",
    "validate_schedule",
]
