"""TLS to the scheduler: which addresses mean TLS, channel credentials, and why a handshake failed.

`grpcs://host:port` and `https://host:port` mean TLS; `grpc://` and `http://` and a plain
`host:port` mean plaintext unless TLS is asked for (`tls=True`, `--tls`, or a CA given). The server's
certificate is checked against the given CA, or the system's roots by default.

gRPC reports every failed handshake as UNAVAILABLE with details that vary across versions, so
`diagnose` asks the server itself: one TLS handshake with Python's `ssl` says whether it speaks TLS
and, if so, what is wrong with its certificate. The result is a `TlsError`: still a `grpc.RpcError`
with code UNAVAILABLE (code that catches those keeps working), whose message says what to do.
"""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

_TLS_SCHEMES = ("grpcs://", "https://")
_PLAIN_SCHEMES = ("grpc://", "http://")
_PROBE_TIMEOUT_S = 3.0
_ENDPOINT = re.compile(r"\[?([^\[\]/]+?)\]?(?::(\d+))?")  # host:port, [v6]:port, host
# OpenSSL verify codes (X509_V_ERR_*) that mean "not signed by a CA we trust".
_UNTRUSTED = {2, 18, 19, 20, 21, 27}
_EXPIRED, _NOT_YET_VALID, _HOSTNAME_MISMATCH, _IP_MISMATCH = 10, 9, 62, 64


@dataclass(frozen=True)
class Target:
    """Where a client connects: `address` (host:port, as gRPC takes it) and whether over TLS."""

    address: str
    tls: bool
    ca: bytes | None = None
    ca_label: str = ""  # "the CA in FILE" as the user named it, or "the given CA", for messages

    @property
    def host(self) -> str:
        endpoint = self.endpoint()
        return endpoint[0] if endpoint else self.address

    def endpoint(self) -> tuple[str, int] | None:
        """(host, port) to probe, port 443 when none is given (as gRPC does); None for a target that is not
        HOST[:PORT] (unix:..., dns:///...)."""
        match = _ENDPOINT.fullmatch(self.address)
        if match is None:
            return None
        return match.group(1), int(match.group(2) or 443)

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials: the CA's certificates, or the system's roots (ca None)."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca)


def resolve(address: str, tls: bool | None = None, ca: Path | str | bytes | None = None) -> Target:
    """The target of `address` (`grpcs://` / `https://` = TLS); `tls` True or a CA force TLS, `tls` False
    with a TLS scheme is a contradiction (ValueError)."""
    scheme_tls: bool | None = None
    for prefix in (*_TLS_SCHEMES, *_PLAIN_SCHEMES):
        if address.startswith(prefix):
            scheme_tls = prefix in _TLS_SCHEMES
            address = address.removeprefix(prefix).rstrip("/")
            break
    if scheme_tls and tls is False:
        raise ValueError(f"address {address!r} asks for TLS (grpcs://) but tls=False")
    ca_bytes, ca_label = _load_ca(ca)
    use_tls = bool(tls or scheme_tls or (tls is None and ca_bytes is not None))
    return Target(address, use_tls, ca_bytes if use_tls else None, ca_label)


def _load_ca(ca: Path | str | bytes | None) -> tuple[bytes | None, str]:
    if ca is None or ca == "":
        return None, ""
    if isinstance(ca, bytes):
        return ca, "the given CA"
    path = Path(ca)
    try:
        return path.read_bytes(), f"the CA in {path}"
    except OSError as exc:
        raise ValueError(f"CA file {path}: {exc.strerror or exc}") from None


class TlsError(grpc.RpcError):
    """A TLS handshake with the scheduler failed; `details()` says why and what to do (code UNAVAILABLE)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message


def translate(error: grpc.RpcError, target: Target) -> grpc.RpcError:
    """`error` as a `TlsError` when it is an UNAVAILABLE caused by TLS (see `diagnose`), else itself."""
    if isinstance(error, TlsError):
        return error
    # A sync call error is a grpc.Call, an asyncio one (AioRpcError) is not: both have code().
    code = getattr(error, "code", None)
    if code is None or code() != grpc.StatusCode.UNAVAILABLE:
        return error
    message = diagnose(target)
    return TlsError(message) if message is not None else error


def diagnose(target: Target) -> str | None:
    """Why a connection to `target` fails because of TLS, in one line; None when TLS is not the cause
    (nothing listens, the server is going away)."""
    if not target.tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            _handshake(target, context)
        except OSError:  # ssl.SSLError included: the server does not speak TLS either
            return None
        return f"TLS handshake with {target.address} failed: the server requires TLS; use grpcs:// or --tls"
    prefix = f"TLS handshake with {target.address} failed"
    # With a CA given, only it is trusted (create_default_context loads the system's roots only without one).
    try:
        context = ssl.create_default_context(cadata=target.ca.decode(errors="replace") if target.ca else None)
    except ssl.SSLError:
        return f"{prefix}: {target.ca_label} holds no PEM certificate"
    try:
        _handshake(target, context)
    except ssl.SSLCertVerificationError as exc:
        return f"{prefix}: {_certificate_problem(exc, target)}"
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return f"{prefix}: the server speaks plaintext; drop --tls or grpcs://"
    except OSError:
        return None  # refused, unreachable, timed out: nothing to do with TLS
    return None


def _handshake(target: Target, context: ssl.SSLContext) -> None:
    """One TLS handshake with the server (ssl errors as raised; OSError when the target is no host:port)."""
    endpoint = target.endpoint()
    if endpoint is None:
        raise OSError(f"{target.address}: not a host:port to probe")
    context.set_alpn_protocols(["h2"])
    server_hostname = endpoint[0] if context.check_hostname else None
    with (
        socket.create_connection(endpoint, timeout=_PROBE_TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname),
    ):
        pass


def _certificate_problem(exc: ssl.SSLCertVerificationError, target: Target) -> str:
    code = exc.verify_code
    if code in _UNTRUSTED:
        signer = target.ca_label if target.ca is not None else "a CA this system trusts (pass --ca FILE)"
        return f"the server's certificate is not signed by {signer}"
    if code == _EXPIRED:
        return "the server's certificate has expired; renew it"
    if code == _NOT_YET_VALID:
        return "the server's certificate is not valid yet (check the clocks)"
    if code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
        return f"the server's certificate is not valid for {target.host}; connect with a name it lists"
    return f"the server's certificate was refused: {exc.verify_message}"
