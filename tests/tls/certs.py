"""Throwaway certificate authorities and server certificates for the TLS tests (real X.509, `cryptography`)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_NOW = datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate (PEM file) and key, to sign server certificates with."""

    cert_path: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, folder: Path, name: str) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_NOW - datetime.timedelta(days=1))
            .not_valid_after(_NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        path = folder / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(path, cert, key)

    def issue(
        self,
        folder: Path,
        name: str,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        valid_days: float = 30,
        expired: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        """A server certificate for `hosts` (IPs or DNS names), also a client one with `client` (mutual TLS):
        (cert PEM, key PEM) under `folder`."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        start = _NOW - datetime.timedelta(days=10 if expired else 1)
        end = _NOW - datetime.timedelta(days=1) if expired else _NOW + datetime.timedelta(days=valid_days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
                    + ([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cert_path, key_path


def serial_of(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def install_pair(cert: Path, key: Path, into: tuple[Path, Path]) -> None:
    """Replace served files as a deploy tool does: a new file renamed over each (key first)."""
    for source, target in ((key, into[1]), (cert, into[0])):
        staged = target.with_suffix(".new")
        shutil.copyfile(source, staged)
        staged.replace(target)


def served_serial(host: str, port: int) -> int:
    """The serial number of the certificate a new TLS connection is served (unverified: only read)."""
    return serial_of(ssl.get_server_certificate((host, port), timeout=10).encode())


def spki_pin(cert: Path) -> str:
    """base64 SHA-256 of the certificate's public key: Chromium's --ignore-certificate-errors-spki-list."""
    public = x509.load_pem_x509_certificate(cert.read_bytes()).public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = hashes.Hash(hashes.SHA256())
    digest.update(der)
    return base64.b64encode(digest.finalize()).decode()
