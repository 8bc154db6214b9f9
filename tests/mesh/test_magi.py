"""MAGI-1 through the mesh: a chunk-pipelined session served by workers, its worker SIGKILLed mid-way,
finished by the other one from the committed chunks and their carries, frames identical to
`inferix generate`."""

from __future__ import annotations

from pathlib import Path

from engine.registry import load_engine
from inferix.client import BlockDone, Client, PromptChange, StateChanged
from inferix.frames_digest import FramesDigest
from inferix_cli.mesh import start_mesh
from tests.engine.magi.conftest import SECOND_PROMPT, make_magi_folder
from tests.mesh.conftest import KEY_A, kill_worker, mesh_config, stream_info

CHUNKS, SEED = 6, 11


def generated_digest(folder: Path, schedule: tuple[PromptChange, ...]) -> str:
    """sha256 of the frames the in-process engine makes (what `inferix generate` runs)."""
    digest = FramesDigest()
    with load_engine(folder).open(schedule[0].text, seed=SEED, num_blocks=CHUNKS) as video:
        for index in range(CHUNKS):
            for change in schedule[1:]:
                if change.at_block == index:
                    video.set_prompt(change.text)
            digest.update_frames(video.next_block().frames)
    return digest.hexdigest()


def test_a_magi_session_survives_a_worker_sigkill_with_identical_frames(tmp_path: Path) -> None:
    folder = make_magi_folder("magi1_tiny_distill", tmp_path / "magi1-tiny", preset="magi1-tiny")
    schedule = (PromptChange(0, "a red fox"), PromptChange(3, SECOND_PROMPT))
    mesh = start_mesh(mesh_config(tmp_path / "mesh", workers=2, model=folder, rtmp="off", lookahead=1))
    try:
        with Client(mesh.address, api_key=KEY_A, timeout=120) as client:
            info = client.create_session(list(schedule), model="magi1-tiny", num_blocks=CHUNKS, seed=SEED)
            events: list[object] = []
            killed = ""
            for event in client.events(info.session_id):
                events.append(event)
                if isinstance(event, BlockDone) and event.block_index == 1 and not killed:
                    killed = kill_worker(mesh, event.worker_id)
            final = client.get_session(info.session_id)
        blocks = [e for e in events if isinstance(e, BlockDone)]
        assert [b.block_index for b in blocks] == list(range(CHUNKS))  # every chunk once, in order
        assert killed not in {b.worker_id for b in blocks[3:]}
        assert [e.state for e in events if isinstance(e, StateChanged)][-1] == "completed"
        assert final.state == "completed" and final.blocks_done == CHUNKS
        streamed = stream_info(mesh, info.session_id)
        assert streamed.frames == CHUNKS * 12  # a chunk of 3 latent frames decodes to 12 frames
        assert streamed.frames_sha256 == generated_digest(folder, schedule)
        survivor = next(w for w in mesh.workers if w.name != killed)
        assert "restored from" in (mesh.config.workdir / f"{survivor.name}.log").read_text()
    finally:
        mesh.workers = [w for w in mesh.workers if w.name != killed] if killed else mesh.workers
        mesh.stop()
