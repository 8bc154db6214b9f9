"""A rotated certificate is served without a restart; a broken pair is not taken; expired and
mismatched certificates give clear errors."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import pytest

from inferix.client import Client, TlsError
from inferix_cli.mesh.launch import ServiceProcess
from tests.tls.certs import serial_of
from tests.tls.conftest import Pki, start_tls_scheduler


def _served_serial(scheduler: ServiceProcess) -> int:
    """The serial number of the certificate a new connection is served (unverified: we only read it)."""
    pem = ssl.get_server_certificate((scheduler.host, scheduler.port), timeout=10)
    return serial_of(pem.encode())


def _install(cert: Path, key: Path, into: tuple[Path, Path]) -> None:
    """Replace the served files as a deploy tool does: a new file renamed over each (key first)."""
    for source, target in ((key, into[1]), (cert, into[0])):
        staged = target.with_suffix(".new")
        shutil.copyfile(source, staged)
        staged.replace(target)


def _list(scheduler: ServiceProcess, pki: Pki) -> None:
    with Client(f"grpcs://{scheduler.address}", ca=pki.ca.cert_path, timeout=10) as client:
        assert client.list_sessions() == []


@pytest.fixture
def served(pki: Pki, tmp_path: Path) -> tuple[Path, Path]:
    """The files the scheduler serves, a copy of the PKI's server certificate to rotate."""
    files = (tmp_path / "tls.crt", tmp_path / "tls.key")
    _install(pki.cert, pki.key, files)
    return files


def test_rotated_certificate_is_served_without_restart(pki: Pki, served: tuple[Path, Path], tmp_path: Path) -> None:
    scheduler = start_tls_scheduler(tmp_path / "scheduler", *served)
    try:
        assert _served_serial(scheduler) == serial_of(pki.cert.read_bytes())
        _list(scheduler, pki)

        rotated_cert, rotated_key = pki.issue("rotated")
        _install(rotated_cert, rotated_key, served)
        assert _served_serial(scheduler) == serial_of(rotated_cert.read_bytes())
        _list(scheduler, pki)

        # Half a rotation (a new certificate, the old key) is refused: the last good pair is still served.
        third_cert, _ = pki.issue("third")
        shutil.copyfile(third_cert, served[0])
        assert _served_serial(scheduler) == serial_of(rotated_cert.read_bytes())
        _list(scheduler, pki)
        assert "not reloaded (keeping the current one)" in scheduler.log_path.read_text()
        assert scheduler.alive()
    finally:
        assert scheduler.stop() == 0


def test_expired_and_mismatched_certificates(pki: Pki, served: tuple[Path, Path], tmp_path: Path) -> None:
    scheduler = start_tls_scheduler(tmp_path / "scheduler", *served)
    address = f"grpcs://{scheduler.address}"
    prefix = f"TLS handshake with {scheduler.address} failed: "
    try:
        _install(*pki.issue("expired", expired=True), into=served)
        with Client(address, ca=pki.ca.cert_path, timeout=10) as client, pytest.raises(TlsError) as error:
            client.list_sessions()
        assert str(error.value) == prefix + "the server's certificate has expired; renew it"

        _install(*pki.issue("elsewhere", hosts=("scheduler.example.com",)), into=served)
        with Client(address, ca=pki.ca.cert_path, timeout=10) as client, pytest.raises(TlsError) as error:
            client.list_sessions()
        expected = "the server's certificate is not valid for 127.0.0.1; connect with a name it lists"
        assert str(error.value) == prefix + expected
    finally:
        assert scheduler.stop() == 0
