"""Finished recordings that outlive the streamer process: a manifest written next to each MP4.

The streamer keeps its sessions in memory; a restart loses them. What it wrote to the recordings
folder is the durable part, so when a session is finished the streamer writes `<id>.mp4.json` beside
`<id>.mp4`: frame count, format, the SHA-256 of the raw frames, and the MP4's size. A restarted
streamer answers for a session it no longer holds from that manifest (download, Range requests,
GetStreamInfo, a repeated FinishStream, re-sent frames skipped as duplicates).

The manifest is the commit point, written only after the MP4 is closed, renamed from `.part` and
fsynced, and itself written atomically (temporary file, fsync, rename). So:
  - `<id>.mp4.part` (a recording in progress when the streamer died) is never served;
  - an `<id>.mp4` without a manifest (a crash between the MP4's rename and the manifest's) is never
    served: nothing vouches for its frames;
  - an MP4 whose size differs from the manifest's (truncated or replaced since) is not served.
A session in progress goes on from its recording journal (`streamer.segments`), or, when no segment
of it was complete, from frame 0, re-sent by its worker; its recording then gets its manifest when it
finishes.

The streamer has no store of its own (no Redis client); the recordings folder is its persistence,
a PersistentVolume in the Helm chart (`streamer.recordings.persistence`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from inferix.api.v1 import streamer_pb2
from streamer.errors import SessionNotFound
from streamer.ingest import Admission, IngestState, valid_session_id
from streamer.packets import StreamFormat

log = logging.getLogger("inferix.streamer.finished")

MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".mp4.json"
PART_SUFFIX = ".mp4.part"  # inferix.media.Mp4Writer's partial file of `<id>.mp4`
JOURNAL_SUFFIX = ".journal.json"
SEGMENTS_SUFFIX = ".segments"


def recording_path(data_dir: Path, session_id: str) -> Path:
    return data_dir / f"{session_id}.mp4"


def manifest_path(data_dir: Path, session_id: str) -> Path:
    return data_dir / f"{session_id}{MANIFEST_SUFFIX}"


def journal_path(data_dir: Path, session_id: str) -> Path:
    """The journal of a recording in progress (`streamer.segments`)."""
    return data_dir / f"{session_id}{JOURNAL_SUFFIX}"


def segments_dir(data_dir: Path, session_id: str) -> Path:
    """The closed segments of a recording in progress (`streamer.segments`)."""
    return data_dir / f"{session_id}{SEGMENTS_SUFFIX}"


@dataclass(frozen=True)
class Manifest:
    """What a finished recording's manifest says (the JSON fields, one to one)."""

    version: int
    session_id: str
    frames: int
    width: int
    height: int
    fps: float
    frames_sha256: str
    mp4_bytes: int


@dataclass(frozen=True)
class FinishedRecording:
    """A session this process did not record, answered for from its manifest and MP4 on disk."""

    manifest: Manifest
    path: Path

    @property
    def session_id(self) -> str:
        return self.manifest.session_id

    @property
    def format(self) -> StreamFormat:
        return StreamFormat(self.manifest.width, self.manifest.height, self.manifest.fps)

    def admit(self, frame: streamer_pb2.VideoFrame) -> Admission:
        """A frame pushed for the finished session: a re-sent one is a duplicate, a new one `SessionFinished`."""
        ingest = IngestState(self.session_id, self.format, next_index=self.manifest.frames, finished=True)
        return ingest.check(frame)


def fsync_path(path: Path) -> None:
    """fsync a file, or a folder (which makes a rename in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(data_dir: Path, manifest: Manifest) -> None:
    """Make the finished recording durable: fsync the MP4, then write its manifest atomically.

    Blocking (fsync): call it off the event loop. The fsyncs matter for a node that loses power with
    the recordings on a volume; a killed process alone would not lose the page cache.
    """
    fsync_path(recording_path(data_dir, manifest.session_id))
    write_json_atomically(manifest_path(data_dir, manifest.session_id), asdict(manifest))


def write_json_atomically(target: Path, fields: dict[str, object]) -> None:
    """Replace `target` with `fields` as JSON, atomically and durably: a temporary file, fsynced, renamed
    over it, then the folder fsynced (the rename itself). Blocking."""
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w") as out:
        json.dump(fields, out)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(target)
    fsync_path(target.parent)


def _parse(session_id: str, text: str) -> Manifest:
    fields = json.loads(text)
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    manifest = Manifest(**fields)
    if manifest.version != MANIFEST_VERSION:
        raise ValueError(f"version {manifest.version}, this streamer reads {MANIFEST_VERSION}")
    if manifest.session_id != session_id:
        raise ValueError(f"it names session {manifest.session_id!r}")
    return manifest


def load_finished(data_dir: Path, session_id: str) -> FinishedRecording:
    """The finished recording of `session_id` from disk; `SessionNotFound` saying why when there is none
    that can be trusted (small reads only: callable on the event loop)."""
    if not valid_session_id(session_id):
        raise SessionNotFound(f"no session {session_id[:64]!r}: not a session id")
    mp4 = recording_path(data_dir, session_id)
    try:
        text = manifest_path(data_dir, session_id).read_text()
    except FileNotFoundError:
        if (
            (data_dir / f"{session_id}{PART_SUFFIX}").exists()
            or mp4.exists()
            or segments_dir(data_dir, session_id).exists()
        ):
            raise SessionNotFound(
                f"no session {session_id!r}: its recording was not finished (the streamer stopped while "
                "writing it, before a segment was complete); the incomplete file is not served"
            ) from None
        raise SessionNotFound(f"no session {session_id!r}: no frame was pushed for it") from None
    try:
        manifest = _parse(session_id, text)
    except (ValueError, TypeError) as exc:
        log.warning("session %s: the manifest of its recording is unreadable (%s); not served", session_id, exc)
        raise SessionNotFound(f"no session {session_id!r}: the manifest of its recording is unreadable") from None
    try:
        size = mp4.stat().st_size
    except FileNotFoundError:
        raise SessionNotFound(f"no session {session_id!r}: its recording was deleted") from None
    if size != manifest.mp4_bytes:
        log.warning(
            "session %s: %s has %d bytes, its manifest says %d; not served", session_id, mp4, size, manifest.mp4_bytes
        )
        raise SessionNotFound(f"no session {session_id!r}: its recording on disk is not the one that was finished")
    return FinishedRecording(manifest, mp4)
