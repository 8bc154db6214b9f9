"""A session keeps the decoder it was made with (`SessionSpec.decoder`), whatever `--decoder` the
workers that could take it over were started with: its TAEHV worker is SIGKILLed, a worker that
decodes with the VAE comes up and refuses it, and the session waits for a worker that decodes with
the same TAEHV weights, then finishes with the frames `inferix generate --decoder` makes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferix.api.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix.spec.decoders import DecoderChoice, decoder_identity
from inferix_cli.mesh import Mesh
from tests.mesh.conftest import KEY_A, generate_digest, kill_worker, stream_info
from tests.mesh.taehv_mesh import MODEL, running_taehv_mesh, write_taehv_weights
from tests.store.redis_server import RedisServer

BLOCKS = 4
SEED = 23


@pytest.fixture(scope="module")
def taehv_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_taehv_weights(tmp_path_factory.mktemp("taehv-pin"), seed=8)


@pytest.fixture(scope="module")
def one_worker_mesh(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, taehv_weights: Path
) -> Iterator[Mesh]:
    workdir = tmp_path_factory.mktemp("decoder-pin-mesh")
    with running_taehv_mesh(workdir, redis_server, taehv_weights, workers=1, db=7) as running:
        yield running


def _add_worker(mesh: Mesh, name: str, decoder: str) -> str:
    """Start one more worker of the mesh, decoding with `decoder`; its address."""
    started = mesh.config
    mesh.config = dataclasses.replace(started, decoder=decoder)
    try:
        return mesh.add_worker(name).address
    finally:
        mesh.config = started


def test_a_session_moves_only_to_a_worker_that_decodes_alike(one_worker_mesh: Mesh, taehv_weights: Path) -> None:
    mesh = one_worker_mesh
    schedule = (PromptChange(0, "a red ball"), PromptChange(2, "a green ball"))
    vae_address = ""
    with Client(mesh.address, api_key=KEY_A, timeout=300) as client:
        info = client.create_session(list(schedule), model=MODEL, num_blocks=BLOCKS, seed=SEED)
        events: list[object] = []
        for event in client.events(info.session_id):
            events.append(event)
            if isinstance(event, BlockDone) and event.block_index == 1 and not vae_address:
                kill_worker(mesh, event.worker_id)
                # The only worker up for a while decodes with the VAE: the session must not move to it.
                vae_address = _add_worker(mesh, "vae-worker", "vae")
                _add_worker(mesh, "taehv-worker", f"taehv:{taehv_weights}")
        final = client.get_session(info.session_id)
    blocks = [e for e in events if isinstance(e, BlockDone)]
    assert [b.block_index for b in blocks] == list(range(BLOCKS))
    assert {b.worker_id for b in blocks[2:]} == {"taehv-worker"}, [b.worker_id for b in blocks]
    assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
    assert final.state == "completed" and final.blocks_done == BLOCKS
    flags = ("--model", MODEL, "--decoder", f"taehv:{taehv_weights}")
    assert stream_info(mesh, info.session_id).frames_sha256 == generate_digest(schedule, BLOCKS, SEED, flags)

    # The VAE worker refuses a session recorded as made with these TAEHV weights, naming both decoders.
    recorded = decoder_identity(DecoderChoice("taehv", taehv_weights))
    assert recorded.startswith("taehv:sha256:") and len(recorded) == len("taehv:sha256:") + 16
    spec = common_pb2.SessionSpec(
        model=MODEL, resolution=common_pb2.Resolution(width=256, height=256), num_blocks=1, decoder=recorded
    )
    spec.prompts.add(at_block=0, text="a red ball")
    token = ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)
    with grpc.insecure_channel(vae_address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        request = worker_pb2.OpenSessionRequest(session_id="pinned", spec=spec)
        with pytest.raises(grpc.RpcError) as refused:
            stub.OpenSession(request, metadata=token, timeout=60)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "decodes with vae" in refused.value.details() and recorded in refused.value.details()
