"""Mutual TLS between the mesh's services (mesh TLS), with a throwaway PKI made here (real X.509).

A mesh whose internal ports (kvcache_svc, the streamer's gRPC, the worker, the scheduler's internal port)
require a client certificate from the mesh CA serves a session end to end, frame for frame as `inferix
generate`; a caller without a certificate, or with one from another CA, is refused at the handshake (and
the callee's log says why); the internal token is still checked; rotated certificates are served and
presented without a restart; `inferix serve --mesh-tls` makes its own PKI.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferix.api.v1 import kvcache_pb2, kvcache_pb2_grpc, streamer_pb2, streamer_pb2_grpc
from inferix.client import BlockDone, Client, PromptChange
from inferix.health import check
from inferix.mesh_channel import CHECK_INTERVAL_S, RotatingChannel
from inferix.mesh_tls import MeshTls
from inferix.server import INTERNAL_TOKEN_ENV, INTERNAL_TOKEN_HEADER
from inferix_cli.mesh import Mesh, start_mesh
from inferix_cli.mesh.local import MESH_ROLES
from tests.mesh.conftest import KEY_A, generate_digest, mesh_config
from tests.mesh.test_supervisor import Serve, assert_stopped_cleanly
from tests.tls.certs import Authority, install_pair, serial_of, served_serial


@dataclass(frozen=True)
class MeshPki:
    """The mesh CA with a certificate per role, a client of the mesh (the test), and an outsider (another CA)."""

    folder: Path
    ca: Authority
    roles: dict[str, MeshTls]
    member: MeshTls
    outsider: MeshTls

    def issue(self, name: str, authority: Authority | None = None) -> tuple[Path, Path]:
        return (authority or self.ca).issue(self.folder, name, client=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> MeshPki:
    folder = tmp_path_factory.mktemp("mesh-pki")
    ca, other = Authority.create(folder, "mesh-ca"), Authority.create(folder, "other-ca")
    roles = {role: MeshTls(ca.cert_path, *ca.issue(folder, role, client=True)) for role in MESH_ROLES}
    member = MeshTls(ca.cert_path, *ca.issue(folder, "test-client", client=True))
    outsider = MeshTls(ca.cert_path, *other.issue(folder, "outsider", client=True))
    return MeshPki(folder, ca, roles, member, outsider)


@pytest.fixture(scope="module")
def mtls_mesh(pki: MeshPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    config = mesh_config(
        tmp_path_factory.mktemp("mtls-mesh"), workers=1, capacity_probe=0, rtmp="off", mesh_tls=pki.roles
    )
    mesh = start_mesh(config)
    yield mesh
    codes = mesh.stop()
    assert all(code == 0 for code in codes.values()), codes


def internal_ports(mesh: Mesh) -> dict[str, str]:
    """Every port that must require the mesh's certificate, by the service whose log tells about it."""
    return {
        "kvcache": mesh.kvcache.address,
        "streamer": mesh.streamer.address,
        "worker0": mesh.workers[0].address,
        "scheduler": mesh.internal_address,
    }


def token(mesh: Mesh) -> tuple[tuple[str, str], ...]:
    return ((INTERNAL_TOKEN_HEADER, mesh.config.env[INTERNAL_TOKEN_ENV]),)


def mtls_channel(address: str, identity: MeshTls | None, ca: Path) -> grpc.Channel:
    """A channel to `address` presenting `identity`'s certificate (None: none), trusting `ca`."""
    if identity is None:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes()))
    return grpc.secure_channel(address, identity.channel_credentials())


def health_of(channel: grpc.Channel) -> str:
    """The server's health as seen through `channel`, or the failing status code's name."""
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    except grpc.RpcError as exc:
        return exc.code().name  # type: ignore[attr-defined, no-any-return]
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_a_session_runs_end_to_end_over_mutual_tls(mtls_mesh: Mesh, pki: MeshPki) -> None:
    schedule = (PromptChange(0, "a red ball bouncing to the right"), PromptChange(2, "the ball turns green"))
    with Client(mtls_mesh.address, api_key=KEY_A, timeout=60) as client:  # the public port: no client certificate
        info = client.create_session(list(schedule), num_blocks=3, seed=7)
        events = list(client.events(info.session_id))
        assert [e.block_index for e in events if isinstance(e, BlockDone)] == [0, 1, 2]
        final = client.get_session(info.session_id)
        assert final.state == "completed"
        # The recording comes from the streamer's viewer server, not its mTLS-only gRPC port.
        mp4 = client.download_recording(final, mtls_mesh.config.workdir / "downloaded.mp4")
        assert mp4.read_bytes()[4:8] == b"ftyp"
    # The viewer page's status: the streamer asks the scheduler, on its internal port (mutual TLS).
    page, _, viewer_token = final.viewer_url.replace("/watch/", "/api/sessions/").partition("#token=")
    request = urllib.request.Request(page, headers={"Authorization": f"Bearer {viewer_token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        status = json.dumps(json.load(reply))
    assert info.session_id in status and '"state": "completed"' in status, status
    with mtls_channel(mtls_mesh.streamer.address, pki.member, pki.ca.cert_path) as channel:
        stub = streamer_pb2_grpc.StreamerServiceStub(channel)
        streamed = stub.GetStreamInfo(streamer_pb2.GetStreamInfoRequest(session_id=info.session_id), timeout=30)
    assert streamed.finished and streamed.frames == 9
    assert streamed.frames_sha256 == generate_digest(schedule, 3, 7)  # bit-exact with the plaintext CLI
    for name in ("kvcache", "streamer", "worker0", "scheduler"):
        log = (mtls_mesh.config.workdir / f"{name}.log").read_text()
        assert "mutual TLS" in log, f"{name} did not serve mutual TLS:\n{log[-2000:]}"


def test_internal_ports_refuse_callers_without_a_mesh_certificate(mtls_mesh: Mesh, pki: MeshPki) -> None:
    ca = pki.ca.cert_path
    for name, address in internal_ports(mtls_mesh).items():
        with grpc.insecure_channel(address) as plaintext:
            assert health_of(plaintext) == "UNAVAILABLE", name
        with mtls_channel(address, None, ca) as anonymous:
            assert health_of(anonymous) == "UNAVAILABLE", name
        with mtls_channel(address, pki.outsider, ca) as outsider:
            assert health_of(outsider) == "UNAVAILABLE", name
        with mtls_channel(address, pki.member, ca) as member:
            assert health_of(member) == "SERVING", name
        # The callee's log names each refusal: no certificate, and one it cannot chain to the mesh CA.
        log = (mtls_mesh.config.workdir / f"{name}.log").read_text()
        assert "Handshake failed" in log and "PEER_DID_NOT_RETURN_A_CERTIFICATE" in log, f"{name}:\n{log[-3000:]}"
        assert "CERTIFICATE_VERIFY_FAILED" in log, f"{name}:\n{log[-3000:]}"
    # Probes without a certificate have a plaintext port that answers health checks and nothing else.
    assert check(mtls_mesh.health_address, "inferix.v1.SchedulerService") == (True, "SERVING")


def test_the_internal_token_is_still_checked(mtls_mesh: Mesh, pki: MeshPki) -> None:
    with mtls_channel(mtls_mesh.kvcache.address, pki.member, pki.ca.cert_path) as channel:
        stub = kvcache_pb2_grpc.KVCacheServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        workers = stub.ListWorkers(kvcache_pb2.ListWorkersRequest(), timeout=10, metadata=token(mtls_mesh))
        assert [w.worker_id for w in workers.workers] == ["worker0"]


def test_a_rotated_server_certificate_is_served_without_a_restart(mtls_mesh: Mesh, pki: MeshPki) -> None:
    kvcache = pki.roles["kvcache"]
    before = served_serial("127.0.0.1", mtls_mesh.kvcache.port)
    assert before == serial_of(kvcache.cert.read_bytes())
    renewed = pki.issue("kvcache-renewed")
    install_pair(*renewed, into=(kvcache.cert, kvcache.key))
    assert served_serial("127.0.0.1", mtls_mesh.kvcache.port) == serial_of(renewed[0].read_bytes())
    pid = mtls_mesh.kvcache.pid
    with Client(mtls_mesh.address, api_key=KEY_A, timeout=60) as client:  # the worker reaches it again
        info = client.create_session("a blue square", num_blocks=1)
        assert [e.block_index for e in client.events(info.session_id) if isinstance(e, BlockDone)] == [0]
    assert mtls_mesh.kvcache.pid == pid and mtls_mesh.kvcache.alive()


def test_a_channel_presents_its_rotated_certificate(mtls_mesh: Mesh, pki: MeshPki, tmp_path: Path) -> None:
    """An internal channel re-reads its files: an outsider's certificate put in their place is refused by the
    callee, the mesh's again is accepted, on the same channel object (the stubs the services hold)."""
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    shutil.copyfile(pki.member.cert, cert)
    shutil.copyfile(pki.member.key, key)
    identity = MeshTls(pki.ca.cert_path, cert, key)
    address = mtls_mesh.kvcache.address

    async def health(channel: RotatingChannel) -> str:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return "SERVING"

    async def run() -> list[str]:
        channel = RotatingChannel(identity, lambda creds: grpc.aio.secure_channel(address, creds))
        seen = [await health(channel)]
        for source in (pki.outsider, pki.member):
            install_pair(source.cert, source.key, into=(cert, key))
            time.sleep(CHECK_INTERVAL_S)
            seen.append(await health(channel))
        await channel.close()
        return seen

    assert asyncio.run(run()) == ["SERVING", "UNAVAILABLE", "SERVING"]


def test_serve_mesh_tls_makes_its_own_pki(tmp_path: Path) -> None:
    serve = Serve(tmp_path / "serve", "--mesh-tls", "--rtmp", "off", "--capacity-probe", "0")
    try:
        assert serve.wait_for_line(r"^mesh TLS\s+mutual TLS between the services, CA (\S+)").group(1) == str(
            serve.workdir.resolve() / "mesh-tls" / "ca.crt"
        )
        folder = serve.workdir / "mesh-tls"
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f"{role}.{ext}" for role in MESH_ROLES for ext in ("crt", "key")] + ["ca.crt"]
        )
        assert all(stat.S_IMODE(os.stat(folder / f"{role}.key").st_mode) == 0o600 for role in MESH_ROLES)
        with Client(serve.address, api_key=KEY_A, timeout=60) as client:
            info = client.create_session("a red ball", num_blocks=1)
            assert [e.block_index for e in client.events(info.session_id) if isinstance(e, BlockDone)] == [0]
        with grpc.insecure_channel(serve.kvcache) as plaintext:
            assert health_of(plaintext) == "UNAVAILABLE"
        ca = folder / "ca.crt"
        with mtls_channel(serve.kvcache, MeshTls(ca, folder / "serve.crt", folder / "serve.key"), ca) as member:
            assert health_of(member) == "SERVING"
        assert_stopped_cleanly(serve, serve.finish(signal.SIGTERM))
    finally:
        serve.close()
