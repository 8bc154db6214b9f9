"""`python -m inferix.health ADDRESS [SERVICE]`: a gRPC health probe (grpc.health.v1) for containers.

Docker's HEALTHCHECK and Kubernetes exec probes run it inside the container::

    python -m inferix.health 127.0.0.1:50051                              # the server as a whole
    python -m inferix.health 127.0.0.1:50051 inferix.v1.SchedulerService  # one service
    python -m inferix.health grpcs://127.0.0.1:50051 --ca ca.pem          # a TLS port

Exit code 0 when the answer is SERVING, 1 otherwise (NOT_SERVING, unknown service, no answer within
`--timeout`), so a draining server (SIGTERM) reads as unhealthy at once. Kubernetes can also probe
gRPC natively (`grpc:` probes), which the Helm chart uses; this module is for everything else.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(address: str, tls: bool | None, ca: Path | bytes | None) -> grpc.Channel:
    """A channel to `address`: TLS for `grpcs://`, `tls=True` or a CA (checked against it, or the system's
    roots), plaintext otherwise. (The SDK's inferix.client.tls says more about failures; this probe, a
    sibling of the SDK, reports gRPC's status as it comes.)"""
    secure = address.startswith("grpcs://") or bool(tls) or ca is not None
    address = address.removeprefix("grpcs://")
    if not secure:
        return grpc.insecure_channel(address)
    roots = ca.read_bytes() if isinstance(ca, Path) else ca
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=roots))


def check(
    address: str, service: str = "", timeout: float = 3.0, tls: bool | None = None, ca: Path | bytes | None = None
) -> tuple[bool, str]:
    """Ask `address` for the health of `service` ("" = the whole server): (serving?, what was seen).

    TLS as for the SDK: `grpcs://` in the address, `tls=True` or a `ca` (default: the system's roots)."""
    with _channel(address, tls, ca) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "ERROR"
            return False, f"{name}: {details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inferix.health",
        description="gRPC health probe: exit 0 if ADDRESS reports SERVING for SERVICE, else 1.",
    )
    parser.add_argument(
        "address", help="host:port of the gRPC server, e.g. 127.0.0.1:50051 (grpcs://host:port: over TLS)"
    )
    parser.add_argument("service", nargs="?", default="", help="full service name (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    parser.add_argument("--tls", action="store_true", default=None, help="connect over TLS (as grpcs:// does)")
    parser.add_argument(
        "--ca", type=Path, default=None, help="PEM CA that signed the server's certificate (implies --tls)"
    )
    args = parser.parse_args(argv)
    try:
        serving, status = check(args.address, args.service, args.timeout, args.tls, args.ca)
    except OSError as exc:
        parser.error(f"--ca {args.ca}: {exc.strerror or exc}")
    target = f"{args.address} {args.service}".strip()
    print(f"{target}: {status}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
