"""What a client is told when TLS does not fit: a plaintext client, a TLS client to a plaintext port, a wrong CA."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from inferix.client import AsyncClient, Client, TlsError
from inferix.health import check
from inferix_cli.mesh.launch import ServiceProcess
from tests.tls.conftest import Pki, inferix_cli


def _internal(scheduler: ServiceProcess) -> str:
    return f"127.0.0.1:{scheduler.ports['internal']}"


def test_tls_client_is_served(tls_scheduler: ServiceProcess, pki: Pki) -> None:
    address = f"grpcs://{tls_scheduler.address}"
    with Client(address, ca=pki.ca.cert_path, timeout=10) as client, pytest.raises(grpc.RpcError) as error:
        client.get_session("no-such-session")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND  # the call went through: the session is unknown


def test_plaintext_client_is_told_to_use_tls(tls_scheduler: ServiceProcess) -> None:
    expected = f"TLS handshake with {tls_scheduler.address} failed: the server requires TLS; use grpcs:// or --tls"
    with Client(tls_scheduler.address, timeout=10) as client, pytest.raises(TlsError) as error:
        client.get_session("no-such-session")
    assert str(error.value) == expected
    # Still what code written before TLS catches: a grpc.RpcError with UNAVAILABLE.
    assert isinstance(error.value, grpc.RpcError) and error.value.code() == grpc.StatusCode.UNAVAILABLE

    result = inferix_cli("session", "--server", tls_scheduler.address, "get", "no-such-session")
    assert result.returncode == 2
    assert f"inferix session: error: {expected}" in result.stderr.splitlines()


def test_wrong_ca_is_refused(tls_scheduler: ServiceProcess, pki: Pki) -> None:
    other = pki.other_ca.cert_path
    expected = f"TLS handshake with {tls_scheduler.address} failed: the server's certificate is not signed by "
    expected += f"the CA in {other}"
    with Client(f"grpcs://{tls_scheduler.address}", ca=other, timeout=10) as client, pytest.raises(TlsError) as error:
        client.list_sessions()
    assert str(error.value) == expected

    result = inferix_cli("session", "--server", f"grpcs://{tls_scheduler.address}", "--ca", str(other), "list")
    assert result.returncode == 2
    assert f"inferix session: error: {expected}" in result.stderr.splitlines()


def test_system_roots_do_not_trust_a_private_ca(tls_scheduler: ServiceProcess) -> None:
    with Client(f"grpcs://{tls_scheduler.address}", timeout=10) as client, pytest.raises(TlsError) as error:
        client.list_sessions()
    assert "not signed by a CA this system trusts (pass --ca FILE)" in str(error.value)


def test_tls_client_to_a_plaintext_port(tls_scheduler: ServiceProcess, pki: Pki) -> None:
    internal = _internal(tls_scheduler)
    expected = f"TLS handshake with {internal} failed: the server speaks plaintext; drop --tls or grpcs://"
    # --tls with a plain HOST:PORT, and the CA from the environment, as a user would set it.
    result = inferix_cli("session", "--server", internal, "--tls", "list", env={"INFERIX_CA": str(pki.ca.cert_path)})
    assert result.returncode == 2
    assert f"inferix session: error: {expected}" in result.stderr.splitlines()


def test_async_client_errors(tls_scheduler: ServiceProcess, pki: Pki) -> None:
    async def run() -> None:
        async with AsyncClient(tls_scheduler.address, timeout=10) as plain:
            with pytest.raises(TlsError, match="the server requires TLS"):
                await plain.get_session("no-such-session")
        async with AsyncClient(tls_scheduler.address, tls=True, ca=pki.other_ca.cert_path.read_bytes()) as wrong:
            with pytest.raises(TlsError, match="not signed by the given CA"):
                await wrong.list_sessions()
        async with AsyncClient(f"grpcs://{tls_scheduler.address}", ca=pki.ca.cert_path, timeout=10) as client:
            assert await client.list_sessions() == []

    asyncio.run(run())


def test_health_probe_over_tls(tls_scheduler: ServiceProcess, pki: Pki) -> None:
    assert check(f"grpcs://{tls_scheduler.address}", ca=pki.ca.cert_path) == (True, "SERVING")
    assert check(_internal(tls_scheduler)) == (True, "SERVING")  # the plaintext port of probes and the streamer
    serving, status = check(tls_scheduler.address)  # plaintext to the TLS port
    assert not serving and status.startswith("UNAVAILABLE"), status


def test_address_schemes() -> None:
    from inferix.client.tls import resolve

    assert resolve("grpcs://h:443").tls and resolve("https://h:443/").address == "h:443"
    assert not resolve("h:50051").tls and not resolve("grpc://h:50051").tls
    assert resolve("h:50051", tls=True).tls and resolve("h:50051", ca=b"pem").tls
    with pytest.raises(ValueError, match="asks for TLS"):
        resolve("grpcs://h:443", tls=False)
    assert resolve("grpcs://api.example.com").endpoint() == ("api.example.com", 443)  # gRPC's default port
    assert resolve("grpcs://[::1]:50051").endpoint() == ("::1", 50051)
    assert resolve("unix:/run/inferix.sock").endpoint() is None  # no TCP endpoint to probe: errors pass as they are
