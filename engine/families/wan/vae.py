"""Wan2.1 video VAE (causal 3D conv autoencoder) with exact streaming decode.

Parameter names equal the reference ``WanVAE_`` state dict (``encoder.*``, ``conv1.*``, ``conv2.*``,
``decoder.*``), so ``Wan2.1_VAE.pth`` and the golden ``vae.safetensors`` load with ``strict=True``.

Layouts (pipeline layout, frames before channels, like every other engine tensor):

* latents: ``[B, F, z_dim, h, w]``, normalised with the Wan2.1 per-channel mean/std;
* video:   ``[B, T, 3, H, W]`` in ``[-1, 1]`` (``to_unit_range`` gives the pipeline's ``[0, 1]``),
  with ``H = h * 8``, ``W = w * 8`` and ``T = 1 + 4 * (F - 1)`` for a whole video.

Why the decoder runs one latent frame at a time: that is what the reference does, and every
temporal operator is causal, so a per-conv cache of the trailing input frames makes the result
independent of how the latent sequence is cut into blocks.  ``decode`` and ``decode_block`` share
that single code path, hence block-by-block streaming is bit-identical to one-shot decoding.

The *first-frame rule*: both temporal upsamplers let latent frame 0 through their time conv
untouched (1 pixel frame); every later latent frame yields 4 pixel frames, and frame 0 never enters
the time conv's history (it starts with two zero frames).  So 3-latent blocks give 9, 12, 12, ...
pixel frames.

Spatially tiled decoding is deliberately not offered: the middle attention block mixes every
position of a frame, so no finite tile overlap is exact.  Peak memory is already bounded by the
per-latent-frame decoding (activations of one latent frame at a time plus the two-frame caches).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import load_into, read_state_dict
from engine.precision import onednn_dtype
from inferix.spec.architectures import WanVAEConfig

__all__ = [
    "VAEDecodeState",
    "WanVAE",
    "to_unit_range",
]


# One cached tensor (or None before the first chunk) per cache slot of an encoder or decoder.
FrameCache = list[Tensor | None]
# A 2D conv's padding or stride: one int for both sides, or (h, w).
Size2 = int | tuple[int, int]


def _memory_format(channels_last: bool, dims: int) -> torch.memory_format:
    """The channels-last memory format of ``dims``-dim tensors (4: NHWC, 5: NTHWC), or the contiguous one."""
    if not channels_last:
        return torch.contiguous_format
    return torch.channels_last_3d if dims == 5 else torch.channels_last


def _is_channels_last(x: Tensor) -> bool:
    """Whether ``x`` [B, C, ...] (4 or 5 dims) stores its channels innermost (NHWC / NTHWC)."""
    return x.dim() in (4, 5) and x.is_contiguous(memory_format=_memory_format(True, x.dim())) and not x.is_contiguous()


def _frames_to_batch(x: Tensor) -> Tensor:
    """[B, C, T, H, W] -> [B*T, C, H, W], for the per-frame 2D layers."""
    if _is_channels_last(x):  # via [B*T, H, W, C], see _batch_to_frames
        return x.permute(0, 2, 3, 4, 1).flatten(0, 1).permute(0, 3, 1, 2)
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def _batch_to_frames(x: Tensor, batch: int) -> Tensor:
    """Inverse of ``_frames_to_batch``."""
    # Via [BT, H, W, C]: a view of a size-1 dim may get strides that PyTorch no longer reads as
    # channels-last, and the next op would then fall back to the contiguous layout.
    if _is_channels_last(x):
        return x.permute(0, 2, 3, 1).unflatten(0, (batch, -1)).permute(0, 4, 1, 2, 3)
    bt, c, h, w = x.shape
    return x.view(batch, bt // batch, c, h, w).permute(0, 2, 1, 3, 4)


class RMSNorm(nn.Module):
    """Channel RMS norm of the reference: ``normalize(x, dim=1) * sqrt(C) * gamma`` (no bias in the VAE).

    ``spatial_dims`` only sets gamma's shape (3 for video [B,C,T,H,W], 2 for frames [B,C,H,W]), which
    must match the checkpoint.
    """

    def __init__(self, dim: int, spatial_dims: int) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *([1] * spatial_dims)))

    def forward(self, x: Tensor) -> Tensor:
        # In place after the first op: the same values as ``normalize(x) * scale * gamma`` without
        # two full-size temporaries (x * (scale / norm) would save a pass but round differently).
        return F.normalize(x, dim=1).mul_(self.scale).mul_(self.gamma)


def _zero_frames(like: Tensor, frames: int) -> Tensor:
    """Zero history frames [B, C, frames, H, W] in the memory layout of ``like`` (for the causal caches)."""
    b, c, _, h, w = like.shape
    fmt = _memory_format(_is_channels_last(like), 5)
    return torch.empty(b, c, frames, h, w, dtype=like.dtype, device=like.device, memory_format=fmt).zero_()


def conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride: int = 1, padding: Size2 = 0) -> Tensor:
    """``F.conv2d`` that keeps a channels-last ``x`` channels-last.

    There, a 1x1 conv is a matmul over the innermost channels (PyTorch runs a single-threaded 1x1
    conv2d with a slow generic kernel and a contiguous output), and other kernels get the weight
    in the same layout (PyTorch picks the output layout from the input's strides, which a batch of
    one does not always show, or from the weight's).
    """
    if not _is_channels_last(x):  # a weight left channels-last by a channels-last decode would switch layouts
        return F.conv2d(x, weight.contiguous(), bias, stride, padding)
    if weight.shape[-2:] == (1, 1) and stride == 1 and padding == 0:
        return F.linear(x.permute(0, 2, 3, 1), weight.flatten(1), bias).permute(0, 3, 1, 2)
    return F.conv2d(x, weight.contiguous(memory_format=_memory_format(True, 4)), bias, stride, padding)


def _time_taps(parts: list[Tensor], kt: int) -> Tensor:
    """[B, kt*C, T_out, H, W] whose channel group i holds frames i .. i+T_out-1 of ``parts`` joined in
    time (T_out = T_in - kt + 1), written in place: the joined sequence itself is never built."""
    b, c, _, h, w = parts[-1].shape
    t_out = sum(p.shape[2] for p in parts) - kt + 1
    fmt = _memory_format(_is_channels_last(parts[-1]), 5)
    taps = torch.empty(b, kt * c, t_out, h, w, dtype=parts[-1].dtype, device=parts[-1].device, memory_format=fmt)
    for i in range(kt):
        offset = 0  # of the part in the joined sequence
        for part in parts:
            lo, hi = max(i, offset), min(i + t_out, offset + part.shape[2])
            if lo < hi:
                taps[:, i * c : (i + 1) * c, lo - i : hi - i] = part[:, :, lo - offset : hi - offset]
            offset += part.shape[2]
    return taps


def conv3d(x: Tensor, weight: Tensor, bias: Tensor | None, padding: Size2 = 0, past: Tensor | None = None) -> Tensor:
    """Stride-1 3D convolution of ``cat([past, x])`` (time), unpadded in time and zero-padded by
    ``padding`` (h, w) in space.

    On the CPU, PyTorch's conv3d picks a slow generic kernel for the small inputs of a streaming
    decode (one to four frames; over 80% of decode time).  A channels-last input (see
    ``WanVAE.channels_last``) goes to oneDNN's 3D kernel directly, which reads that layout as it is;
    a 1x1x1 kernel is a matmul over the innermost channels.  Otherwise the kt time taps are folded
    into the channel axis of one oneDNN 2D convolution.  Each path sums in its own order, so they
    differ by float rounding (~1e-6 relative), identically for one-shot and streaming decode.
    """
    out_c, c, kt, kh, kw = weight.shape
    pad = (padding, padding) if isinstance(padding, int) else padding
    cpu_channels_last = x.device.type == "cpu" and _is_channels_last(x)
    if cpu_channels_last and (kt, kh, kw) == (1, 1, 1):
        return F.linear(x.permute(0, 2, 3, 4, 1), weight.flatten(1), bias).permute(0, 4, 1, 2, 3)
    # torch.mkldnn_convolution has no fake-tensor kernel: a traced (compiled) graph takes the fold.
    if x.device.type != "cpu" or (cpu_channels_last and not torch.compiler.is_compiling() and onednn_dtype(x.dtype)):
        joined = x if past is None else torch.cat([past, x], dim=2)
        if x.device.type != "cpu":
            return F.conv3d(joined, weight, bias, padding=(0, *pad))
        weight = weight.contiguous(memory_format=_memory_format(True, 5))
        return torch.mkldnn_convolution(joined, weight, bias, (0, *pad), (1, 1, 1), (1, 1, 1), 1)
    taps = _time_taps([x] if past is None else [past, x], kt) if kt > 1 else x
    frames = _frames_to_batch(taps)
    if not cpu_channels_last:  # else oneDNN picks its layout from the strides of this view: keep one layout
        frames = frames.contiguous()
    folded = weight.permute(0, 2, 1, 3, 4).reshape(out_c, kt * c, kh, kw)
    return _batch_to_frames(conv2d(frames, folded, bias, padding=padding), x.shape[0])


class PointwiseConv3d(nn.Conv3d):
    """1x1x1 Conv3d (checkpoint names of nn.Conv3d) that uses the fast CPU path of `conv3d`."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(in_dim, out_dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        return conv3d(x, self.weight, self.bias)


class CausalConv3d(nn.Conv3d):
    """3D conv, causal in time: output frame t sees input frames t-k+1 .. t, spatially 'same'.

    The ``k - 1`` frames of history come from ``cache[self.slot]`` (zeros before the first chunk)
    and are updated with the trailing input frames, so chunked calls equal one full-sequence call.
    ``slot`` is assigned by the owning ``Encoder3d`` / ``Decoder3d``.
    """

    def __init__(self, in_dim: int, out_dim: int, kernel_size: int | tuple[int, int, int]) -> None:
        super().__init__(in_dim, out_dim, kernel_size)
        kt, kh, kw = self.kernel_size
        self.history = kt - 1
        self.spatial_padding = (kh // 2, kw // 2)
        self.slot = -1

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:  # type: ignore[override]
        past = cache[self.slot]
        if past is None:
            past = _zero_frames(x, self.history)
        t = x.shape[2]
        cache[self.slot] = x[:, :, -self.history :].clone() if t >= self.history else torch.cat([past[:, :, t:], x], 2)
        # Zero padding inside the conv kernel: no padded copy of the input.
        return conv3d(x, self.weight, self.bias, self.spatial_padding, past)


class ResidualBlock(nn.Module):
    """(RMSNorm, SiLU, CausalConv3d) x 2 plus a 1x1x1 conv shortcut when the width changes."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(in_dim, spatial_dims=3),
            nn.SiLU(inplace=True),
            CausalConv3d(in_dim, out_dim, 3),
            RMSNorm(out_dim, spatial_dims=3),
            nn.SiLU(inplace=True),
            nn.Dropout(dropout),
            CausalConv3d(out_dim, out_dim, 3),
        )
        self.shortcut: nn.Module = PointwiseConv3d(in_dim, out_dim) if in_dim != out_dim else nn.Identity()

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        return _run(self.residual, x, cache).add_(self.shortcut(x))


class AttentionBlock(nn.Module):
    """Single-head self-attention over the H*W positions of each frame (no temporal mixing)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, spatial_dims=2)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        y = conv2d(self.norm(_frames_to_batch(x)), self.to_qkv.weight, self.to_qkv.bias)
        q, k, v = y.flatten(2).transpose(1, 2).contiguous().unsqueeze(1).chunk(3, dim=-1)  # [BT, 1, HW, C] each
        y = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(C)
        y = y.squeeze(1).permute(0, 2, 1).reshape(b * t, c, h, w)  # a channels-last view: keep x's layout
        y = y.contiguous(memory_format=_memory_format(_is_channels_last(x), 4))
        return _batch_to_frames(conv2d(y, self.proj.weight, self.proj.bias), b) + x


class Resample(nn.Module):
    """Spatial x2 up/down-sampling per frame, optionally with temporal x2 (``*3d`` modes).

    * ``upsample2d/3d``: nearest x2 then Conv2d(dim -> dim/2).  ``upsample3d`` first runs a causal
      time conv (dim -> 2*dim) whose two channel halves become two consecutive frames, except for
      the very first chunk (first-frame rule, see the module docstring).
    * ``downsample2d/3d``: pad right/bottom by 1 then stride-2 Conv2d.  ``downsample3d`` then halves
      time with a stride-2 conv over (previous chunk's last frame, chunk); the first chunk passes
      through, so frame 0 keeps a latent frame of its own.  ``slot`` holds that last frame.
    """

    MODES = ("upsample2d", "upsample3d", "downsample2d", "downsample3d")

    def __init__(self, dim: int, mode: str) -> None:
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"Resample mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode
        self.slot = -1
        self.time_conv: nn.Module
        if mode.startswith("upsample"):
            self.resample = nn.Sequential(
                nn.Upsample(scale_factor=2.0, mode="nearest-exact"), nn.Conv2d(dim, dim // 2, 3, padding=1)
            )
            if mode == "upsample3d":
                self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
            if mode == "downsample3d":
                self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        if self.mode == "upsample3d":
            x = self._upsample_time(x, cache)
        frames = _frames_to_batch(x)
        for layer in self.resample:
            if isinstance(layer, nn.Conv2d):  # square kernels, strides and paddings
                frames = conv2d(frames, layer.weight, layer.bias, layer.stride[0], int(layer.padding[0]))
            else:
                frames = layer(frames)
        x = _batch_to_frames(frames, x.shape[0])
        if self.mode == "downsample3d":
            x = self._downsample_time(x, cache)
        return x

    def _upsample_time(self, x: Tensor, cache: FrameCache) -> Tensor:
        conv = self.time_conv
        assert isinstance(conv, CausalConv3d)
        if cache[conv.slot] is None:
            # First chunk: no time conv; the next chunk starts from zero history, never from frame 0.
            cache[conv.slot] = _zero_frames(x, conv.history)
            return x
        y = conv(x, cache)
        b, c2, t, h, w = y.shape
        # Channel half k of frame t becomes frame 2t + k, in the layout y has.
        if _is_channels_last(y):
            frames = y.permute(0, 2, 3, 4, 1).unflatten(-1, (2, c2 // 2)).permute(0, 1, 4, 2, 3, 5)  # [B,T,2,H,W,C]
            return frames.contiguous().flatten(1, 2).permute(0, 4, 1, 2, 3)
        return y.view(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)

    def _downsample_time(self, x: Tensor, cache: FrameCache) -> Tensor:
        past = cache[self.slot]
        cache[self.slot] = x[:, :, -1:].clone()
        if past is None:
            return x
        return self.time_conv(torch.cat([past, x], dim=2))


_CACHED = (CausalConv3d, ResidualBlock, Resample)


def _run(layers: Iterable[nn.Module], x: Tensor, cache: FrameCache) -> Tensor:
    """Apply ``layers`` in order, handing the frame cache to the layers that keep temporal state."""
    for layer in layers:
        x = layer(x, cache) if isinstance(layer, _CACHED) else layer(x)
    return x


def _number_cache_slots(root: nn.Module) -> int:
    """Give every stateful module under ``root`` its index in the frame cache; return the count."""
    stateful = [
        m
        for m in root.modules()
        if isinstance(m, CausalConv3d) or (isinstance(m, Resample) and m.mode == "downsample3d")
    ]
    for slot, module in enumerate(stateful):
        module.slot = slot
    return len(stateful)


class Encoder3d(nn.Module):
    """Video [B,3,T,H,W] -> posterior parameters [B, 2*z_dim, 1+(T-1)/4, H/8, W/8]."""

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        dims = [cfg.dim * m for m in (1, *cfg.dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3)
        layers: list[nn.Module] = []
        scale = 1.0
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(in_dim, out_dim, cfg.dropout))
                if scale in cfg.attn_scales:
                    layers.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if i < len(cfg.temperal_downsample):
                layers.append(Resample(out_dim, "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"))
                scale /= 2.0
        self.downsamples = nn.Sequential(*layers)
        self.middle = nn.Sequential(
            ResidualBlock(dims[-1], dims[-1], cfg.dropout),
            AttentionBlock(dims[-1]),
            ResidualBlock(dims[-1], dims[-1], cfg.dropout),
        )
        self.head = nn.Sequential(
            RMSNorm(dims[-1], spatial_dims=3), nn.SiLU(inplace=True), CausalConv3d(dims[-1], 2 * cfg.z_dim, 3)
        )
        self.num_cache_slots = _number_cache_slots(self)

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        x = self.conv1(x, cache)
        x = _run(self.downsamples, x, cache)
        x = _run(self.middle, x, cache)
        return _run(self.head, x, cache)


class Decoder3d(nn.Module):
    """Latent chunk [B, z_dim, t, h, w] -> pixels [B, 3, t', 8h, 8w] (t' per the first-frame rule)."""

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        dims = [cfg.dim * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
        temporal_upsample = cfg.temperal_downsample[::-1]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3)
        self.middle = nn.Sequential(
            ResidualBlock(dims[0], dims[0], cfg.dropout),
            AttentionBlock(dims[0]),
            ResidualBlock(dims[0], dims[0], cfg.dropout),
        )
        layers: list[nn.Module] = []
        scale = 1.0 / 2 ** (len(cfg.dim_mult) - 2)
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            if i > 0:  # the previous stage's Resample halved the width
                in_dim //= 2
            for _ in range(cfg.num_res_blocks + 1):
                layers.append(ResidualBlock(in_dim, out_dim, cfg.dropout))
                if scale in cfg.attn_scales:
                    layers.append(AttentionBlock(out_dim))
                in_dim = out_dim
            if i < len(temporal_upsample):
                layers.append(Resample(out_dim, "upsample3d" if temporal_upsample[i] else "upsample2d"))
                scale *= 2.0
        self.upsamples = nn.Sequential(*layers)
        self.head = nn.Sequential(
            RMSNorm(dims[-1], spatial_dims=3), nn.SiLU(inplace=True), CausalConv3d(dims[-1], 3, 3)
        )
        self.num_cache_slots = _number_cache_slots(self)

    def forward(self, x: Tensor, cache: FrameCache) -> Tensor:
        x = self.conv1(x, cache)
        x = _run(self.middle, x, cache)
        x = _run(self.upsamples, x, cache)
        return _run(self.head, x, cache)


def _weights_channels_last(root: nn.Module) -> None:
    """Store the conv weights under ``root`` channels-last, as the convs of a channels-last decode
    read them (then no call converts them).  Checked per block: loading a checkpoint assigns new tensors."""
    for module in root.modules():
        if isinstance(module, nn.Conv2d | nn.Conv3d):
            fmt = _memory_format(True, module.weight.dim())
            if not module.weight.is_contiguous(memory_format=fmt):
                module.weight.data = module.weight.data.contiguous(memory_format=fmt)


@dataclass
class VAEDecodeState:
    """Streaming-decode memory of one session: the decoder's frame caches plus bookkeeping.

    Create it with ``WanVAE.new_decode_state()`` and pass it to every ``decode_block`` call of the
    session, in order.  It holds two trailing frames per causal conv (small next to one frame's
    activations) and is tied to the batch size and latent size of the first block.
    """

    caches: FrameCache
    latent_frames: int = 0  # latent frames decoded so far
    batch_hw: tuple[int, int, int] | None = None  # (B, h, w) of the first block

    @property
    def nbytes(self) -> int:
        """Device memory held by the caches (for per-session memory accounting)."""
        return sum(t.numel() * t.element_size() for t in self.caches if t is not None)


class WanVAE(nn.Module):
    """The Wan2.1 VAE (``WanVAE_`` of the reference) with streaming decode; see the module docstring."""

    def __init__(self, config: WanVAEConfig | None = None) -> None:
        super().__init__()
        self.config = config or WanVAEConfig()
        z = self.config.z_dim
        self.encoder = Encoder3d(self.config)
        self.conv1 = PointwiseConv3d(2 * z, 2 * z)
        self.conv2 = PointwiseConv3d(z, z)
        self.decoder = Decoder3d(self.config)
        # Decode on the CPU with channels-last activations ([B, T, H, W, C] in memory): oneDNN's 3D
        # convolution reads and writes that layout as it is, with no transposing copies and no
        # time-tap folding; 1.6x faster than NCTHW with the fold (`bench/vae.py --variants fp32
        # fp32-contiguous`, which also reports their difference: float rounding).
        self.channels_last = True

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: WanVAEConfig | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = torch.float32,
    ) -> WanVAE:
        """Load ``Wan2.1_VAE.pth`` or a ``.safetensors`` state dict (strict)."""
        return load_into(
            lambda: cls(config or WanVAEConfig()),
            read_state_dict(path, "VAE checkpoint", "Expected the Wan2.1 VAE weights (Wan2.1_VAE.pth)."),
            path,
            dtype=dtype,
            device=device,
            what="Wan VAE",
            hint="check the vae section of the preset / model.yaml (dim, z_dim, dim_mult, num_res_blocks)",
        )

    def new_decode_state(self) -> VAEDecodeState:
        """A fresh state for a new video (the next block decoded is latent frame 0)."""
        return VAEDecodeState(caches=[None] * self.decoder.num_cache_slots)

    @torch.no_grad()  # the state would otherwise keep the autograd graph of all earlier blocks alive
    def decode_block(self, latents_block: Tensor, state: VAEDecodeState) -> Tensor:
        """Decode the next latent block of a video; returns its pixel frames ``[B, T, 3, H, W]`` in [-1, 1].

        ``latents_block`` is ``[B, F, z_dim, h, w]``.  T = 1 + 4*(F-1) for the first block of the
        state, 4*F afterwards.  Concatenating the outputs equals ``decode`` of the whole sequence.
        """
        z = self._check_latents(latents_block, state)
        mean, inv_std = self._latent_scale(z.device)
        z = (z.float() / inv_std + mean).to(self.conv2.weight.dtype)
        fmt = _memory_format(self.channels_last and z.device.type == "cpu", 5)
        if fmt == torch.channels_last_3d:
            _weights_channels_last(self.decoder)
        frames = [
            self.decoder(self.conv2(z[:, :, i : i + 1].contiguous(memory_format=fmt)), state.caches)
            for i in range(z.shape[2])
        ]
        state.latent_frames += z.shape[2]
        video = torch.cat(frames, dim=2).float().clamp(-1.0, 1.0)
        return video.permute(0, 2, 1, 3, 4).contiguous()

    def decode(self, latents: Tensor) -> Tensor:
        """One-shot decode: ``[B, F, z_dim, h, w]`` -> ``[B, 1+4(F-1), 3, 8h, 8w]`` in [-1, 1]."""
        return self.decode_block(latents, self.new_decode_state())

    @torch.no_grad()
    def encode(self, video: Tensor) -> Tensor:
        """Encode pixels ``[B, T, 3, H, W]`` in [-1, 1] to latents ``[B, 1+(T-1)/4, z_dim, H/8, W/8]``.

        Returns the posterior mean (no sampling), normalised like the DiT's latents, e.g. to
        condition a video continuation.  T must be 1 + 4k; the encoder sees chunks of 1, 4, 4, ...
        frames like the reference.
        """
        x = self._check_video(video)
        cache: FrameCache = [None] * self.encoder.num_cache_slots
        step = self.config.temporal_factor
        chunks = [x[:, :, :1]] + [x[:, :, s : s + step] for s in range(1, x.shape[2], step)]
        features = torch.cat([self.encoder(chunk, cache) for chunk in chunks], dim=2)
        mu = self.conv1(features)[:, : self.config.z_dim].float()
        mean, inv_std = self._latent_scale(mu.device)
        return ((mu - mean) * inv_std).permute(0, 2, 1, 3, 4).contiguous()

    def _latent_scale(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """fp32 (mean, 1/std) as [1, C, 1, 1, 1]; decode divides by the fp32 reciprocal like the reference."""
        mean = torch.tensor(self.config.latent_mean, dtype=torch.float32, device=device)
        inv_std = 1.0 / torch.tensor(self.config.latent_std, dtype=torch.float32, device=device)
        return mean.view(1, -1, 1, 1, 1), inv_std.view(1, -1, 1, 1, 1)

    def _check_latents(self, latents: Tensor, state: VAEDecodeState) -> Tensor:
        """Validate a latent block against the config and the state; return it as [B, C, F, h, w]."""
        if latents.ndim != 5:
            raise ValueError(f"latents must be [B, F, C, h, w] (5 dims), got shape {tuple(latents.shape)}")
        b, f, c, h, w = latents.shape
        if c != self.config.z_dim:
            raise ValueError(
                f"latents must have z_dim={self.config.z_dim} channels at dim 2 ([B, F, C, h, w]), "
                f"got shape {tuple(latents.shape)}; permute [B, C, F, h, w] input first"
            )
        if f == 0 or not latents.is_floating_point():
            raise ValueError(f"latents must be a non-empty float tensor, got {tuple(latents.shape)} {latents.dtype}")
        if len(state.caches) != self.decoder.num_cache_slots:
            raise ValueError("state was created by a WanVAE with another config; use this model's new_decode_state()")
        if state.batch_hw is None:
            state.batch_hw = (b, h, w)
        elif state.batch_hw != (b, h, w):
            raise ValueError(
                f"latents (B, h, w) = {(b, h, w)} differs from the state's earlier blocks {state.batch_hw}; "
                "use a new_decode_state() for a new video"
            )
        return latents.permute(0, 2, 1, 3, 4)

    def _check_video(self, video: Tensor) -> Tensor:
        """Validate an encoder input; return it as [B, 3, T, H, W] in the weights' dtype."""
        if video.ndim != 5 or video.shape[2] != 3:
            raise ValueError(f"video must be [B, T, 3, H, W], got shape {tuple(video.shape)}")
        t, h, w = video.shape[1], video.shape[3], video.shape[4]
        step, sf = self.config.temporal_factor, self.config.spatial_factor
        if (t - 1) % step != 0:
            raise ValueError(f"video must have 1 + {step}k frames, got T={t}")
        if h % sf or w % sf:
            raise ValueError(f"video H and W must be multiples of {sf}, got H={h}, W={w}")
        return video.permute(0, 2, 1, 3, 4).to(self.conv1.weight.dtype)


def to_unit_range(video: Tensor) -> Tensor:
    """Map decoder output in [-1, 1] to [0, 1] exactly like the reference pipeline."""
    return (video * 0.5 + 0.5).clamp(0.0, 1.0)
