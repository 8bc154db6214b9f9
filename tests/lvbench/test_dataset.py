"""Annotation loading, validation errors and the deterministic 80/20 split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lvbench.dataset import AnnotationError, Caption, load_annotations, parse_annotations, split_videos


def video(video_id: str = "v1", **extra: Any) -> dict[str, Any]:
    captions = [{"start": 0.0, "end": 2.5, "text": "a dancer spins"}, {"start": 2.5, "end": 5, "text": "she bows"}]
    return {"video_id": video_id, "captions": captions, **extra}


def test_loads_both_layouts_and_ignores_extra_keys(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"videos": [video(source="DanceTrack")], "version": 1}))
    (loaded,) = load_annotations(path)
    assert loaded.video_id == "v1" and loaded.duration == 5.0 and loaded.split is None
    assert loaded.captions == (Caption(0.0, 2.5, "a dancer spins"), Caption(2.5, 5.0, "she bows"))
    path.write_text(json.dumps([video()]))
    assert load_annotations(path)[0] == loaded


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda v: v.update(video_id="a b"), r"videos\[0\]\.video_id: must be 1-128 characters"),
        (lambda v: v.update(captions=[]), r"videos\[0\]\.captions: must be a non-empty list"),
        (lambda v: v["captions"][1].update(start=2.0), r"captions\[1\]\.start: 2\.0 is before the previous"),
        (lambda v: v["captions"][0].update(end=0.0), r"captions\[0\]\.end: must be greater than start"),
        (lambda v: v["captions"][0].update(start=-1), r"captions\[0\]\.start: must be >= 0"),
        (lambda v: v["captions"][0].update(start="0"), r"captions\[0\]\.start: must be a finite number"),
        (lambda v: v["captions"][0].pop("text"), r"captions\[0\]: missing 'text'"),
        (lambda v: v["captions"][0].update(text="  "), r"captions\[0\]\.text: must be a non-empty string"),
        (lambda v: v["captions"][0].update(text="x" * 3000), r"3000 bytes; the scheduler accepts at most 2048"),
        (lambda v: v.update(split="test"), r"videos\[0\]\.split: must be 'train' or 'eval'"),
    ],
)
def test_validation_names_the_field(mutate: Any, message: str) -> None:
    bad = video()
    mutate(bad)
    with pytest.raises(AnnotationError, match=message):
        parse_annotations({"videos": [bad]}, "ann.json")


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="no such file"):
        load_annotations(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(AnnotationError, match="not valid JSON"):
        load_annotations(tmp_path / "bad.json")
    with pytest.raises(AnnotationError, match="at least one video"):
        parse_annotations({"videos": []})
    with pytest.raises(AnnotationError, match=r"videos\[1\]\.video_id: 'v1' is also videos\[0\]"):
        parse_annotations([video("v1"), video("v1")])
    with pytest.raises(AnnotationError, match="set on 1 of 2 videos; set it on all or none"):
        parse_annotations([video("a", split="eval"), video("b")])


def test_split_is_80_20_deterministic_and_order_independent() -> None:
    videos = parse_annotations([video(f"video_{i:03d}") for i in range(50)])
    split = split_videos(videos)
    assert len(split["eval"]) == 10 and len(split["train"]) == 40
    assert not {v.video_id for v in split["eval"]} & {v.video_id for v in split["train"]}
    again = split_videos(list(reversed(videos)))
    assert {v.video_id for v in again["eval"]} == {v.video_id for v in split["eval"]}
    assert len(split_videos(videos[:2])["eval"]) == 1  # at least one eval video


def test_split_fields_in_the_file_win() -> None:
    videos = parse_annotations([video("a", split="eval"), video("b", split="train"), video("c", split="train")])
    split = split_videos(videos)
    assert [v.video_id for v in split["eval"]] == ["a"] and [v.video_id for v in split["train"]] == ["b", "c"]
