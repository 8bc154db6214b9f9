"""What every part of the scheduler is configured with: its settings (`SchedulerConfig`) and the
presets of the models its sessions use (`Presets`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferix.api.v1 import common_pb2
from inferix.spec.served import ServedPreset, load_served_preset
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
    """Model presets by name, as the workers serving each model run it (a model folder's model.yaml
    may change its shipped preset, e.g. its video size); each loaded once and shared by its sessions."""

    def __init__(self, default_lookahead: int) -> None:
        self.default_lookahead = default_lookahead
        self._settings: dict[str, str] = {}  # model -> the settings its workers registered
        self._presets: dict[tuple[str, str], ServedPreset] = {}

    def learn(self, served: Mapping[str, str]) -> None:
        """The model settings the workers up now serve each model with (`Placement.served_models`)."""
        self._settings.update(served)

    def get(self, model: str) -> ServedPreset:
        key = (model, self._settings.get(model, ""))
        if key not in self._presets:
            self._presets[key] = load_served_preset(*key)
        return self._presets[key]

    def revalidate(self, spec: common_pb2.SessionSpec) -> ValidSpec:
        """A stored spec back to a `ValidSpec` (it passed validation when the session was created)."""
        return validate_spec(spec, {spec.model: self.get(spec.model)}, self.default_lookahead, ALL_OUTPUTS)
