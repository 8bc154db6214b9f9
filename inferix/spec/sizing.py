"""What a session of a given shape costs, computed from the model preset alone.

The scheduler uses it for validation and admission, the worker to size its pool, so both agree
without loading weights. A worker pool page holds the tokens of one latent frame at the model's
native resolution; a session at another resolution must use a whole number of pages per frame.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferix.errors import UserError
from inferix.spec.presets import ModelPreset
from inferix.spec.sampling import rope_rebase

VAE_SPATIAL_FACTOR = 8
VAE_TEMPORAL_FACTOR = 4
MAX_SIDE = 4096


@dataclass(frozen=True)
class SessionShape:
    width: int
    height: int
    tokens_per_frame: int
    pages_per_frame: int
    cache_frames: int  # latent frames the session holds at most
    pages: int  # KV pages it needs at most
    frames_per_block: int  # latent frames
    video_frames_per_block: int  # pixel frames a block decodes to (after the first block)


def native_latent_size(preset: ModelPreset) -> tuple[int, int]:
    """(height, width) of a latent frame at the preset's native resolution."""
    return preset.video.height // VAE_SPATIAL_FACTOR, preset.video.width // VAE_SPATIAL_FACTOR


def page_tokens(preset: ModelPreset) -> int:
    """Tokens per pool page: one latent frame at the preset's native resolution."""
    return preset.dit.tokens_per_frame(*native_latent_size(preset))


def session_shape(preset: ModelPreset, width: int, height: int, num_blocks: int | None) -> SessionShape:
    """Validate a session's resolution and length for `preset` and size its KV cache.

    Raises UserError naming the field and the allowed values.
    """
    multiple = VAE_SPATIAL_FACTOR * preset.dit.patch_size[1]
    if not (multiple <= width <= MAX_SIDE and multiple <= height <= MAX_SIDE) or width % multiple or height % multiple:
        raise UserError(
            f"resolution {width}x{height} is not supported by model {preset.name!r}: width and height must be "
            f"multiples of {multiple} between {multiple} and {MAX_SIDE} (native {preset.video.width}x"
            f"{preset.video.height})"
        )
    tokens = preset.dit.tokens_per_frame(height // VAE_SPATIAL_FACTOR, width // VAE_SPATIAL_FACTOR)
    per_page = page_tokens(preset)
    if tokens % per_page:
        raise UserError(
            f"resolution {width}x{height} is not supported by model {preset.name!r}: a latent frame has {tokens} "
            f"tokens, which must be a multiple of the page size ({per_page} tokens, the native "
            f"{preset.video.width}x{preset.video.height})"
        )
    block = preset.pipeline.block
    nf = block.num_frame_per_block
    if block.is_global:
        frames = _global_cache_frames(preset, num_blocks)
    else:
        # A window bounds the cache, and its time positions re-base at the RoPE table's end: any length.
        try:
            rope_rebase(preset.dit.rope_max_positions, block)
        except ValueError as exc:
            raise UserError(f"model {preset.name!r} cannot run windowed sessions: {exc}") from exc
        frames = block.local_attn_size
    pages_per_frame = tokens // per_page
    return SessionShape(
        width=width,
        height=height,
        tokens_per_frame=tokens,
        pages_per_frame=pages_per_frame,
        cache_frames=frames,
        pages=frames * pages_per_frame,
        frames_per_block=nf,
        video_frames_per_block=nf * preset.vae.temporal_factor,
    )


def _global_cache_frames(preset: ModelPreset, num_blocks: int | None) -> int:
    """Latent frames a global-attention session caches: all of them, so it needs `num_blocks`.

    Only windowed sessions re-base their time positions at the RoPE table's end (`rope.RopeRebase`);
    a global one, whose cache grows with it anyway, keeps the table's bound on its length.
    """
    nf = preset.pipeline.block.num_frame_per_block
    if num_blocks is None:
        raise UserError(
            f"model {preset.name!r} uses global attention: an unbounded session needs a window; set num_blocks"
        )
    if num_blocks * nf > preset.dit.rope_max_positions:
        raise UserError(
            f"{num_blocks} blocks need {num_blocks * nf} latent frames; model {preset.name!r} uses global "
            f"attention and supports at most {preset.dit.rope_max_positions // nf} blocks (its RoPE table)"
        )
    return num_blocks * nf
