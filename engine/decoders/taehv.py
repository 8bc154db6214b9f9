"""TAEHV: the tiny causal video autoencoder for Wan latents (madebyollin/taehv, MIT), our own implementation.

TAEHV decodes the diffusion model's latents as they are (no per-channel mean/std, unlike the Wan VAE)
into RGB in [0, 1], one latent frame into ``t_upscale`` (4) frames, of which the first
``t_upscale - 1`` of a stream are dropped, so F latent frames give 1 + 4 (F - 1) frames, as the Wan
VAE does. Its only memory across time is the MemBlock: a block reads the previous time step's input
to itself (zeros at t = 0). That makes streaming exact: keep each MemBlock's last input frame and a
block of latents decoded after another equals the one-shot decode.

Unlike the reference streaming decoder, which walks one frame at a time through every layer, a
block's frames go through each layer together: a MemBlock's "past" for the block is its carried
frame followed by the block's own inputs shifted by one, all known before the layer runs. Two
rewrites make the decode cheaper without changing what it computes: the 1x1 TGrow (pointwise in
space) runs before the nearest-neighbour Upsample instead of after it (4x fewer pixels), and
activations stay channels-last (oneDNN's native layout on CPU, no reorder around every conv).

Layouts, read from the tensor shapes and never from the file name:

* base decoder: ``decoder.1.weight`` [256, latent_channels, 3, 3] (taew2_1, taew2_2, taehv1_5);
* super decoder: ``decoder.0.weight`` [512, latent_channels, 1, 1] (taew2_2_super, taehv1_5_super):
  ConvNeXt-like MemBlocks, 3x3 conv + PixelShuffle instead of Upsample;
* both end with ``decoder.22.weight`` [3 * patch^2, 64, 3, 3]; TGrow / TPool time strides are the
  ratio of their 1x1 weights' channel counts; the encoder (``encoder.*``) is optional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.checkpoint import StateDict, load_into, read_state_dict, seeded_state_dict
from inferix.errors import CheckpointError

__all__ = [
    "TAEHV",
    "TAEHVDecodeState",
    "TAEHVDecoder",
    "TAEHVEncodeState",
    "TAEHVLayout",
    "infer_layout",
    "load_taehv",
    "random_taehv_state",
]

BASE_WIDTHS = (256, 128, 64, 64)
SUPER_WIDTHS = (512, 256, 128, 64)
ENCODER_WIDTH = 64
IMAGE_CHANNELS = 3
SPACE_FACTOR = 8  # three x2 stages in both directions
WHAT = "TAEHV weights"
HINT = "expected a TAEHV file as published (taew2_1 / taew2_2 / taehv1_5[_super], .pth or .safetensors)"


@dataclass(frozen=True)
class TAEHVLayout:
    """What a TAEHV weight file holds, as read from its tensor shapes (`infer_layout`)."""

    latent_channels: int = 16
    patch_size: int = 1
    variant: str = "base"  # "base" or "super"
    decoder_time_strides: tuple[int, int, int] = (1, 2, 2)
    encoder_time_strides: tuple[int, int, int] | None = (2, 2, 1)  # None: a decoder-only file

    @property
    def t_upscale(self) -> int:
        return math.prod(self.decoder_time_strides)

    @property
    def t_downscale(self) -> int:
        return math.prod(self.encoder_time_strides or (1,))

    @property
    def frames_to_trim(self) -> int:
        # The first raw frames of a stream precede latent frame 0's own frame (causal alignment with
        # the Wan VAE, whose first latent frame is one pixel frame).
        return self.t_upscale - 1

    @property
    def spatial_factor(self) -> int:
        return SPACE_FACTOR * self.patch_size


# ---- layers (state-dict names as published: conv.N / skip) ---------------------------------------
def _conv3(n_in: int, n_out: int, bias: bool = True, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias, stride=stride)


class Clamp(nn.Module):
    """Soft clamp of the latents to (-3, 3)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """ReLU(f(cat[x, past]) + skip(x)): the base model's only link across time."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            _conv3(n_in * 2, n_out), nn.ReLU(), _conv3(n_out, n_out), nn.ReLU(), _conv3(n_out, n_out)
        )
        self.skip: nn.Module = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()

    def forward(self, x: Tensor, past: Tensor) -> Tensor:
        # In place on fresh tensors only: x and past are carried as memory and must stay intact.
        conv = self.conv
        # conv(cat[x, past]) as the sum of each half's conv: no 2C-channel copy of both inputs.
        first = conv[0]
        assert isinstance(first, nn.Conv2d)
        c = x.shape[1]
        y = F.conv2d(x, first.weight[:, :c], first.bias, padding=1)
        y = F.relu_(y.add_(F.conv2d(past, first.weight[:, c:], None, padding=1)))
        y = conv[4](F.relu_(conv[2](y)))
        return F.relu_(y.add_(self.skip(x)))


class SuperMemBlock(nn.Module):
    """The super decoder's MemBlock: 7x7 depthwise conv and an inverted bottleneck, plus x."""

    def __init__(self, n_f: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(n_f * 2, n_f * 2, 7, padding=3, groups=n_f * 2, bias=False),
            nn.Conv2d(n_f * 2, n_f * 4, 1),
            nn.ReLU(),
            nn.Conv2d(n_f * 4, n_f, 1, bias=False),
        )

    def forward(self, x: Tensor, past: Tensor) -> Tensor:
        return self.conv(torch.cat([x, past], 1)) + x


class TPool(nn.Module):
    """`stride` consecutive time steps folded into channels, then a 1x1 conv back to `n_f`."""

    def __init__(self, n_f: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f * stride, n_f, 1, bias=False)


class TGrow(nn.Module):
    """A 1x1 conv to `stride` x the channels, split into `stride` consecutive time steps."""

    def __init__(self, n_f: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)


def _encoder(layout: TAEHVLayout, strides: tuple[int, int, int]) -> nn.Sequential:
    c = ENCODER_WIDTH
    layers: list[nn.Module] = [_conv3(IMAGE_CHANNELS * layout.patch_size**2, c), nn.ReLU()]
    for stride in strides:
        layers += [TPool(c, stride), _conv3(c, c, bias=False, stride=2), MemBlock(c, c), MemBlock(c, c), MemBlock(c, c)]
    layers.append(_conv3(c, layout.latent_channels))
    return nn.Sequential(*layers)


def _decoder(layout: TAEHVLayout) -> nn.Sequential:
    out = IMAGE_CHANNELS * layout.patch_size**2
    layers: list[nn.Module]
    if layout.variant == "super":
        n = SUPER_WIDTHS
        layers = [nn.Conv2d(layout.latent_channels, n[0], 1, bias=False)]
        for i, stride in enumerate(layout.decoder_time_strides):
            layers += [SuperMemBlock(n[i]), SuperMemBlock(n[i]), SuperMemBlock(n[i])]
            layers += [_conv3(n[i], n[i + 1] * 4), nn.ReLU(), nn.PixelShuffle(2), TGrow(n[i + 1], stride)]
        layers.append(_conv3(n[3], out))
        return nn.Sequential(*layers)
    n = BASE_WIDTHS
    layers = [Clamp(), _conv3(layout.latent_channels, n[0]), nn.ReLU()]
    for i, stride in enumerate(layout.decoder_time_strides):
        layers += [MemBlock(n[i], n[i]), MemBlock(n[i], n[i]), MemBlock(n[i], n[i])]
        layers += [nn.Upsample(scale_factor=2), TGrow(n[i], stride), _conv3(n[i], n[i + 1], bias=False)]
    layers += [nn.ReLU(), _conv3(n[3], out)]
    return nn.Sequential(*layers)


# ---- running layers over time ---------------------------------------------------------------------
class _Kind(Enum):
    MEMORY = "memory"  # MemBlock / SuperMemBlock: reads the previous step's input
    GROW = "grow"  # TGrow: one step becomes `stride`
    POOL = "pool"  # TPool: `stride` steps become one
    UPCONV = "upconv"  # nearest x2 Upsample then a 3x3 conv, run as one 2x2 conv per output phase
    UPCONV_OUT = "upconv-out"  # UPCONV, ReLU and a 3x3 conv, without interleaving the UPCONV's phases
    FRAME = "frame"  # anything else: frame by frame, no time


@dataclass(frozen=True)
class _Step:
    kind: _Kind
    module: nn.Module
    slot: int = -1  # index of its memory in the state (MEMORY, POOL)
    then: nn.Conv2d | None = None  # UPCONV_OUT: the 3x3 conv after the ReLU


def _is_conv3(conv: nn.Conv2d) -> bool:
    """A plain 3x3 conv that keeps the size: stride 1, padding 1, no groups, no dilation."""
    return (
        conv.kernel_size == (3, 3)
        and conv.stride == (1, 1)
        and conv.padding == (1, 1)
        and conv.dilation == (1, 1)
        and conv.groups == 1
    )


def _is_upconv(upsample: nn.Module, conv: nn.Module | None) -> bool:
    return (
        isinstance(upsample, nn.Upsample)
        and upsample.mode == "nearest"
        and upsample.scale_factor in (2, 2.0)
        and isinstance(conv, nn.Conv2d)
        and _is_conv3(conv)
    )


def _plan(layers: nn.Sequential) -> tuple[list[_Step], int]:
    """The steps that run `layers` over time, and how many memory slots they need."""
    steps: list[_Step] = []
    slots = 0
    modules: list[nn.Module | None] = [*layers, None, None]
    i = 0
    while i < len(layers):
        m, nxt, after = modules[i], modules[i + 1], modules[i + 2]
        assert m is not None
        upconv = None
        if isinstance(nxt, TGrow) and _is_upconv(m, after):
            # Upsample, TGrow, conv3x3: the 1x1 TGrow commutes with nearest upsampling, so it runs on
            # 4x fewer pixels, and the upsampled conv becomes 2x2 convs at low resolution (4/9 the work).
            steps.append(_Step(_Kind.GROW, nxt))
            upconv, i = after, i + 3
        elif _is_upconv(m, nxt):
            upconv, i = nxt, i + 2
        if upconv is not None:
            assert isinstance(upconv, nn.Conv2d)
            relu, then = (layers[i], layers[i + 1]) if i + 1 < len(layers) else (None, None)
            if isinstance(relu, nn.ReLU) and isinstance(then, nn.Conv2d) and _is_conv3(then):
                # The decoder's last layers: the output conv reads the phases as they come (`_upconv_out`).
                steps.append(_Step(_Kind.UPCONV_OUT, upconv, then=then))
                i += 2
            else:
                steps.append(_Step(_Kind.UPCONV, upconv))
            continue
        if isinstance(m, (MemBlock, SuperMemBlock)):
            steps.append(_Step(_Kind.MEMORY, m, slots))
            slots += 1
        elif isinstance(m, TPool):
            steps.append(_Step(_Kind.POOL, m, slots))
            slots += 1
        elif isinstance(m, TGrow):
            steps.append(_Step(_Kind.GROW, m))
        else:
            steps.append(_Step(_Kind.FRAME, m))
        i += 1
    return steps, slots


# Which of the 3 taps of a 3x3 kernel (rows or columns) land on each of the 2 low-resolution taps,
# for output phase 0 (even rows) and 1 (odd rows) of a nearest x2 upsample followed by the conv.
_PHASE_TAPS = (torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def _upconv(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """conv(upsample_nearest_x2(x)) computed at x's resolution.

    Output pixel (2i + a, 2j + b) only sees input rows i - 1 + a .. i + a and columns likewise, so
    each of the 4 phases (a, b) is a 2x2 conv of x with the 3x3 taps summed where they fall on the
    same input pixel. One conv with the 4 phases' kernels stacked, then the phases interleaved.
    """
    y = _upconv_phases(x, conv)
    c_out = conv.weight.shape[0]
    n, _, h, w_ = x.shape
    fmt = torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    out = torch.empty(n, c_out, 2 * h, 2 * w_, dtype=y.dtype, device=y.device, memory_format=fmt)
    for a in (0, 1):
        for b in (0, 1):
            phase = (2 * a + b) * c_out
            out[:, :, a::2, b::2] = y[:, phase : phase + c_out, a : a + h, b : b + w_]
    return out


def _upconv_phases(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """`_upconv`'s one conv: [N, C, H, W] -> [N, 4 * c_out, H + 1, W + 1], phase (a, b) in channels
    (2a + b) c_out on, its pixel (i, j) at (i + a, j + b)."""
    w = conv.weight
    w32 = w.float()
    kernels = [
        torch.einsum("ry,oiyx,sx->oirs", _PHASE_TAPS[a].to(w.device), w32, _PHASE_TAPS[b].to(w.device))
        for a in (0, 1)
        for b in (0, 1)
    ]
    kernel = torch.cat(kernels, 0).to(w.dtype)
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        kernel = kernel.contiguous(memory_format=torch.channels_last)
    bias = None if conv.bias is None else conv.bias.repeat(4)
    return F.conv2d(x, kernel, bias, padding=1)  # a 2x2 kernel over x padded by 1


def _upconv_out(x: Tensor, upconv: nn.Conv2d, then: nn.Conv2d) -> Tensor:
    """then(relu(upconv(upsample_nearest_x2(x)))) from `_upconv_phases`, never interleaving its phases.

    An output pixel (2i + a + dy, 2j + b + dx) of `then`'s 3x3 window is phase ((a + dy) % 2, ...) of
    the upsampled conv, which `_upconv_phases` holds at row i + (a + dy > 0) (and column likewise): so
    every output phase of `then` is a 2x2 conv over all 4 phases at once, and a pixel shuffle puts the
    phases in place. The 3x3 padding's zeros are the border rows and columns that hold no pixel of
    their phase, set to zero. `then`'s output is small (RGB), its input, the interleaving, the largest.
    """
    y = F.relu_(_upconv_phases(x, upconv))
    c = upconv.weight.shape[0]
    phases = y.view(y.shape[0], 2, 2, c, *y.shape[2:])  # [N, a, b, C, H + 1, W + 1]
    phases[:, 1, :, :, 0] = 0  # odd rows' row 0 is the image's row -1
    phases[:, 0, :, :, -1] = 0  # even rows' last row is the image's row 2H
    phases[:, :, 1, :, :, 0] = 0
    phases[:, :, 0, :, :, -1] = 0
    w = then.weight.float()  # [O, C, 3, 3]
    o = w.shape[0]
    kernel = torch.zeros(o, 2, 2, 2, 2, c, 2, 2, dtype=w.dtype, device=w.device)  # [O, a, b, a', b', C, ry, rx]
    for a in (0, 1):
        for dy in (-1, 0, 1):
            src_a, ry = (a + dy) % 2, int(a + dy > 0)
            for b in (0, 1):
                for dx in (-1, 0, 1):
                    src_b, rx = (b + dx) % 2, int(b + dx > 0)
                    kernel[:, a, b, src_a, src_b, :, ry, rx] += w[:, :, dy + 1, dx + 1]
    kernel = kernel.reshape(4 * o, 4 * c, 2, 2).to(then.weight.dtype)
    if y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous():
        kernel = kernel.contiguous(memory_format=torch.channels_last)
    bias = None if then.bias is None else then.bias.repeat_interleave(4)
    return F.pixel_shuffle(F.conv2d(y, kernel, bias), 2)


def _grow(x: Tensor, module: TGrow, n: int, t: int) -> Tensor:
    """TGrow: [n*t, C, H, W] -> [n*t*stride, C, H, W], channel group k of a step becoming its k-th new step."""
    c, h, w = x.shape[1:]
    grown = module.conv(x)  # [n*t, stride*c, H, W]
    s = module.stride
    if s == 1:
        return grown
    if grown.is_contiguous():
        return grown.reshape(n * t * s, c, h, w)
    # Channels-last: split the channel groups into steps and stay channels-last (one copy either way;
    # for one step the reshape is a strided view, which must not reach the next layers as it is).
    nhwc = grown.permute(0, 2, 3, 1).reshape(n * t, h, w, s, c).permute(0, 3, 1, 2, 4)
    return nhwc.reshape(n * t * s, h, w, c).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)


# Activations larger than this go through the remaining layers a few time steps at a time (memory
# carried between the chunks exactly as between blocks): a whole block of full-resolution frames
# (1.2 GB per tensor at 480x832) costs more in page faults and memory traffic than batching saves.
# The convolutions are at the core's FMA peak either way, so smaller chunks lose nothing; 8 MiB
# (one step of the last stages at 224x512) beat 32 MiB on an AVX-512 core and tied on AVX2.
CHUNK_BYTES = 8 * 2**20


def _run(
    steps: list[_Step], x: Tensor, n: int, memory: list[Tensor | None], first: int = 0, skip: int = 0
) -> Tensor | None:
    """Run `x` [n * T, C, H, W] (sample-major, time inside) through `steps`, updating `memory`.

    Every layer takes all of the block's time steps at once, until the activations pass
    `CHUNK_BYTES`: the rest of the layers then run on chunks of time steps in order. None when a
    TPool has not yet gathered enough steps to give one (its pending steps stay in `memory`), or
    when every step is skipped. `skip`: leading output steps of each sample that the caller drops (a
    stream's first frames); the layers after the last one with memory or a time stride, which make
    each output step from its own input step alone, do not compute them.
    """
    tail = _tail_start(steps) if skip else -1
    for index in range(first, len(steps)):
        step = steps[index]
        t = x.shape[0] // n
        if index == tail:
            if skip >= t:
                return None  # every step of this chunk is dropped
            kept = x.reshape(n, t, *x.shape[1:])[:, skip:]
            x = kept.reshape(-1, *x.shape[1:]).contiguous(memory_format=_format_of(x))
            t, skip = t - skip, 0
        if t > 1 and x.numel() * x.element_size() > CHUNK_BYTES:
            return _run_chunked(steps, x, n, memory, index, skip)
        module = step.module
        if step.kind is _Kind.MEMORY:
            last = x[t - 1 :: t]  # [n, C, H, W]: each sample's last step, the next block's past
            carried = memory[step.slot]
            if carried is None:
                carried = torch.zeros_like(last)
            past = _shift_in_time(x, carried, n, t)
            memory[step.slot] = last.clone(memory_format=torch.preserve_format)
            x = module(x, past)
        elif step.kind is _Kind.GROW:
            assert isinstance(module, TGrow)
            x = _grow(x, module, n, t)
        elif step.kind is _Kind.UPCONV:
            assert isinstance(module, nn.Conv2d)
            x = _upconv(x, module)
        elif step.kind is _Kind.UPCONV_OUT:
            assert isinstance(module, nn.Conv2d) and step.then is not None
            x = _upconv_out(x, module, step.then)
        elif step.kind is _Kind.POOL:
            assert isinstance(module, TPool)
            pending = memory[step.slot]
            c, h, w = x.shape[1:]
            frames = x.reshape(n, t, c, h, w)
            if pending is not None:
                frames = torch.cat([pending.reshape(n, -1, c, h, w), frames], 1)
                t = frames.shape[1]
            usable = t - t % module.stride
            memory[step.slot] = frames[:, usable:].reshape(-1, c, h, w).clone() if usable < t else None
            if usable == 0:
                return None
            pooled = frames[:, :usable].reshape(n * usable // module.stride, module.stride * c, h, w)
            x = module.conv(pooled.contiguous(memory_format=_format_of(x)))
        elif isinstance(module, nn.ReLU) and index > 0:
            x = F.relu_(x)  # x is the previous step's fresh output (memory keeps MemBlock inputs only)
        else:
            x = module(x)
    return x


def _run_chunked(
    steps: list[_Step], x: Tensor, n: int, memory: list[Tensor | None], first: int, skip: int = 0
) -> Tensor | None:
    """`_run` from step `first` on, a chunk of time steps at a time (each chunk's memory feeds the next);
    `skip` leading output steps dropped, as in `_run`."""
    t = x.shape[0] // n
    per_step = x.numel() * x.element_size() // (n * t)
    size = max(1, CHUNK_BYTES // max(1, n * per_step))
    c, h, w = x.shape[1:]
    frames = x.reshape(n, t, c, h, w)
    growth = _growth(steps, first)  # output steps per step here, for the chunks' share of `skip`
    outputs = []
    for start in range(0, t, size):
        chunk = frames[:, start : start + size].reshape(-1, c, h, w).contiguous(memory_format=_format_of(x))
        y = _run(steps, chunk, n, memory, first, max(0, skip - start * growth))
        if y is not None:
            outputs.append(y.reshape(n, -1, *y.shape[1:]))
    if not outputs:
        return None
    y = torch.cat(outputs, 1)
    return y.reshape(-1, *y.shape[2:]).contiguous(memory_format=_format_of(outputs[0][:, 0]))


def _tail_start(steps: list[_Step]) -> int:
    """The index from which every step makes each time step from the same input step alone."""
    timed = [i for i, step in enumerate(steps) if step.kind in (_Kind.MEMORY, _Kind.GROW, _Kind.POOL)]
    return timed[-1] + 1 if timed else 0


def _growth(steps: list[_Step], first: int) -> int:
    """Output time steps per input time step of the steps from `first` on (a decoder: no TPool)."""
    grows = [s.module.stride for s in steps[first:] if s.kind is _Kind.GROW and isinstance(s.module, TGrow)]
    return math.prod(grows)


def _format_of(x: Tensor) -> torch.memory_format:
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return torch.channels_last if channels_last else torch.contiguous_format


def _shift_in_time(x: Tensor, carried: Tensor, n: int, t: int) -> Tensor:
    """Each step's previous step: `carried` [n, C, H, W] at t = 0, then x's own steps shifted by one, in
    x's memory format (a cat with an empty tensor, t = 1, would give the contiguous one)."""
    if t == 1:
        return carried.contiguous(memory_format=_format_of(x))
    if n == 1:
        return torch.cat([carried, x[: t - 1]], 0)
    c, h, w = x.shape[1:]
    frames = x.reshape(n, t, c, h, w)
    past = torch.cat([carried.unsqueeze(1), frames[:, : t - 1]], 1).reshape(n * t, c, h, w)
    return past.contiguous(memory_format=_format_of(x))


# ---- the autoencoder ------------------------------------------------------------------------------
@dataclass
class TAEHVDecodeState:
    """What a stream carries from block to block: each MemBlock's last input, and the frames still to drop."""

    memory: list[Tensor | None]
    to_trim: int
    batch: int | None = None
    frames_out: int = 0

    def nbytes(self) -> int:
        return sum(m.numel() * m.element_size() for m in self.memory if m is not None)


@dataclass
class TAEHVEncodeState:
    """The encoder's carried memory (MemBlock inputs, TPool's pending steps) and the stream's last frame."""

    memory: list[Tensor | None]
    last_frame: Tensor | None = None
    frames_in: int = 0
    batch: int | None = None


@dataclass
class _Plans:
    decoder: list[_Step] = field(default_factory=list)
    decoder_slots: int = 0
    encoder: list[_Step] = field(default_factory=list)
    encoder_slots: int = 0


class TAEHV(nn.Module):
    """The TAEHV encoder (optional) and decoder, with causal streaming over time.

    Latents and frames are NTCHW (the Self Forcing pipeline's [B, F, C, h, w]); frames are RGB in
    [0, 1]. `decode_video` / `encode_video` are the one-shot calls; `decode_stream` / `encode_stream`
    take one block at a time with a state from `new_decode_state` / `new_encode_state`.
    """

    def __init__(self, layout: TAEHVLayout, channels_last: bool = True) -> None:
        super().__init__()
        self.layout = layout
        self.channels_last = channels_last
        self.decoder = _decoder(layout)
        self.encoder = _encoder(layout, layout.encoder_time_strides) if layout.encoder_time_strides else None
        self._plans = _Plans()
        self._plans.decoder, self._plans.decoder_slots = _plan(self.decoder)
        if self.encoder is not None:
            self._plans.encoder, self._plans.encoder_slots = _plan(self.encoder)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def use_channels_last(self) -> TAEHV:
        """Store the conv weights channels-last (once, after loading) when activations are."""
        if self.channels_last:
            for module in self.modules():
                if isinstance(module, nn.Conv2d):
                    module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last)
        return self

    def _frames_in(self, x: Tensor) -> tuple[Tensor, int]:
        n, t = x.shape[:2]
        flat = x.to(device=self.device, dtype=self.dtype).reshape(n * t, *x.shape[2:])
        if self.channels_last:
            flat = flat.contiguous(memory_format=torch.channels_last)
        return flat, n

    # ---- decoding -------------------------------------------------------------------------------
    def new_decode_state(self) -> TAEHVDecodeState:
        return TAEHVDecodeState([None] * self._plans.decoder_slots, self.layout.frames_to_trim)

    @torch.no_grad()
    def decode_stream(self, latents: Tensor, state: TAEHVDecodeState) -> Tensor:
        """Decode the next block of a stream: latents [N, F, C, h, w] -> RGB [N, T, 3, H, W] in [0, 1].

        The first block gives 1 + t_upscale (F - 1) frames, every later one t_upscale F.
        """
        if latents.ndim != 5 or latents.shape[2] != self.layout.latent_channels:
            raise ValueError(
                f"TAEHV decodes NTCHW latents with {self.layout.latent_channels} channels, got {tuple(latents.shape)}"
            )
        n = latents.shape[0]
        if state.batch is not None and state.batch != n:
            raise ValueError(f"a TAEHV stream of batch {state.batch} got a block of batch {n}")
        state.batch = n
        x, _ = self._frames_in(latents)
        # The stream's first frames are dropped: the last layers do not make them at all.
        drop = min(state.to_trim, latents.shape[1] * self.layout.t_upscale)
        y = _run(self._plans.decoder, x, n, state.memory, skip=drop)
        assert y is not None  # no TPool, and a stream drops fewer frames than its first latent frame makes
        state.to_trim -= drop
        p = self.layout.patch_size
        if p > 1:
            y = F.pixel_shuffle(y, p)
        video = y.clamp(0, 1).reshape(n, -1, *y.shape[1:]).contiguous()
        state.frames_out += video.shape[1]
        return video

    def decode_video(self, latents: Tensor) -> Tensor:
        """One-shot decode of a whole video (a fresh stream fed every latent frame at once)."""
        return self.decode_stream(latents, self.new_decode_state())

    # ---- encoding -------------------------------------------------------------------------------
    def new_encode_state(self) -> TAEHVEncodeState:
        if self.encoder is None:
            raise ValueError("these TAEHV weights have no encoder (a decoder-only file)")
        return TAEHVEncodeState([None] * self._plans.encoder_slots)

    @torch.no_grad()
    def encode_stream(self, frames: Tensor, state: TAEHVEncodeState) -> Tensor | None:
        """Encode the next frames of a stream: RGB [N, T, 3, H, W] in [0, 1] -> latents [N, F, C, h, w].

        Gives every latent frame whose t_downscale input frames have arrived (None if none yet);
        `flush_encoder` pads the end of the stream with copies of the last frame.
        """
        if self.encoder is None:
            raise ValueError("these TAEHV weights have no encoder (a decoder-only file)")
        if frames.ndim != 5 or frames.shape[2] != IMAGE_CHANNELS:
            raise ValueError(f"TAEHV encodes NTCHW RGB frames, got {tuple(frames.shape)}")
        n = frames.shape[0]
        if state.batch is not None and state.batch != n:
            raise ValueError(f"a TAEHV stream of batch {state.batch} got frames of batch {n}")
        state.batch = n
        state.last_frame = frames[:, -1:]
        state.frames_in += frames.shape[1]
        x, _ = self._frames_in(frames)
        p = self.layout.patch_size
        if p > 1:
            x = F.pixel_unshuffle(x, p)
        y = _run(self._plans.encoder, x, n, state.memory)
        if y is None:
            return None
        return y.reshape(n, -1, *y.shape[1:]).contiguous()

    def flush_encoder(self, state: TAEHVEncodeState) -> Tensor | None:
        """Pad the stream to a multiple of t_downscale frames with its last frame; the latents that gives."""
        short = -state.frames_in % self.layout.t_downscale
        if short == 0 or state.last_frame is None:
            return None
        return self.encode_stream(state.last_frame.expand(-1, short, -1, -1, -1), state)

    def encode_video(self, frames: Tensor) -> Tensor:
        """One-shot encode; a frame count that is not a multiple of t_downscale is padded with the last frame."""
        state = self.new_encode_state()
        short = -frames.shape[1] % self.layout.t_downscale
        if short:
            frames = torch.cat([frames, frames[:, -1:].expand(-1, short, -1, -1, -1)], 1)
        latents = self.encode_stream(frames, state)
        assert latents is not None
        return latents


class TAEHVDecoder:
    """TAEHV behind the engine's `BlockDecoder` protocol: streaming decode per block, output in [-1, 1].

    The engine's frame conversion reads the Wan VAE's [-1, 1]; TAEHV's [0, 1] is mapped with x*2-1
    (as the Self Forcing demo does where it swaps TAEHV in), so both decoders share one uint8 path.
    """

    def __init__(self, model: TAEHV, source: str | Path = "") -> None:
        self.model = model
        self.source = str(source)

    @property
    def layout(self) -> TAEHVLayout:
        return self.model.layout

    def new_decode_state(self) -> TAEHVDecodeState:
        return self.model.new_decode_state()

    def decode_block(self, latents_block: Tensor, state: TAEHVDecodeState) -> Tensor:
        return self.model.decode_stream(latents_block, state) * 2 - 1


# ---- loading --------------------------------------------------------------------------------------
def _shape(state: StateDict, key: str) -> tuple[int, ...] | None:
    tensor = state.get(key)
    return None if tensor is None else tuple(tensor.shape)


def _stride(state: StateDict, key: str, source: str | Path, grow: bool) -> int:
    """A TGrow / TPool time stride: the ratio of its 1x1 weight's channel counts."""
    shape = _shape(state, key)
    if shape is None or len(shape) != 4 or shape[2:] != (1, 1):
        raise CheckpointError(f"{source}: {key} is {shape}, expected a 1x1 conv weight; {HINT}")
    big, small = (shape[0], shape[1]) if grow else (shape[1], shape[0])
    if big % small or big // small not in (1, 2):
        raise CheckpointError(f"{source}: {key} is {shape}, expected a time stride of 1 or 2; {HINT}")
    return big // small


def infer_layout(state: StateDict, source: str | Path) -> TAEHVLayout:
    """The layout of TAEHV weights from their shapes (`CheckpointError` naming `source` if they are not TAEHV)."""
    base, super_ = _shape(state, "decoder.1.weight"), _shape(state, "decoder.0.weight")
    if super_ is not None and len(super_) == 4 and super_[0] == SUPER_WIDTHS[0] and super_[2:] == (1, 1):
        variant, latent, grows = "super", super_[1], (7, 14, 21)
    elif base is not None and len(base) == 4 and base[0] == BASE_WIDTHS[0] and base[2:] == (3, 3):
        variant, latent, grows = "base", base[1], (7, 13, 19)
    else:
        raise CheckpointError(
            f"{source}: not TAEHV weights: expected decoder.1.weight [256, latent_channels, 3, 3] (base) or "
            f"decoder.0.weight [512, latent_channels, 1, 1] (super), found {base or super_}; {HINT}"
        )
    last = _shape(state, "decoder.22.weight")
    if last is None or len(last) != 4 or last[1] != 64 or last[0] % IMAGE_CHANNELS:
        raise CheckpointError(f"{source}: decoder.22.weight is {last}, expected [3 * patch^2, 64, 3, 3]; {HINT}")
    patch = math.isqrt(last[0] // IMAGE_CHANNELS)
    if patch * patch * IMAGE_CHANNELS != last[0]:
        raise CheckpointError(f"{source}: decoder.22.weight is {last}, expected [3 * patch^2, 64, 3, 3]; {HINT}")
    dec = tuple(_stride(state, f"decoder.{i}.conv.weight", source, grow=True) for i in grows)
    enc: tuple[int, ...] | None = None
    if any(k.startswith("encoder.") for k in state):
        enc = tuple(_stride(state, f"encoder.{i}.conv.weight", source, grow=False) for i in (2, 7, 12))
    return TAEHVLayout(latent, patch, variant, dec, enc)  # type: ignore[arg-type]  # three strides each


def load_taehv(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    channels_last: bool | None = None,
) -> TAEHV:
    """TAEHV from a released weight file (``.pth`` or ``.safetensors``), in `dtype` on `device`.

    The published files are fp16 state dicts; they load into modules of any dtype. Channels-last
    activations are the default on the CPU (oneDNN's layout), contiguous ones on CUDA.
    """
    state = read_state_dict(path, WHAT, HINT)
    layout = infer_layout(state, path)
    use_cl = torch.device(device).type == "cpu" if channels_last is None else channels_last
    model = load_into(lambda: TAEHV(layout, use_cl), state, path, dtype=dtype, device=device, what=WHAT, hint=HINT)
    return model.use_channels_last()


def random_taehv_state(layout: TAEHVLayout, seed: int = 0, gain: float = 1.0) -> StateDict:
    """Seeded random weights in the published layout and dtype (fp16), for tests and benches.

    TAEHV's widths are fixed, so these are full-size (11 M parameters for the base model). `gain`
    keeps activations from fading through the ReLU stack and the output bias centres the frames in
    (0, 1), as the golden case's weights do, so that comparisons are not made on clamped zeros.
    """
    state = seeded_state_dict(lambda: TAEHV(layout, channels_last=False), seed)
    state = {name: tensor * gain for name, tensor in state.items()}
    state["decoder.22.bias"] = torch.full_like(state["decoder.22.bias"], 0.5)
    return {name: tensor.half() for name, tensor in state.items()}
