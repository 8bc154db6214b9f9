"""The offload policy: paused sessions first, then least recently used above the high watermark."""

from __future__ import annotations

import pytest

from kvcache_svc.offload import SessionReport, Watermarks, plan_offload

MARKS = Watermarks(high=0.8, low=0.5)


def report(session_id: str, pages: int, last: float) -> SessionReport:
    return SessionReport(session_id, pages, last)


def test_paused_sessions_are_always_offloaded() -> None:
    sessions = [report("a", 10, 1.0), report("b", 10, 2.0), report("c", 0, 3.0)]
    assert plan_offload(100, 20, sessions, {"b", "c"}, MARKS) == ["b"]  # c has nothing on the device


def test_above_high_watermark_least_recently_used_go_until_low() -> None:
    sessions = [report("new", 30, 30.0), report("old", 30, 10.0), report("mid", 30, 20.0)]
    assert plan_offload(100, 90, sessions, set(), MARKS) == ["old", "mid"]  # 90 -> 60 -> 30 <= 50
    assert plan_offload(100, 80, sessions, set(), MARKS) == []  # at the watermark: nothing


def test_paused_pages_count_before_choosing_idle_ones() -> None:
    sessions = [report("p", 40, 50.0), report("old", 20, 1.0), report("new", 30, 40.0)]
    assert plan_offload(100, 90, sessions, {"p"}, MARKS) == ["p"]  # 90 - 40 = 50: below high already


def test_bad_watermarks_are_rejected() -> None:
    with pytest.raises(ValueError, match="0 < low <= high <= 1"):
        Watermarks(high=0.5, low=0.6)
