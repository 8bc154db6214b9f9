"""The architectures of a model as data: the causal Wan DiT, the Wan VAE, the patch VAE, the UMT5
text encoder, and which DiT weights a checkpoint contributes.

Torch-free, so the control plane can size and validate sessions without the engine. The engine's
modules build networks from these; the real model sizes (Wan2.1 1.3B / 14B) are data here, never
constants in the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from inferix.errors import UserError

# Which weights of a training checkpoint are the DiT: the EMA copy (Self Forcing) or the raw generator.
DiTWeights = Literal["ema", "generator"]


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class KeyboardActionConfig:
    """The keyboard branch of an action-conditioned Wan DiT (Matrix-Game 2.0's, at any scale).

    Every latent frame gets one keyboard token: the key rows of its last `window` frames, each
    embedded to `embed_dim`, concatenated and projected to K/V of width `attn_dim`. The video
    tokens of a frame attend, in `heads` heads with RoPE over frames, to the keyboard tokens of
    their own frame and the `window - 1` before it. It runs between cross-attention and the FFN of
    the blocks listed in `layers`, its output projection added to the stream.
    """

    keys: int
    window: int = 6
    embed_dim: int = 16
    attn_dim: int = 64
    heads: int = 4
    layers: tuple[int, ...] = (0, 1)
    rope_theta: float = 256.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if self.keys < 1 or self.window < 1:
            raise ValueError(f"action: keys ({self.keys}) and window ({self.window}) must be at least 1")
        if self.attn_dim % self.heads or (self.attn_dim // self.heads) % 2:
            raise ValueError(f"action: attn_dim={self.attn_dim} must split into {self.heads} heads of an even width")

    @property
    def rows_before(self) -> int:
        """Key rows a block needs before its first frame: the windows of the keyboard tokens its
        first frame attends to reach back 2 (window - 1) frames."""
        return 2 * (self.window - 1)


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
    # Action-conditioned models (toyworld-play): the keyboard branch; None for text-only models.
    action: KeyboardActionConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(self.patch_size))
        if isinstance(self.action, Mapping):
            object.__setattr__(self, "action", KeyboardActionConfig(**self.action))
        if self.action is not None and any(not 0 <= i < self.num_layers for i in self.action.layers):
            raise ValueError(f"action.layers {list(self.action.layers)} must be blocks below {self.num_layers}")
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


WAN21_LATENT_MEAN: tuple[float, ...] = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENT_STD: tuple[float, ...] = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


@dataclass(frozen=True)
class WanVAEConfig:
    """Hyper-parameters of the Wan2.1 VAE; defaults are the released Wan2.1 VAE.

    ``temperal_downsample`` keeps the reference spelling so that reference configs map 1:1.
    """

    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    dropout: float = 0.0
    latent_mean: tuple[float, ...] = WAN21_LATENT_MEAN
    latent_std: tuple[float, ...] = WAN21_LATENT_STD

    def __post_init__(self) -> None:
        for name in ("dim", "z_dim", "num_res_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"WanVAEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if len(self.dim_mult) < 2 or min(self.dim_mult) < 1:
            raise ValueError(f"WanVAEConfig.dim_mult needs >= 2 positive entries, got {self.dim_mult}")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError(
                f"WanVAEConfig.temperal_downsample needs len(dim_mult) - 1 = {len(self.dim_mult) - 1} "
                f"entries (one per downsampling stage), got {len(self.temperal_downsample)}"
            )
        for name in ("latent_mean", "latent_std"):
            if len(getattr(self, name)) != self.z_dim:
                raise ValueError(
                    f"WanVAEConfig.{name} needs z_dim = {self.z_dim} values, got {len(getattr(self, name))}"
                )
        if min(self.latent_std) <= 0:
            raise ValueError(f"WanVAEConfig.latent_std must be positive, got {self.latent_std}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"WanVAEConfig.dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> WanVAEConfig:
        """Build from a config section (e.g. the golden ``config.json['vae']``).

        Keys that are not fields (descriptive ones such as ``class``, ``note``, ``pixel_h``) are
        ignored; lists become tuples.
        """
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items() if k in known}
        return cls(**kwargs)

    @property
    def temporal_factor(self) -> int:
        """Pixel frames per latent frame (after the first one)."""
        return 2 ** sum(self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        """Pixels per latent position along H and along W."""
        return 2 ** (len(self.dim_mult) - 1)


@dataclass(frozen=True)
class PatchVAEConfig:
    type: str = "patch"  # the preset's `vae.type`; Wan VAE configs have none
    patch: int = 8
    z_dim: int = 8
    hidden: int = 128
    latent_mean: tuple[float, ...] = field(default=(0.0,) * 8)
    latent_std: tuple[float, ...] = field(default=(1.0,) * 8)

    def __post_init__(self) -> None:
        if self.type != "patch":
            raise ValueError(f"PatchVAEConfig.type must be 'patch', got {self.type!r}")
        for name in ("patch", "z_dim", "hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"PatchVAEConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("latent_mean", "latent_std"):
            if len(getattr(self, name)) != self.z_dim:
                raise ValueError(f"PatchVAEConfig.{name} needs z_dim = {self.z_dim} values")
        if min(self.latent_std) <= 0:
            raise ValueError(f"PatchVAEConfig.latent_std must be positive, got {self.latent_std}")

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> PatchVAEConfig:
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items() if k in known}
        return cls(**values)

    @property
    def spatial_factor(self) -> int:
        return self.patch

    @property
    def temporal_factor(self) -> int:
        return 1


# Keys of a config ``text_encoder`` section that describe things outside this module: free text, the
# tokenizer's special ids (read from the tokenizer files instead) and training-only / decoder settings.
_NON_MODEL_KEYS = frozenset({"class", "note", "pad_id", "eos_id", "decoder_layers", "dropout"})
# Spellings used by the reference ``umt5_xxl(...)`` kwargs (and the golden configs) for our fields.
_KEY_ALIASES = {"encoder_layers": "num_layers"}


@dataclass(frozen=True)
class UMT5Config:
    """Shape of a UMT5 encoder. The defaults are the umt5-xxl encoder that Wan2.1 ships."""

    vocab_size: int = 256384
    dim: int = 4096
    dim_attn: int = 4096
    dim_ffn: int = 10240
    num_heads: int = 64
    num_layers: int = 24
    num_buckets: int = 32
    shared_pos: bool = False
    eps: float = 1e-6
    max_dist: int = 128
    text_len: int = 512

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "dim_attn", "dim_ffn", "num_heads", "num_layers", "text_len"):
            if getattr(self, name) < 1:
                raise UserError(f"text encoder config: {name} must be >= 1, got {getattr(self, name)}")
        if self.dim_attn % self.num_heads:
            raise UserError(
                f"text encoder config: dim_attn ({self.dim_attn}) must be divisible by num_heads ({self.num_heads})"
            )
        # Buckets are split in two directions, each half in an exact and a log-spaced part, so the
        # exact part (num_buckets // 4) must be non-empty and smaller than max_dist.
        if self.num_buckets < 4 or self.num_buckets % 2:
            raise UserError(f"text encoder config: num_buckets must be even and >= 4, got {self.num_buckets}")
        if self.shared_pos:
            raise UserError(
                "text encoder config: shared_pos=True (one position table for all layers, original T5) "
                "is not supported; umt5 checkpoints use shared_pos=false"
            )
        if self.max_dist <= self.num_buckets // 4:
            raise UserError(
                f"text encoder config: max_dist ({self.max_dist}) must exceed num_buckets // 4 "
                f"({self.num_buckets // 4})"
            )

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> UMT5Config:
        """Build a config from a ``text_encoder`` section (golden ``config.json`` or a preset).

        Accepts the reference spelling ``encoder_layers`` and skips descriptive or tokenizer keys;
        any other unknown key is an error, so that a typo cannot silently fall back to a default.
        """
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in section.items():
            if key in _NON_MODEL_KEYS:
                continue
            name = _KEY_ALIASES.get(key, key)
            if name not in known:
                raise UserError(
                    f"text encoder config: unknown key {key!r}; accepted keys are {sorted(known | set(_KEY_ALIASES))}"
                )
            values[name] = value
        return cls(**values)
