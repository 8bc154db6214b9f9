"""A worker recovers a session whose committed latents exceed 64 MiB (the old single-message cap).

kvcache_svc serves a session's blocks in pages of ~4 MiB; the worker fetches and replays them one page
at a time, so it never holds the whole history. Toyworld at 256x256 (a 32x32x8 latent per frame,
96 KiB per block; a byte of history replays faster than at 512x512, whose attention spans 4x the
tokens), 704 committed blocks (66 MiB, 17 pages) are replayed and continued: the next block
carries on from frame 2,112, and every restored block is reported.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np

from inferix.api.v1 import common_pb2, kvcache_pb2, kvcache_pb2_grpc, worker_pb2, worker_pb2_grpc
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import start_mesh
from kvcache_svc.service import STREAM_MESSAGE_BYTES
from tests.mesh.conftest import mesh_config

BLOCKS, FRAMES, CHANNELS, SIDE = 704, 3, 8, 32  # latents of one block: [3, 8, 32, 32] float32


def commit(kvcache: kvcache_pb2_grpc.KVCacheServiceStub, session_id: str, blocks: int, token: object) -> None:
    rng = np.random.default_rng(0)
    for index in range(blocks):
        latents = rng.standard_normal((FRAMES, CHANNELS, SIDE, SIDE), dtype=np.float32)
        block = kvcache_pb2.CommittedBlock(
            block_index=index,
            start_frame=index * FRAMES,
            shape=[FRAMES, CHANNELS, SIDE, SIDE],
            latents=latents.astype("<f4").tobytes(),
            prompt="a red ball",
        )
        request = kvcache_pb2.CommitBlockRequest(session_id=session_id, block=block)
        kvcache.CommitBlock(request, timeout=30, metadata=token)


def test_a_session_of_more_than_64_mib_is_restored_page_by_page_and_continues(tmp_path: Path) -> None:
    history_bytes = BLOCKS * FRAMES * CHANNELS * SIDE * SIDE * 4
    assert history_bytes > 64 * 2**20 and history_bytes > 16 * STREAM_MESSAGE_BYTES
    # Two torch threads: this test checks paging, not numerics, and the replay is long.
    mesh = start_mesh(mesh_config(tmp_path / "mesh", workers=1, kv_pages=1024, rtmp="off", worker_threads=2))
    token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
    spec = common_pb2.SessionSpec(
        model="toyworld",
        resolution=common_pb2.Resolution(width=8 * SIDE, height=8 * SIDE),
        prompts=[common_pb2.PromptChange(at_block=0, text="a red ball")],
        seed=3,
    )
    try:
        with grpc.insecure_channel(mesh.kvcache.address) as channel:
            kvcache = kvcache_pb2_grpc.KVCacheServiceStub(channel)
            commit(kvcache, "long", BLOCKS, token)
        with grpc.insecure_channel(mesh.workers[0].address) as channel:
            worker = worker_pb2_grpc.WorkerServiceStub(channel)
            opened = worker.OpenSession(
                worker_pb2.OpenSessionRequest(session_id="long", spec=spec, streamer_address=mesh.streamer.address),
                timeout=600,
                metadata=token,
            )
            assert opened.next_block == BLOCKS
            assert [e.block_index for e in opened.blocks] == list(range(BLOCKS))
            assert [e.first_frame for e in opened.blocks] == [i * FRAMES for i in range(BLOCKS)]
            ran = worker.RunBlock(
                worker_pb2.RunBlockRequest(session_id="long", block_index=BLOCKS, prompt="a red ball"),
                timeout=600,
                metadata=token,
            )
        assert (ran.block.block_index, ran.block.first_frame, ran.block.num_frames) == (BLOCKS, BLOCKS * FRAMES, 3)
        assert f"restored from {BLOCKS} committed blocks" in (mesh.config.workdir / "worker0.log").read_text()
    finally:
        mesh.stop()
