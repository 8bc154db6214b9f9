"""What every part of the scheduler is configured with: its settings (`SchedulerConfig`) and the
presets of the models its sessions use (`Presets`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferix.api.v1 import common_pb2
from inferix.spec.served import ServedPreset, load_any_preset
from scheduler.playback import Playback
from scheduler.validation import ALL_OUTPUTS, ValidSpec, validate_spec


@dataclass(frozen=True)
class SchedulerConfig:
    kvcache_address: str
    streamer_address: str
    # Address clients use to download recordings (may differ from the internal one).
    streamer_public_address: str = ""
    default_lookahead: int = 2
    block_deadline_s: float = 600.0
    internal_deadline_s: float = 30.0
    # Failures of a session's worker in a row (no block made between them) that are recovered; one more fails it.
    max_recoveries: int = 3
    admission_retry_s: float = 1.0
    # A worker busy with a call is probed (gRPC health) this often; this many missed probes in a row
    # (each with the timeout) mean it hangs, and its session moves.
    probe_interval_s: float = 2.0
    probe_timeout_s: float = 3.0
    probe_misses: int = 3
    # Playback URLs (WebRTC page, RTMP) and the session announcement to the streamer.
    playback: Playback = field(default_factory=Playback)


class Presets:
    """Model presets by name, each loaded once (every session of a model shares it)."""

    def __init__(self, default_lookahead: int) -> None:
        self.default_lookahead = default_lookahead
        self._presets: dict[str, ServedPreset] = {}

    def get(self, model: str) -> ServedPreset:
        if model not in self._presets:
            self._presets[model] = load_any_preset(model)
        return self._presets[model]

    def revalidate(self, spec: common_pb2.SessionSpec) -> ValidSpec:
        """A stored spec back to a `ValidSpec` (it passed validation when the session was created)."""
        return validate_spec(spec, {spec.model: self.get(spec.model)}, self.default_lookahead, ALL_OUTPUTS)
