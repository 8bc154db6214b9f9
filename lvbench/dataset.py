"""LV-Bench-style annotations: one entry per video, a caption for every 2-3 s of it.

Accepted JSON (a top-level object with "videos", or the list alone):

    {
      "videos": [
        {
          "video_id": "dancetrack_0001",            # [A-Za-z0-9._-]{1,128}, unique; names the MP4
          "captions": [                              # at least one, in time order, not overlapping
            {"start": 0.0, "end": 2.5, "text": "A dancer in a red dress spins on a stage."},
            {"start": 2.5, "end": 5.0, "text": "She stops and bows to the audience."}
          ],
          "split": "eval"                            # optional: "train" or "eval", on all entries or none
        }
      ]
    }

Times are seconds from the start of the video (start >= 0, end > start); gaps between captions
are allowed (a caption lasts until the next one starts) and the video lasts until the last
caption ends. Caption text is limited to what the scheduler accepts (2048 UTF-8 bytes). Extra
keys are ignored, so richer LV-Bench exports load as they are.

The split: LV-Bench uses 80% of its videos for training and 20% for evaluation. When the file
does not say, `split_videos` assigns it deterministically from the ids alone (the order of the
file does not matter): videos are ranked by sha256("lvbench-split:" + video_id) and the first
round(20% x count) — at least one when there are any — are eval.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from inferix.errors import UserError

Split = Literal["train", "eval"]
EVAL_FRACTION = 0.2
MAX_CAPTION_BYTES = 2048
_VIDEO_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class AnnotationError(UserError):
    """The annotation file does not follow the schema; the message names the file and the field."""


@dataclass(frozen=True)
class Caption:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class VideoAnnotation:
    video_id: str
    captions: tuple[Caption, ...]
    split: Split | None = None

    @property
    def duration(self) -> float:
        return self.captions[-1].end


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        raise AnnotationError(f"{where}: must be a finite number of seconds, got {value!r}")
    return float(value)


def _caption(raw: Any, where: str, previous_end: float) -> Caption:
    if not isinstance(raw, dict):
        raise AnnotationError(f"{where}: must be an object with start, end and text, got {type(raw).__name__}")
    for key in ("start", "end", "text"):
        if key not in raw:
            raise AnnotationError(f"{where}: missing {key!r}")
    start, end = _number(raw["start"], f"{where}.start"), _number(raw["end"], f"{where}.end")
    text = raw["text"]
    if start < 0:
        raise AnnotationError(f"{where}.start: must be >= 0, got {start}")
    if end <= start:
        raise AnnotationError(f"{where}.end: must be greater than start ({end} <= {start})")
    if start < previous_end - 1e-6:
        raise AnnotationError(
            f"{where}.start: {start} is before the previous caption's end ({previous_end}); "
            "captions must be in time order and must not overlap"
        )
    if not isinstance(text, str) or not text.strip():
        raise AnnotationError(f"{where}.text: must be a non-empty string")
    size = len(text.encode("utf-8"))
    if size > MAX_CAPTION_BYTES:
        raise AnnotationError(f"{where}.text: {size} bytes; the scheduler accepts at most {MAX_CAPTION_BYTES}")
    return Caption(start, end, text.strip())


def _video(raw: Any, where: str) -> VideoAnnotation:
    if not isinstance(raw, dict):
        raise AnnotationError(f"{where}: must be an object with video_id and captions, got {type(raw).__name__}")
    video_id = raw.get("video_id")
    if not isinstance(video_id, str) or not _VIDEO_ID.match(video_id):
        raise AnnotationError(
            f"{where}.video_id: must be 1-128 characters of letters, digits, '.', '_' or '-' "
            f"(it names the MP4), got {video_id!r}"
        )
    captions_raw = raw.get("captions")
    if not isinstance(captions_raw, list) or not captions_raw:
        raise AnnotationError(f"{where}.captions: must be a non-empty list of captions")
    captions: list[Caption] = []
    for i, item in enumerate(captions_raw):
        captions.append(_caption(item, f"{where}.captions[{i}]", captions[-1].end if captions else 0.0))
    split = raw.get("split")
    if split not in (None, "train", "eval"):
        raise AnnotationError(f"{where}.split: must be 'train' or 'eval', got {split!r}")
    return VideoAnnotation(video_id, tuple(captions), split)


def parse_annotations(data: Any, source: str = "annotations") -> list[VideoAnnotation]:
    """Validate parsed JSON; every error names `source` and the offending field."""
    items = data.get("videos") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise AnnotationError(f'{source}: expected {{"videos": [...]}} or a list of videos, with at least one video')
    videos = [_video(item, f"{source}: videos[{i}]") for i, item in enumerate(items)]
    seen: dict[str, int] = {}
    for i, video in enumerate(videos):
        if video.video_id in seen:
            raise AnnotationError(
                f"{source}: videos[{i}].video_id: {video.video_id!r} is also videos[{seen[video.video_id]}]"
            )
        seen[video.video_id] = i
    with_split = sum(v.split is not None for v in videos)
    if 0 < with_split < len(videos):
        raise AnnotationError(
            f"{source}: 'split' is set on {with_split} of {len(videos)} videos; set it on all or none"
        )
    return videos


def load_annotations(path: str | Path) -> list[VideoAnnotation]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnnotationError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"{path}: not valid JSON: {exc}") from None
    return parse_annotations(data, str(path))


def _rank_key(video_id: str) -> str:
    return hashlib.sha256(f"lvbench-split:{video_id}".encode()).hexdigest()


def split_videos(videos: list[VideoAnnotation]) -> dict[Split, list[VideoAnnotation]]:
    """The 80/20 split: the file's own `split` fields when present, else the deterministic hash rank."""
    if videos and videos[0].split is not None:
        return {s: [v for v in videos if v.split == s] for s in ("train", "eval")}
    count = round(EVAL_FRACTION * len(videos))
    count = max(count, 1) if videos else 0
    eval_ids = {v.video_id for v in sorted(videos, key=lambda v: _rank_key(v.video_id))[:count]}
    return {
        "train": [v for v in videos if v.video_id not in eval_ids],
        "eval": [v for v in videos if v.video_id in eval_ids],
    }
