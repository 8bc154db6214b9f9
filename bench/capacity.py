"""KV-cache capacity maths: bytes of KV cache one stream holds, per model and resolution.

Computed from the model presets alone (the same sizing the scheduler admits sessions with,
`inferix.spec.any_session_shape`), so it needs no weights and no GPU. A page holds K and V of one
latent frame at the preset's native resolution, in every layer; a stream holds `cache_frames` of
them (its attention window, or every frame for a global-attention model of `--blocks` blocks).

    python bench/capacity.py                  # the table of docs/operations.md
    python bench/capacity.py --pool-gib 60    # streams whose KV fits in a 60 GiB pool
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferix.spec.families.magi import MagiPreset
from inferix.spec.families.matrixgame import MatrixGamePreset
from inferix.spec.served import ServedPreset, any_session_shape, load_any_preset
from inferix.spec.sizing import SessionShape

GIB = 2**30
BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Row:
    model: str  # at its native resolution: a pool page is one native latent frame
    blocks: int | None = None  # global-attention models cache every frame: the session length matters


ROWS = (
    Row("self-forcing-dmd", blocks=7),
    Row("self-forcing-dmd", blocks=27),
    Row("matrixgame2-universal", blocks=50),
    Row("magi1-4.5b-distill"),
    Row("magi1-24b-distill"),
    Row("toyworld"),
)


def kv_row_bytes(preset: ServedPreset, element_bytes: int) -> int:
    """Bytes of K and V of one token in every layer."""
    if isinstance(preset, MagiPreset):
        config: Mapping[str, Any] = preset.model_config
        width = int(config["num_query_groups"]) * int(config["kv_channels"])
        layers = int(config["num_layers"])
    elif isinstance(preset, MatrixGamePreset):
        width, layers = int(preset.model_config["dim"]), int(preset.model_config["num_layers"])
    else:
        width, layers = preset.dit.dim, preset.dit.num_layers
    return 2 * layers * width * element_bytes


def stream_bytes(preset: ServedPreset, shape: SessionShape, element_bytes: int) -> int:
    return shape.cache_frames * shape.tokens_per_frame * kv_row_bytes(preset, element_bytes)


def readable(size: int) -> str:
    return f"{size / GIB:.2f} GiB" if size >= GIB // 10 else f"{size / 2**20:.2f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pool-gib", type=float, default=40.0, help="KV pool size for the streams column")
    args = parser.parse_args(argv)
    print(
        f"| model | resolution | cached latent frames | tokens / frame | KV / stream bf16 | KV / stream fp8 "
        f"| streams in {args.pool_gib:g} GiB (bf16 / fp8) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in ROWS:
        preset = load_any_preset(row.model)
        shape = any_session_shape(preset, preset.video.width, preset.video.height, row.blocks)
        sizes = {name: stream_bytes(preset, shape, size) for name, size in BYTES.items()}
        fits = " / ".join(str(int(args.pool_gib * GIB // size)) for size in sizes.values())
        every_frame = row.blocks is not None and shape.cache_frames == row.blocks * shape.frames_per_block
        frames = f"{shape.cache_frames}" + (f" (global attention, {row.blocks} blocks)" if every_frame else "")
        print(
            f"| {row.model} | {shape.width}x{shape.height} | {frames} | {shape.tokens_per_frame} "
            f"| {readable(sizes['bf16'])} | {readable(sizes['fp8'])} | {fits} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
