"""Configuration dataclasses of the engine: the DiT architecture and the block loop.

The real model sizes (Wan2.1 1.3B / 14B) are data here, never constants in the code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class WanDiTConfig:
    """Causal Wan DiT hyper-parameters (names follow the Wan2.1 `config.json`)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    in_dim: int = 16
    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 16
    num_heads: int = 12
    num_layers: int = 30
    qk_norm: bool = True
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_theta: float = 10000.0
    # Length of the RoPE table in latent frames. Windowed sessions re-base their positions when they
    # reach its end (rope.RopeRebase); it bounds only global-attention sessions.
    rope_max_positions: int = 1024

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(self.patch_size))
        if self.dim % self.num_heads != 0:
            raise ValueError(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.freq_dim % 2 != 0:
            raise ValueError(f"freq_dim={self.freq_dim} must be even")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Number of DiT tokens one latent frame of this size becomes after patchify."""
        _, ph, pw = self.patch_size
        if latent_height % ph or latent_width % pw:
            raise ValueError(
                f"latent size {latent_height}x{latent_width} must be divisible by the patch size "
                f"{ph}x{pw} (pixel size divisible by {8 * ph}x{8 * pw} for the Wan VAE)"
            )
        return (latent_height // ph) * (latent_width // pw)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WanDiTConfig:
        """Build from a Wan / Self Forcing / golden `config.json` dict; unknown keys are ignored."""
        return cls(**_known_fields(cls, data))


WAN21_T2V_1_3B = WanDiTConfig(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30)
WAN21_T2V_14B = WanDiTConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40)

DIT_PRESETS: dict[str, WanDiTConfig] = {
    "wan2.1-1.3b": WAN21_T2V_1_3B,
    "wan2.1-14b": WAN21_T2V_14B,
}


@dataclass(frozen=True)
class FlowMatchConfig:
    """Flow-matching noise schedule (Wan `FlowMatchScheduler` with `extra_one_step`)."""

    num_train_timesteps: int = 1000
    shift: float = 5.0
    sigma_min: float = 0.0
    sigma_max: float = 1.0


@dataclass(frozen=True)
class SamplingConfig:
    """How one block is denoised.

    `denoising_steps` are in the training-timestep scale (0..1000). With `warp` (Self Forcing)
    each value s is replaced by the shifted schedule's timestep at index 1000 - s; without it
    (CausVid) the raw values are used. `timestep_dtype` is the dtype the reference feeds the
    model: float32 for Self Forcing, int64 for CausVid (it matters: the embedding sees it).

    `solver` is how a step moves to the next timestep. ``renoise`` (Self Forcing, CausVid): re-noise
    the step's x0 prediction with fresh noise, right for few-step distilled models, whose x0 is
    a sample. ``euler``: the flow-matching ODE step, which keeps the step's own noise estimate
    (x0 + flow); for models trained only with the flow-matching loss, whose x0 is a posterior
    mean that fresh noise would blur into a grey average.
    """

    denoising_steps: tuple[float, ...] = (1000, 750, 500, 250)
    warp: bool = True
    timestep_dtype: Literal["float32", "int64"] = "float32"
    context_noise: float = 0.0
    solver: Literal["renoise", "euler"] = "renoise"
    schedule: FlowMatchConfig = field(default_factory=FlowMatchConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "denoising_steps", tuple(self.denoising_steps))
        if not self.denoising_steps:
            raise ValueError("denoising_steps must list at least one timestep, e.g. [1000, 750, 500, 250]")
        if self.timestep_dtype not in ("float32", "int64"):
            raise ValueError(f"timestep_dtype must be 'float32' or 'int64', got {self.timestep_dtype!r}")
        if self.solver not in ("renoise", "euler"):
            raise ValueError(f"solver must be 'renoise' or 'euler', got {self.solver!r}")


@dataclass(frozen=True)
class BlockConfig:
    """The block-causal structure of a session.

    `local_attn_size` and `sink_size` are in latent frames, as in Self Forcing: the window
    holds `local_attn_size` frames in total (sink and current block included); -1 = global.
    """

    num_frame_per_block: int = 3
    local_attn_size: int = -1
    sink_size: int = 0

    def __post_init__(self) -> None:
        if self.num_frame_per_block < 1:
            raise ValueError(f"num_frame_per_block must be >= 1, got {self.num_frame_per_block}")
        if self.local_attn_size != -1:
            if self.sink_size < 0:
                raise ValueError(f"sink_size must be >= 0, got {self.sink_size}")
            if self.local_attn_size < self.sink_size + self.num_frame_per_block:
                raise ValueError(
                    f"local_attn_size={self.local_attn_size} must be at least sink_size + "
                    f"num_frame_per_block = {self.sink_size + self.num_frame_per_block} (or -1 for global)"
                )
        elif self.sink_size != 0:
            raise ValueError("sink_size only applies with a local window: set local_attn_size or sink_size=0")

    @property
    def is_global(self) -> bool:
        return self.local_attn_size == -1
