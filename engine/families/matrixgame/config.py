"""Matrix-Game 2.0 model hyper-parameters, read from the reference `config.json` of the DiT.

The DiT is Wan2.1-shaped (`WanDiTConfig`, 36 input channels, no text encoder); `ActionConfig`
describes the action module of the first half of the blocks (the reference's `action_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from inferix.spec.architectures import WanDiTConfig

# Channels of the DiT input: noisy latent (16) | mask (4) | VAE-encoded first image (16).
MASK_CHANNELS = 4


@dataclass(frozen=True)
class ActionConfig:
    """The action module (reference names). Heads are `rope_head_dim` wide: the action RoPE table
    is built for that width (`mouse_qk_dim_list` sums to it), so both branches use it."""

    blocks: tuple[int, ...] = tuple(range(15))
    enable_keyboard: bool = True
    enable_mouse: bool = True
    heads_num: int = 16
    hidden_size: int = 128  # width of the keyboard embedding of one raw action row
    img_hidden_size: int = 1536  # the DiT's dim
    keyboard_dim_in: int = 4
    keyboard_hidden_dim: int = 1024
    mouse_dim_in: int = 2
    mouse_hidden_dim: int = 1024
    mouse_qk_dim_list: tuple[int, ...] = (8, 28, 28)
    qk_norm: bool = True
    qkv_bias: bool = False
    rope_theta: float = 256.0
    vae_time_compression_ratio: int = 4
    windows_size: int = 3
    # Rows of the reference's action RoPE table: the latent frames an action layer can address.
    rope_max_positions: int = 7500

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))
        object.__setattr__(self, "mouse_qk_dim_list", tuple(self.mouse_qk_dim_list))
        if not self.enable_keyboard:
            raise ValueError("action_config.enable_keyboard must be true: the keyboard branch is always present")
        for name in ("keyboard_hidden_dim", "mouse_hidden_dim"):
            if getattr(self, name) != self.heads_num * self.head_dim:
                raise ValueError(
                    f"action_config.{name}={getattr(self, name)} must equal heads_num * head_dim = "
                    f"{self.heads_num} * {self.head_dim} (head_dim = sum(mouse_qk_dim_list))"
                )

    @property
    def head_dim(self) -> int:
        return sum(self.mouse_qk_dim_list)

    @property
    def window_rows(self) -> int:
        """Raw action rows (pixel frames) in the window of one latent frame."""
        return self.windows_size * self.vae_time_compression_ratio

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActionConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class MatrixGameConfig:
    """The whole DiT: the Wan backbone, the action module and the CLIP token width it projects."""

    dit: WanDiTConfig
    action: ActionConfig
    clip_dim: int = 1280

    def __post_init__(self) -> None:
        if self.dit.in_dim != 2 * self.dit.out_dim + MASK_CHANNELS:
            raise ValueError(
                f"in_dim={self.dit.in_dim} must be 2 * out_dim + {MASK_CHANNELS} (latent | mask | image latent)"
            )
        if self.action.img_hidden_size != self.dit.dim:
            raise ValueError(f"action_config.img_hidden_size={self.action.img_hidden_size} != dim={self.dit.dim}")
        if any(not 0 <= b < self.dit.num_layers for b in self.action.blocks):
            raise ValueError(f"action_config.blocks {self.action.blocks} must lie in [0, {self.dit.num_layers})")

    @classmethod
    def from_reference(cls, config: Mapping[str, Any], clip_dim: int = 1280) -> MatrixGameConfig:
        """From the reference DiT `config.json` (`CausalWanModel.from_config`); `clip_dim` is the
        width of the CLIP tokens (the reference hard-codes the released 1280)."""
        return cls(WanDiTConfig.from_dict(dict(config)), ActionConfig.from_dict(config["action_config"]), clip_dim)
