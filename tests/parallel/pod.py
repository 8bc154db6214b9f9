"""Real multi-process pods for tests: forked ranks joined through torchrun's env:// rendezvous.

Fork (not spawn) because the test process has already imported torch: a forked rank starts in
milliseconds, a spawned one re-imports torch for seconds. Each rank gets torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a free 127.0.0.1 port) and joins
with the engine's own `init_distributed`, i.e. exactly the torchrun code path, on gloo.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.parallel.pod_main import init_distributed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, out: Path, fn: Callable[[int], Any]) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    init_distributed()
    try:
        result = fn(rank)
    finally:
        if dist.is_initialized():  # a command line entry point may have left the pod already
            dist.destroy_process_group()
    torch.save(result, out / f"rank{rank}.pt")


def run_ranks(fn: Callable[[int], Any], world: int, tmp_path: Path) -> list[Any]:
    """Run fn(rank) on `world` forked ranks of one gloo pod; returns each rank's result.

    A failing rank fails the test with its traceback (the other ranks are terminated).
    """
    try:
        mp.start_processes(_rank_main, args=(world, free_port(), tmp_path, fn), nprocs=world, start_method="fork")
    except mp.ProcessExitedException as exc:
        # A child forked from a process that has run many threaded tests can crash in CPython's own
        # threading._after_fork before any of our code runs (seen once in CI). Such a crash leaves no
        # result file; the pod is started once more. A crash of ours repeats, and fails the test.
        if exc.signal_name != "SIGSEGV" or any((tmp_path / f"rank{r}.pt").exists() for r in range(world)):
            raise
        mp.start_processes(_rank_main, args=(world, free_port(), tmp_path, fn), nprocs=world, start_method="fork")
    return [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


__all__ = ["free_port", "run_ranks"]
