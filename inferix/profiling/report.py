"""The profile report: what one rank recorded (or several ranks, merged), as a versioned JSON file.

Schema "inferix.profile", version 1: a JSON object with "schema", "version", "created_by" and
the fields of `ProfileReport` (nested records as in `inferix.profiling.records`). Readers refuse
a newer version instead of misreading it; a new field that old readers may ignore keeps the
version, a changed meaning bumps it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inferix import __version__
from inferix.errors import UserError
from inferix.profiling.metrics import combine_ranks, region_stats
from inferix.profiling.records import (
    BlockRecord,
    MetricSample,
    RankInfo,
    RegionRecord,
    RegionStats,
    Summary,
    Timeline,
)

SCHEMA = "inferix.profile"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ProfileReport:
    """One profiling session of one rank, or the merge of every rank of one worker.

    `summary` holds the standard metrics (for a merged report, combined across ranks as defined
    in `inferix.profiling.metrics`); `ranks[i].summary` holds each rank's own. Records carry the
    rank that wrote them.
    """

    label: str
    fps: float | None
    world_size: int
    ranks: list[RankInfo]
    summary: Summary
    region_stats: list[RegionStats]
    blocks: list[BlockRecord]
    regions: list[RegionRecord]
    metrics: list[MetricSample]
    timelines: list[Timeline]

    @property
    def merged(self) -> bool:
        """Whether this report combines several ranks' reports."""
        return len(self.ranks) > 1

    def to_json(self) -> str:
        """The report as versioned JSON text."""
        document = {"schema": SCHEMA, "version": SCHEMA_VERSION, "created_by": f"inferix {__version__}"}
        document.update(asdict(self))
        return json.dumps(document, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str, source: str = "report") -> ProfileReport:
        """Read a report written by `to_json`; `source` names it in error messages."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{source} is not JSON ({exc}); pass a report written by the Inferix profiler") from exc
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise UserError(f'{source} is not an Inferix profile report (no "schema": "{SCHEMA}")')
        version = document.get("version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise UserError(
                f"{source} has profile schema version {version!r}, this Inferix reads up to {SCHEMA_VERSION}: "
                "upgrade inferix to read it"
            )
        try:
            return cls._from_document(document)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{source} is a damaged Inferix profile report ({type(exc).__name__}: {exc})") from exc

    @classmethod
    def _from_document(cls, document: dict[str, Any]) -> ProfileReport:
        return cls(
            label=str(document["label"]),
            fps=None if document["fps"] is None else float(document["fps"]),
            world_size=int(document["world_size"]),
            ranks=[RankInfo.from_dict(r) for r in document["ranks"]],
            summary=Summary.from_dict(document["summary"]),
            region_stats=[RegionStats.from_dict(s) for s in document["region_stats"]],
            blocks=[BlockRecord.from_dict(b) for b in document["blocks"]],
            regions=[RegionRecord.from_dict(r) for r in document["regions"]],
            metrics=[MetricSample.from_dict(m) for m in document["metrics"]],
            timelines=[Timeline.from_dict(t) for t in document["timelines"]],
        )

    @classmethod
    def load(cls, path: str | Path) -> ProfileReport:
        """Read a report file; a missing or unreadable file is a `UserError` that names it."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise UserError(f"no such profile report: {path}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read profile report {path}: {exc}") from exc
        return cls.from_json(text, source=str(path))

    def write_json(self, path: str | Path) -> Path:
        """Write the JSON report (creating its folder); returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_json() + "\n", encoding="utf-8")
        return target


def merge_reports(reports: Sequence[ProfileReport]) -> ProfileReport:
    """Combine the reports of every rank of one worker (one per rank, same world size and fps)."""
    if not reports:
        raise UserError("merge needs at least one rank report")
    if any(r.merged for r in reports):
        raise UserError("merge takes the reports each rank wrote, not an already merged report")
    world_sizes = {r.world_size for r in reports}
    if len(world_sizes) != 1:
        raise UserError(f"the reports come from different worlds (world sizes {sorted(world_sizes)}); merge one run")
    world_size = world_sizes.pop()
    ranks = sorted((r.ranks[0] for r in reports), key=lambda info: info.rank)
    rank_ids = [info.rank for info in ranks]
    if rank_ids != list(range(world_size)):
        raise UserError(
            f"merge needs exactly one report per rank 0..{world_size - 1}, got ranks {rank_ids}; "
            "pass every rank's report once"
        )
    fps_values = {r.fps for r in reports}
    if len(fps_values) != 1:
        raise UserError(f"the rank reports disagree on fps ({sorted(map(str, fps_values))}); merge one run")
    fps = fps_values.pop()
    by_rank = sorted(reports, key=lambda r: r.ranks[0].rank)
    blocks = [b for r in by_rank for b in r.blocks]
    regions = [g for r in by_rank for g in r.regions]
    return ProfileReport(
        label=" | ".join(dict.fromkeys(r.label for r in by_rank if r.label)),
        fps=fps,
        world_size=world_size,
        ranks=ranks,
        summary=combine_ranks([info.summary for info in ranks], blocks, fps),
        region_stats=region_stats(regions),
        blocks=blocks,
        regions=regions,
        metrics=[m for r in by_rank for m in r.metrics],
        timelines=[t for r in by_rank for t in r.timelines],
    )
