"""MAGI-1 ViT VAE decoder (``ViTVAE.decoder`` of SandAI-org/MAGI-1) with the reference's tiled chunk decode.

Only the decoder is built: text-to-video never encodes. Parameter names equal the reference state dict
(``decoder.*``), so the released ``ckpt/vae`` folder (``config.json`` with the ``ddconfig`` +
``diffusion_pytorch_model.safetensors`` holding ``encoder.*`` and ``decoder.*``) and the golden
``vae.safetensors`` load strictly once the ``encoder.*`` tensors are dropped.

Layouts: latents ``[B, z_chans, T, h, w]`` (the reference's NCTHW), raw video ``[B, 3, F, 8h, 8w]`` in about
[-1, 1]; `MagiVAEDecoder.decode_chunk` returns uint8 frames ``[F, 8h, 8w, 3]`` (the engine's layout).

Decoding an emitted chunk (reference ``post_chunk_process``): ``z = latents / scale_factor``, then tiles of
``tile_latent_frames`` latent frames (``fps // 2`` pixel frames) are decoded independently and concatenated
in time (no temporal overlap, no context between tiles or chunks). Spatially, tiles of 32 latents start
every 24; each tile's first rows / columns are cross-faded with the *raw* (unblended) tile above / to the
left over ``min(64 px, both sizes)``, then every tile is cropped to 192 px and the tiles are concatenated.
A tile of ``n`` latent frames gives ``4n`` pixel frames, except ``n = 1``, which gives 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import load_into, read_state_dict
from inferix.errors import CheckpointError, UserError
from inferix.spec.families.magi import tiled_frames

__all__ = [
    "DEFAULT_FPS",
    "DEFAULT_SCALE_FACTOR",
    "MagiVAEDecoder",
    "ViTVAEConfig",
    "load_magi_vae",
    "read_vae_config",
    "to_uint8_frames",
]

DEFAULT_SCALE_FACTOR = 0.18215  # MagiConfig.runtime_config.scale_factor
DEFAULT_FPS = 24
# The reference's TileProcessor settings in post_chunk_process: 256 px tiles, a quarter of them overlapped.
TILE_PIXELS = 256
SPATIAL_OVERLAP = 0.25
NORM_EPS = 1e-5  # nn.LayerNorm default (norm2, final norm) and the parameter-free q/k/v norm

VAE_CONFIG = "config.json"
VAE_WEIGHTS = "diffusion_pytorch_model.safetensors"
ENCODER_PREFIX = "encoder."
MAX_LISTED_KEYS = 5

# ddconfig flags the reference ViTDecoder needs at these values: other values either assert in the reference
# (conv_last_layer), break its pos-embed resize (with_cls_token), or take code paths no released VAE uses.
_REQUIRED_FLAGS = {"conv_last_layer": True, "ln_in_attn": True, "with_cls_token": True}
_UNSUPPORTED_FLAGS = ("use_rope", "use_final_proj")
_FLAG_DEFAULTS = {"conv_last_layer": False, "ln_in_attn": False, "with_cls_token": True}  # ViTDecoder's own
_ARCH_KEYS = ("video_size", "video_length", "patch_size", "patch_length", "z_chans", "embed_dim", "depth",
              "num_heads", "mlp_ratio", "qkv_bias")  # fmt: skip


@dataclass(frozen=True)
class ViTVAEConfig:
    """Decoder hyper-parameters (the ``ddconfig`` of the released ``ckpt/vae/config.json``) and decode settings.

    ``video_size`` / ``video_length`` only size the learned position table (``video_length // patch_length``
    x ``(video_size // patch_size)**2`` entries, resized trilinearly to every tile).
    """

    video_size: int
    video_length: int
    patch_size: int
    patch_length: int
    z_chans: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    qkv_bias: bool = True
    scale_factor: float = DEFAULT_SCALE_FACTOR
    # Defaults: the released VAE (patch_length 4, patch_size 8) at 24 fps; from_ddconfig derives them.
    tile_latent_frames: int = (DEFAULT_FPS // 2) // 4
    tile_latent_size: int = TILE_PIXELS // 8
    spatial_overlap: float = SPATIAL_OVERLAP

    def __post_init__(self) -> None:
        for name in ("video_size", "video_length", "patch_size", "patch_length", "z_chans", "embed_dim", "depth",
                     "num_heads", "tile_latent_frames", "tile_latent_size"):  # fmt: skip
            if getattr(self, name) < 1:
                raise UserError(f"MAGI-1 VAE config: {name} must be >= 1, got {getattr(self, name)}")
        if self.embed_dim % self.num_heads:
            raise UserError(f"MAGI-1 VAE config: embed_dim {self.embed_dim} is not a multiple of num_heads")
        if self.embed_dim % self.patch_volume:
            raise UserError(
                f"MAGI-1 VAE config: embed_dim {self.embed_dim} is not a multiple of patch_length * patch_size**2 "
                f"= {self.patch_volume}"
            )
        if self.video_size < self.patch_size or self.video_length < self.patch_length:
            raise UserError("MAGI-1 VAE config: video_size / video_length must cover at least one patch")
        if not 0.0 <= self.spatial_overlap < 1.0 or self.tile_stride < 1:
            raise UserError(f"MAGI-1 VAE config: spatial_overlap must be in [0, 1), got {self.spatial_overlap}")
        if self.scale_factor <= 0:
            raise UserError(f"MAGI-1 VAE config: scale_factor must be positive, got {self.scale_factor}")

    @classmethod
    def from_ddconfig(
        cls, ddconfig: Mapping[str, Any], *, scale_factor: float = DEFAULT_SCALE_FACTOR, fps: int = DEFAULT_FPS
    ) -> ViTVAEConfig:
        """From a ViTVAE ``ddconfig`` (or the whole ``config.json`` dict that wraps it) and the runtime settings.

        ``fps`` sets the temporal tile like the reference: ``fps // 2`` pixel frames = ``fps // 2 //
        patch_length`` latent frames (3 at 24 fps).
        """
        if "ddconfig" in ddconfig:
            if ddconfig.get("model_type", "vit") != "vit":
                raise UserError(f"MAGI-1 VAE model_type {ddconfig['model_type']!r} is not supported; expected 'vit'")
            ddconfig = ddconfig["ddconfig"]
        missing = [key for key in _ARCH_KEYS if key not in ddconfig]
        if missing:
            raise UserError(f"MAGI-1 VAE ddconfig lacks {missing}; it must hold {list(_ARCH_KEYS)}")
        _check_flags(ddconfig)
        patch_size, patch_length = int(ddconfig["patch_size"]), int(ddconfig["patch_length"])
        tile_frames = (fps // 2) // patch_length
        if tile_frames < 1:
            raise UserError(f"fps {fps} is too low for the MAGI-1 VAE: fps // 2 must be >= patch_length {patch_length}")
        return cls(
            **{key: int(ddconfig[key]) for key in _ARCH_KEYS if key not in ("mlp_ratio", "qkv_bias")},
            mlp_ratio=float(ddconfig["mlp_ratio"]),
            qkv_bias=bool(ddconfig["qkv_bias"]),
            scale_factor=scale_factor,
            tile_latent_frames=tile_frames,
            tile_latent_size=TILE_PIXELS // patch_size,
        )

    @property
    def patch_volume(self) -> int:
        return self.patch_length * self.patch_size * self.patch_size

    @property
    def unpatch_channels(self) -> int:
        """Channels per pixel after unpatchifying the tokens (the input of the last conv)."""
        return self.embed_dim // self.patch_volume

    @property
    def pos_grid(self) -> tuple[int, int, int]:
        """(T, H, W) latent grid the learned position table was trained for."""
        side = self.video_size // self.patch_size
        return self.video_length // self.patch_length, side, side

    @property
    def tile_stride(self) -> int:
        """Latent distance between spatial tile starts (24 for 32-latent tiles)."""
        return int(self.tile_latent_size * (1 - self.spatial_overlap))

    @property
    def blend_pixels(self) -> int:
        """Cross-fade width between neighbouring spatial tiles, in pixels (64)."""
        return int(self.tile_latent_size * self.patch_size * self.spatial_overlap)

    @property
    def crop_pixels(self) -> int:
        """Pixels kept per spatial tile after blending (192)."""
        return self.tile_latent_size * self.patch_size - self.blend_pixels

    def pixel_frames(self, latent_frames: int) -> int:
        """Frames `MagiVAEDecoder.tiled_decode` makes from ``latent_frames`` (3 -> 12, 4 -> 13, 2 -> 8)."""
        return tiled_frames(latent_frames, self.tile_latent_frames, self.patch_length)


def _check_flags(ddconfig: Mapping[str, Any]) -> None:
    for name, value in _REQUIRED_FLAGS.items():
        if bool(ddconfig.get(name, _FLAG_DEFAULTS[name])) != value:
            raise UserError(f"MAGI-1 VAE ddconfig {name}={ddconfig.get(name)!r} is not supported; expected {value}")
    for name in _UNSUPPORTED_FLAGS:
        if ddconfig.get(name, False):
            raise UserError(f"MAGI-1 VAE ddconfig {name}=true is not supported (the released VAE has it false)")


# ---- the ViT decoder --------------------------------------------------------------------------------------
class Attention(nn.Module):
    """Self-attention whose q, k and v are each normalised per head (``ln_in_attn``), without affine terms."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, dim = x.shape
        qkv = _qkv_norm(self.qkv(x).reshape(b, n, 3, self.num_heads, dim // self.num_heads))
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # [B, heads, N, head_dim]
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, dim))


def _qkv_norm(x: Tensor) -> Tensor:
    # The reference's ManualLayerNorm: eps is added to the (biased) std, not to the variance.
    mean = x.mean(dim=-1, keepdim=True)
    std = x.std(dim=-1, keepdim=True, correction=0)
    return (x - mean) / (std + NORM_EPS)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """``x += attn(x)`` (no pre-norm: the norm sits inside the attention), ``x += mlp(norm2(x))``."""

    def __init__(self, config: ViTVAEConfig) -> None:
        super().__init__()
        dim = config.embed_dim
        self.attn = Attention(dim, config.num_heads, config.qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, int(dim * config.mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(x)
        return x + self.mlp(self.norm2(x))


class ViTDecoder(nn.Module):
    """Latent tokens -> transformer -> one ``pT x pH x pW`` patch of ``unpatch_channels`` per token -> 3x3x3 conv."""

    def __init__(self, config: ViTVAEConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embed_dim
        t, h, w = config.pos_grid
        self.proj_in = nn.Linear(config.z_chans, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + t * h * w, dim))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(dim, eps=NORM_EPS)
        self.last_layer = nn.Conv3d(config.unpatch_channels, 3, kernel_size=3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        b, c, t, h, w = z.shape
        x = self.proj_in(z.permute(0, 2, 3, 4, 1).reshape(b, t * h * w, c))
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1) + self._pos_embed((t, h, w))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)[:, 1:]
        return self.last_layer(self._unpatchify(x, (t, h, w)))

    def _pos_embed(self, grid: tuple[int, int, int]) -> Tensor:
        """The position table for a ``grid`` of latents; the cls entry is never resized."""
        if grid == self.config.pos_grid:
            return self.pos_embed
        table = self.pos_embed[:, 1:].reshape(1, *self.config.pos_grid, -1).permute(0, 4, 1, 2, 3)
        table = F.interpolate(table, size=grid, mode="trilinear", align_corners=False)
        table = table.permute(0, 2, 3, 4, 1).reshape(1, grid[0] * grid[1] * grid[2], -1)
        return torch.cat((self.pos_embed[:, :1], table), dim=1)

    def _unpatchify(self, x: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """``[B, T*H*W, E]`` -> ``[B, Cu, T*pT, H*p, W*p]``; each token's features are ordered (pT, pH, pW, Cu)."""
        cfg = self.config
        (t, h, w), pt, p, cu = grid, cfg.patch_length, cfg.patch_size, cfg.unpatch_channels
        x = x.reshape(x.shape[0], t, h, w, pt, p, p, cu).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], cu, t * pt, h * p, w * p)


# ---- decoding ---------------------------------------------------------------------------------------------
class MagiVAEDecoder(nn.Module):
    """The MAGI-1 VAE decoder; its state dict is the reference ``ViTVAE`` one without ``encoder.*``."""

    def __init__(self, config: ViTVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.decoder = ViTDecoder(config)

    @torch.no_grad()
    def decode_tile(self, z: Tensor) -> Tensor:
        """Decode ``[B, z_chans, T, h, w]`` in one piece -> raw ``[B, 3, F, 8h, 8w]`` in the weights' dtype.

        ``F = 4T``, except that one latent frame gives one pixel frame (the first of its 4, like the reference).
        """
        self._check_latents(z)
        raw = self.decoder(z.to(self.decoder.proj_in.weight.dtype))
        return raw[:, :, :1] if z.shape[2] == 1 else raw

    @torch.no_grad()
    def tiled_decode(self, z: Tensor) -> Tensor:
        """Decode ``[B, z_chans, T, h, w]`` tile by tile like the reference -> float32 ``[B, 3, F, 8h, 8w]``.

        ``z`` is already divided by the scale factor. ``F = config.pixel_frames(T)``.
        """
        self._check_latents(z)
        step = self.config.tile_latent_frames
        # Temporal overlap is 0 in the reference: time tiles are decoded apart and simply concatenated.
        return torch.cat([self._decode_spatial_tiles(z[:, :, f : f + step]) for f in range(0, z.shape[2], step)], 2)

    def decode_chunk(self, latents: Tensor) -> np.ndarray:
        """An emitted chunk ``[1, z_chans, cw, h, w]`` (DiT latents) -> uint8 frames ``[F, 8h, 8w, 3]``.

        A batch B > 1 gives its videos' frames one after another (the reference's ``(b t)`` flattening).
        """
        return to_uint8_frames(self.tiled_decode(latents.float() / self.config.scale_factor))

    def _decode_spatial_tiles(self, z: Tensor) -> Tensor:
        """One time tile: spatial tiles decoded separately, blended with their raw upper / left neighbours."""
        cfg = self.config
        rows: list[Tensor] = []
        above: list[Tensor] = []  # the previous row's raw tiles: blending reads only unblended neighbours
        for i in range(0, z.shape[3], cfg.tile_stride):
            raw = self._decode_row(z[:, :, :, i : i + cfg.tile_latent_size])
            pieces = []
            for col, tile in enumerate(raw):
                if above:
                    tile = _blend(above[col], tile, dim=3, extent=cfg.blend_pixels)
                if col > 0:
                    tile = _blend(raw[col - 1], tile, dim=4, extent=cfg.blend_pixels)
                pieces.append(tile[:, :, :, : cfg.crop_pixels, : cfg.crop_pixels])
            rows.append(torch.cat(pieces, dim=4))
            above = raw
        return torch.cat(rows, dim=3)

    def _decode_row(self, z: Tensor) -> list[Tensor]:
        """The raw fp32 decodes of one row of spatial tiles, left to right."""
        size, stride = self.config.tile_latent_size, self.config.tile_stride
        return [self.decode_tile(z[..., j : j + size]).float() for j in range(0, z.shape[4], stride)]

    def _check_latents(self, z: Tensor) -> None:
        if z.ndim != 5 or z.shape[1] != self.config.z_chans or 0 in z.shape:
            raise ValueError(
                f"MAGI-1 VAE latents must be [B, {self.config.z_chans}, T, h, w] and non-empty, got {tuple(z.shape)}"
            )


def _blend(before: Tensor, tile: Tensor, dim: int, extent: int) -> Tensor:
    """Cross-fade the first ``e`` rows of ``tile`` along ``dim`` from the last ``e`` rows of ``before``.

    ``e = min(extent, both sizes)``; row ``y`` becomes ``before[-e + y] * (1 - y/e) + tile[y] * (y/e)``.
    """
    e = min(before.shape[dim], tile.shape[dim], extent)
    if e == 0:
        return tile
    # The weights are rounded from float64 like the reference's Python-float factors, so results match bitwise.
    shape = [1] * tile.ndim
    shape[dim] = e
    ramp = torch.arange(e, dtype=torch.float64, device=tile.device) / e
    w_tile = ramp.to(tile.dtype).reshape(shape)
    w_before = (1 - ramp).to(tile.dtype).reshape(shape)
    head = before.narrow(dim, before.shape[dim] - e, e) * w_before + tile.narrow(dim, 0, e) * w_tile
    return torch.cat((head, tile.narrow(dim, e, tile.shape[dim] - e)), dim=dim)


def to_uint8_frames(raw: Tensor) -> np.ndarray:
    """Raw decoder output ``[B, 3, F, H, W]`` -> uint8 ``[B*F, H, W, 3]``, truncating like ``.type(torch.uint8)``."""
    pixels = (raw.float() * 127.5 + 127.5).clamp(0, 255).to(torch.uint8)  # float -> uint8 truncates, no rounding
    return pixels.permute(0, 2, 3, 4, 1).reshape(-1, *pixels.shape[3:], 3).cpu().numpy()


# ---- loading ----------------------------------------------------------------------------------------------
def load_magi_vae(
    path: str | Path,
    config: ViTVAEConfig | None = None,
    dtype: torch.dtype | None = torch.float32,
    device: torch.device | str = "cpu",
) -> MagiVAEDecoder:
    """Load the decoder from the released VAE folder or from one ``.safetensors`` / torch state-dict file.

    A folder holds ``config.json`` (``{"_class_name": "ViTVAE", "ddconfig": {...}}``) and
    ``diffusion_pytorch_model.safetensors``; ``config`` overrides its ``config.json`` (e.g. for another fps).
    A single file needs ``config``. ``encoder.*`` tensors are ignored; any other missing or unexpected key is
    a `CheckpointError` naming the file and the keys.
    """
    path = Path(path)
    if path.is_dir():
        weights = path / VAE_WEIGHTS
        config = config or read_vae_config(path / VAE_CONFIG)
    elif config is None:
        raise UserError(
            f"MAGI-1 VAE {path} is a single file: pass its ViTVAEConfig, or give the VAE folder "
            f"({VAE_CONFIG} + {VAE_WEIGHTS})"
        )
    else:
        weights = path
    hint = "expected the MAGI-1 ViTVAE weights (ckpt/vae of sand-ai/MAGI-1)"
    # T2V never encodes: the released file's encoder.* tensors are dropped before the strict key check.
    state = {
        name: tensor
        for name, tensor in read_state_dict(weights, "MAGI-1 VAE checkpoint", hint).items()
        if not name.startswith(ENCODER_PREFIX)
    }
    arch: ViTVAEConfig = config
    _check_keys(_expected_keys(arch), state, weights)
    return load_into(
        lambda: MagiVAEDecoder(arch),
        state,
        weights,
        dtype=dtype,
        device=device,
        what="MAGI-1 VAE decoder",
        hint="check the VAE config (ddconfig)",
    )


def read_vae_config(config_path: Path, *, fps: int = DEFAULT_FPS) -> ViTVAEConfig:
    """The `ViTVAEConfig` of a released VAE folder's ``config.json``."""
    if not config_path.is_file():
        raise CheckpointError(f"MAGI-1 VAE folder {config_path.parent} has no {VAE_CONFIG}")
    try:
        content = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {config_path}: {exc}") from exc
    if not isinstance(content, dict) or not isinstance(content.get("ddconfig"), dict):
        raise CheckpointError(f"{config_path} must be a JSON object with a 'ddconfig' object (a ViTVAE config)")
    return ViTVAEConfig.from_ddconfig(content, fps=fps)


def _expected_keys(config: ViTVAEConfig) -> set[str]:
    with torch.device("meta"):  # names only: no memory, no init cost
        return set(MagiVAEDecoder(config).state_dict())


def _check_keys(expected: set[str], state: Mapping[str, Tensor], source: Path) -> None:
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not match the MAGI-1 VAE decoder: {len(missing)} missing keys {_few(missing)}, "
            f"{len(unexpected)} unexpected keys {_few(unexpected)} (encoder.* keys are ignored)"
        )


def _few(keys: list[str]) -> str:
    more = len(keys) - MAX_LISTED_KEYS
    return "[" + ", ".join(keys[:MAX_LISTED_KEYS]) + (f", ... {more} more" if more > 0 else "") + "]"
