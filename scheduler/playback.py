"""Where a session can be watched: the playback URLs the scheduler returns with it, and its announcement.

- `mp4`: always (the streamer records every session). With the viewer page configured, on the
  streamer's HTTP(S) server: `<viewer page url>/recordings/<id>.mp4#token=...` (the viewer token,
  sent as a Bearer token: HTTPS whenever the page is, no gRPC port to expose); else
  `grpc://<streamer>/recordings/<id>.mp4` (GetRecording on the streamer's gRPC port).
- `webrtc_page`: whenever the streamer's viewer page is configured (`--viewer-page-url` and a viewer
  secret). Watching costs nothing until someone opens it, so every session gets one; the URL
  carries the session's viewer token in its fragment (`#token=...`, never sent to a server).
- `rtmp`: only for sessions that ask for it (`spec.outputs.rtmp`), because the streamer pushes
  those to the RTMP server whether or not anyone plays them; `<rtmp play url>/<id>`.

Asking for an output the server does not have is INVALID_ARGUMENT (see `validation.validate_spec`).
Opening a session's playback also announces it to the streamer over the scheduler link, so the
streamer knows the outputs to run (the RTMP push), the creation time (time to first frame) and the
session's latency mode (how its live outputs are paced).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from inferix.api.v1 import common_pb2, streamer_pb2
from inferix.viewer_token import ViewerTokens

MP4, RTMP, WEBRTC = "mp4", "rtmp", "webrtc"


class Announcer(Protocol):
    def announce(self, announcement: streamer_pb2.SessionAnnouncement) -> None: ...


@dataclass(frozen=True)
class PlaybackConfig:
    """Public URLs of the outputs, as clients reach them (scheduler flags)."""

    viewer_page_url: str = ""  # the streamer's HTTP server, e.g. http://127.0.0.1:8088
    rtmp_play_url: str = ""  # the RTMP application players read, e.g. rtmp://127.0.0.1:1935/live
    tokens: ViewerTokens | None = None

    @property
    def outputs(self) -> frozenset[str]:
        """The outputs a session may ask for on this server."""
        enabled = {MP4}
        if self.viewer_page_url and self.tokens is not None:
            enabled.add(WEBRTC)
        if self.rtmp_play_url:
            enabled.add(RTMP)
        return frozenset(enabled)


def announcement(session_id: str, spec: common_pb2.SessionSpec, created_at: float) -> streamer_pb2.SessionAnnouncement:
    return streamer_pb2.SessionAnnouncement(
        session_id=session_id,
        rtmp=spec.outputs.rtmp,
        webrtc=spec.outputs.webrtc,
        created_at_unix=created_at,
        latency=spec.latency or common_pb2.LATENCY_MODE_SMOOTH,
    )


@dataclass
class Playback:
    """Builds a session's playback URLs and announces the session to the streamer."""

    config: PlaybackConfig = field(default_factory=PlaybackConfig)
    announcer: Announcer | None = None

    @property
    def outputs(self) -> frozenset[str]:
        return self.config.outputs

    def open(self, session_id: str, recordings_address: str, spec: common_pb2.SessionSpec) -> common_pb2.PlaybackUrls:
        """The URLs of a new session (validated spec); tells the streamer about it."""
        config = self.config
        urls = common_pb2.PlaybackUrls(mp4=f"grpc://{recordings_address}/recordings/{session_id}.mp4")
        if RTMP in config.outputs and spec.outputs.rtmp:
            urls.rtmp = f"{config.rtmp_play_url.rstrip('/')}/{session_id}"
        if WEBRTC in config.outputs and config.tokens is not None:
            token = config.tokens.mint(session_id)
            base = config.viewer_page_url.rstrip("/")
            urls.webrtc_page = f"{base}/watch/{session_id}#token={token}"
            urls.mp4 = f"{base}/recordings/{session_id}.mp4#token={token}"
        if self.announcer is not None:
            self.announcer.announce(announcement(session_id, spec, time.time()))
        return urls
