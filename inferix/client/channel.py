"""Channels of the sync and async clients: retries on UNAVAILABLE, large messages, TLS when asked."""

from __future__ import annotations

import json

import grpc

from inferix.client.tls import Target

RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "inferix.v1.SchedulerService"}, {"service": "inferix.v1.StreamerService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            },
            # gRPC retries an UNAVAILABLE call whose server died before answering, i.e. maybe after it
            # created the session: CreateSession gets no such retry (the more specific name wins). The
            # SDK retries it only when no connection was made (`inferix.client.retry`).
            {"name": [{"service": "inferix.v1.SchedulerService", "method": "CreateSession"}]},
        ]
    }
)

CHANNEL_OPTIONS = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", RETRY_SERVICE_CONFIG),
    ("grpc.max_receive_message_length", 64 * 2**20),
    # A server that restarts is reached again within ~2 s of listening (gRPC's default backoff grows to
    # 120 s, and calls fail at once while it waits).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def sync_channel(target: Target) -> grpc.Channel:
    if target.tls:
        return grpc.secure_channel(target.address, target.credentials(), options=CHANNEL_OPTIONS)
    return grpc.insecure_channel(target.address, options=CHANNEL_OPTIONS)


def aio_channel(target: Target, interceptors: list[grpc.aio.ClientInterceptor]) -> grpc.aio.Channel:
    if target.tls:
        return grpc.aio.secure_channel(
            target.address, target.credentials(), options=CHANNEL_OPTIONS, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(target.address, options=CHANNEL_OPTIONS, interceptors=interceptors)


def metadata(api_key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


def recording_address(mp4_url: str) -> tuple[str, str]:
    """`grpc://host:port/recordings/<id>.mp4` -> (host:port, id)."""
    if not mp4_url.startswith("grpc://") or "/recordings/" not in mp4_url:
        raise ValueError(f"not a recording URL: {mp4_url!r}")
    address, _, path = mp4_url.removeprefix("grpc://").partition("/recordings/")
    return address, path.removesuffix(".mp4")
