"""What the TAEHV mesh tests share: random TAEHV weights in the released taew2_1 layout, and a mesh
of `tiny` workers that decode with them (`--decoder taehv:PATH`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import save_file

from engine.decoders.taehv import TAEHVLayout, random_taehv_state
from inferix_cli.mesh import Mesh, start_mesh
from tests.mesh.conftest import mesh_config
from tests.store.redis_server import RedisServer

MODEL = "tiny"  # Wan VAE latents (16 channels, 8x space, 4x time): what taew2_1 decodes; toyworld's are not


def write_taehv_weights(folder: Path, seed: int) -> Path:
    """A taew2_1 weight file in `folder`. TAEHV's widths are fixed: these are full-size random weights."""
    path = folder / "taew2_1.safetensors"
    save_file(random_taehv_state(TAEHVLayout(), seed=seed), str(path))
    return path


@contextmanager
def running_taehv_mesh(
    workdir: Path, redis_server: RedisServer, weights: Path, *, workers: int, db: int
) -> Iterator[Mesh]:
    """A mesh of `workers` workers of MODEL decoding with `weights`, its sessions stored in Redis
    database `db` (flushed first: each test module has its own)."""
    redis_server.flush(db=db)
    config = mesh_config(
        workdir,
        workers=workers,
        model=Path(MODEL),
        decoder=f"taehv:{weights}",
        redis_url=redis_server.url(db=db),
        lookahead=64,
    )
    running = start_mesh(config)
    try:
        yield running
    finally:
        running.stop()
