"""A throwaway mesh CA and one certificate per service, for `inferix serve --mesh-tls`.

Made fresh at each start in `<workdir>/mesh-tls/` (keys readable by the owner only): an ECDSA P-256
CA valid for `VALID_DAYS`, and for each service a certificate for 127.0.0.1 and localhost, usable as a
server and as a client (mutual TLS). The CA's key is not kept: nothing else is ever signed with it, and
a restart of `inferix serve` makes a new mesh.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from inferix.errors import UserError
from inferix.mesh_tls import MeshTls

VALID_DAYS = 30
HOSTS = ("127.0.0.1", "localhost")


def make_mesh_pki(folder: Path, services: tuple[str, ...]) -> dict[str, MeshTls]:
    """A new CA and a certificate per service under `folder`: {service: its MeshTls}."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise UserError(
            "--mesh-tls needs the cryptography package to make its certificates: pip install cryptography, "
            "or pass --mesh-tls-ca/--mesh-tls-cert/--mesh-tls-key"
        ) from None
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)

    def write(path: Path, data: bytes, private: bool = False) -> Path:
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "inferix serve mesh CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digitalSignature, keyCertSign, cRLSign
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = write(folder / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(HOSTS[0])), x509.DNSName(HOSTS[1])]
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    configs = {}
    for service in services:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"inferix-{service}")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(usage, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        pem_key = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        configs[service] = MeshTls(
            ca_path,
            write(folder / f"{service}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            write(folder / f"{service}.key", pem_key, private=True),
        )
    return configs
