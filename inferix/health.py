"""`python -m inferix.health ADDRESS [SERVICE]`: a gRPC health probe (grpc.health.v1) for containers.

Docker's HEALTHCHECK and Kubernetes exec probes run it inside the container::

    python -m inferix.health 127.0.0.1:50051                              # the server as a whole
    python -m inferix.health 127.0.0.1:50051 inferix.v1.SchedulerService  # one service

Exit code 0 when the answer is SERVING, 1 otherwise (NOT_SERVING, unknown service, no answer within
`--timeout`), so a draining server (SIGTERM) reads as unhealthy at once. Kubernetes can also probe
gRPC natively (`grpc:` probes), which the Helm chart uses; this module is for everything else.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0) -> tuple[bool, str]:
    """Ask `address` for the health of `service` ("" = the whole server): (serving?, what was seen)."""
    with grpc.insecure_channel(address) as channel:
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
    parser.add_argument("address", help="host:port of the gRPC server, e.g. 127.0.0.1:50051")
    parser.add_argument("service", nargs="?", default="", help="full service name (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    serving, status = check(args.address, args.service, args.timeout)
    target = f"{args.address} {args.service}".strip()
    print(f"{target}: {status}", file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
