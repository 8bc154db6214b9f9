"""The JSON report: schema round-trip, refusing what it cannot read, and merging ranks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from inferix.errors import UserError
from inferix.profiling import SCHEMA_VERSION, Profiler, ProfileReport, merge_reports, profile
from tests.profiling.helpers import rank_report


def test_report_round_trips_through_json(make_profiler: Callable[..., Profiler], tmp_path: Path) -> None:
    profiler = make_profiler(sample_interval_s=0.01, fps=24.0, label="round trip")
    profiler.add_gauge("kv_pool", lambda: {"used_pages": 3})
    with profiler.session():
        with profiler.block(0, prompt="a cat") as block:
            with profile("denoise_step", step=0, warm=True, scale=0.5, shape=(1, 16)):  # a tuple is stored as str
                pass
            with pytest.raises(ValueError), profile("context_pass"):
                raise ValueError("bad page")
            block.pixel_frames = 9
        profiler.record("kv_pages", 3, block=0)
    report = profiler.report()

    document = json.loads(report.to_json())
    assert (document["schema"], document["version"]) == ("inferix.profile", SCHEMA_VERSION)
    assert ProfileReport.from_json(report.to_json()) == report
    assert ProfileReport.load(report.write_json(tmp_path / "sub" / "r.json")) == report
    step = next(r for r in report.regions if r.name == "denoise_step")
    assert step.attrs == {"step": 0, "warm": True, "scale": 0.5, "shape": "(1, 16)"}
    assert report.timelines[0].series["kv_pool.used_pages"][0] == 3.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "is not JSON"),
        ('{"schema": "something.else", "version": 1}', "is not an Inferix profile report"),
        ('{"schema": "inferix.profile", "version": 99}', "upgrade inferix"),
        ('{"schema": "inferix.profile", "version": 1, "label": ""}', "damaged"),
    ],
)
def test_unreadable_reports_are_user_errors_that_say_why(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        ProfileReport.from_json(text, source="r.json")


def test_missing_report_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such profile report"):
        ProfileReport.load(tmp_path / "absent.json")


def test_merge_combines_the_ranks_of_one_worker() -> None:
    # Rank 0 decodes the frames; rank 1 is slower on block 1 and decodes nothing.
    rank0 = rank_report(0, 2, [0.4, 0.2, 0.2], pixel_frames=9)
    rank1 = rank_report(1, 2, [0.3, 0.5, 0.2], pixel_frames=0)
    merged = merge_reports([rank1, rank0])

    assert merged.merged and [info.rank for info in merged.ranks] == [0, 1] and merged.world_size == 2
    assert merged.ranks[1].summary == rank1.summary
    summary = merged.summary
    assert (summary.blocks, summary.pixel_frames) == (3, 27)
    assert summary.time_to_first_block_s == pytest.approx(0.4)  # slowest rank
    assert summary.end_to_end_s == pytest.approx(1.0)
    assert summary.pixel_fps == pytest.approx(27.0)
    assert summary.real_time_factor == pytest.approx(27 / 16)
    latency = summary.block_latency
    assert latency is not None and latency.count == 3  # one per block index: the slowest rank's
    assert (latency.min_s, latency.p50_s, latency.max_s) == pytest.approx((0.2, 0.4, 0.5))
    stats = {s.name: s for s in merged.region_stats}
    assert stats["denoise_step"].duration.count == 6 and stats["block"].duration.count == 6
    assert {b.rank for b in merged.blocks} == {0, 1} and len(merged.timelines) == 2
    assert ProfileReport.from_json(merged.to_json()) == merged


def test_merge_refuses_reports_that_do_not_make_one_world() -> None:
    rank0 = rank_report(0, 2, [0.1], 9)
    rank1 = rank_report(1, 2, [0.1], 9)
    with pytest.raises(UserError, match=r"one report per rank 0\.\.1, got ranks \[0\]"):
        merge_reports([rank0])
    with pytest.raises(UserError, match=r"got ranks \[0, 0\]"):
        merge_reports([rank0, rank0])
    with pytest.raises(UserError, match="different worlds"):
        merge_reports([rank0, rank_report(1, 3, [0.1], 9)])
    with pytest.raises(UserError, match="disagree on fps"):
        merge_reports([rank0, rank_report(1, 2, [0.1], 9, fps=24.0)])
    with pytest.raises(UserError, match="already merged"):
        merge_reports([merge_reports([rank0, rank1])])
    with pytest.raises(UserError, match="at least one"):
        merge_reports([])


def test_profiler_writes_its_rank_json_and_html(make_profiler: Callable[..., Profiler], tmp_path: Path) -> None:
    profiler = make_profiler(rank=1, world_size=2)
    with profiler.session(), profiler.block(0) as block:
        block.pixel_frames = 9
    report = profiler.write(tmp_path / "profile")
    assert ProfileReport.load(tmp_path / "profile" / "profile-rank1.json") == report
    assert (tmp_path / "profile" / "profile-rank1.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
