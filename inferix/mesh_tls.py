"""Certificates on disk for gRPC, and mutual TLS between the mesh's services.

`CertificateFiles` serves a certificate and key that are read again whenever the files change (the
scheduler's public TLS port uses it, and every mesh-TLS port). With a `client_ca` it also requires
each client to present a certificate that chains to that CA, re-read with the pair.

Mesh TLS (`MeshTls`): every internal port (kvcache_svc, workers, the streamer's gRPC, the scheduler's
internal port) requires a client certificate signed by the mesh CA, and every internal call
(`inferix.server.channel`) presents the service's own certificate and checks the callee's against the
mesh CA, for the host name it dials (the chart's Service DNS names; 127.0.0.1 under `inferix serve`).
Each service has one certificate, used both ways. It is configured per process, from
`--mesh-tls-ca/--mesh-tls-cert/--mesh-tls-key` or INFERIX_MESH_TLS_CA/_CERT/_KEY; the internal token
(INFERIX_INTERNAL_TOKEN) is still sent and checked on top of it.

Rotation: servers re-read the three files before each new handshake (as the public port does); a
channel re-reads them when they changed since it connected, and new calls then go over a fresh
connection with the new certificate (see inferix/mesh_channel.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("inferix.server")

CA_ENV, CERT_ENV, KEY_ENV = "INFERIX_MESH_TLS_CA", "INFERIX_MESH_TLS_CERT", "INFERIX_MESH_TLS_KEY"

Stamp = tuple[tuple[int, int, int], ...]


def stamp_of(*paths: Path) -> Stamp:
    """(inode, size, mtime) of each file, following symlinks: a Kubernetes Secret update swaps a symlink."""
    stats = [os.stat(path) for path in paths]
    return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


class CertificateFiles:
    """A certificate and key on disk (and the CA of the clients, for mutual TLS), served by gRPC and read
    again whenever a file changes.

    `grpc.dynamic_ssl_server_credentials` asks `fetch` before each new handshake: it compares the files'
    (inode, size, mtime), which also catches a Kubernetes Secret update (a symlink swapped to a new
    file). A set that does not load (half-written, key not matching) is not taken: the server keeps the
    previous one, logs a warning, and tries again once the files change again.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self._stamp: Stamp | None = None
        self._refused: Stamp | None = None

    def _paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        """The files, checked to load as a server certificate (and a CA) (ssl.SSLError, OSError otherwise)."""
        stamp = stamp_of(*self._paths())
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        roots = None
        if self.client_ca is not None:
            roots = self.client_ca.read_bytes()
            context.load_verify_locations(cadata=roots.decode(errors="replace"))
        pair = (self.key.read_bytes(), self.cert.read_bytes())
        config = grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)
        self._stamp = stamp
        return config

    def _describe(self) -> str:
        ca = f" / CA {self.client_ca}" if self.client_ca is not None else ""
        return f"TLS certificate {self.cert} / key {self.key}{ca}"

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """The new files when they changed, None to keep serving the current ones."""
        try:
            stamp = stamp_of(*self._paths())
            if stamp in (self._stamp, self._refused):
                return None
            self._refused = stamp  # warned once per bad set, not at every handshake
            config = self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("%s not reloaded (keeping the current one): %s", self._describe(), exc)
            return None
        log.info("TLS certificate reloaded from %s", self.cert)
        return config

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that follow the files (client certificates required with a `client_ca`);
        SystemExit when they do not load now."""
        try:
            initial = self._load()
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"error: {self._describe()}: {exc}") from None
        return grpc.dynamic_ssl_server_credentials(
            initial, self.fetch, require_client_authentication=self.client_ca is not None
        )


@dataclass(frozen=True)
class MeshTls:
    """The mesh CA and this service's certificate and key (PEM files), used to serve and to call."""

    ca: Path
    cert: Path
    key: Path

    def server_credentials(self) -> grpc.ServerCredentials:
        """mTLS for an internal port: this service's pair, clients must chain to the mesh CA."""
        return CertificateFiles(self.cert, self.key, client_ca=self.ca).credentials()

    def stamp(self) -> Stamp:
        return stamp_of(self.ca, self.cert, self.key)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """This service's certificate for the callee, and the mesh CA to check the callee's (files read now)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )

    def environ(self) -> dict[str, str]:
        """The environment that gives a child process this configuration."""
        return {CA_ENV: str(self.ca), CERT_ENV: str(self.cert), KEY_ENV: str(self.key)}


def add_mesh_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """`--mesh-tls-ca/-cert/-key`, defaulting to INFERIX_MESH_TLS_CA/_CERT/_KEY."""
    group = parser.add_argument_group("mesh TLS (mutual TLS between the mesh's services)")
    for flag, env, what in (
        ("ca", CA_ENV, "PEM CA of the mesh: internal callers and callees must present a certificate it signed"),
        ("cert", CERT_ENV, "PEM certificate chain of this service, presented to callers and callees"),
        ("key", KEY_ENV, "PEM private key of --mesh-tls-cert"),
    ):
        value = os.environ.get(env)
        group.add_argument(
            f"--mesh-tls-{flag}",
            type=Path,
            default=Path(value) if value else None,
            help=f"{what} (re-read when it changes; env {env})",
        )


def mesh_tls_from_args(args: argparse.Namespace) -> MeshTls | None:
    """From `add_mesh_tls_arguments`' flags; None when mesh TLS is off (or the parser has no such flags)."""
    paths = [getattr(args, f"mesh_tls_{name}", None) for name in ("ca", "cert", "key")]
    if all(path is None for path in paths):
        return None
    ca, cert, key = paths
    if ca is None or cert is None or key is None:
        raise SystemExit(
            "error: mesh TLS needs --mesh-tls-ca, --mesh-tls-cert and --mesh-tls-key together "
            f"(or {CA_ENV}, {CERT_ENV}, {KEY_ENV})"
        )
    return MeshTls(ca, cert, key)


_active: MeshTls | None = None


def use(config: MeshTls | None) -> None:
    """Set this process's mesh TLS: every internal channel made afterwards presents it (one identity per
    process, as for the internal token); `inferix.server.run_server` calls it before the service starts."""
    global _active
    _active = config


def active() -> MeshTls | None:
    return _active
