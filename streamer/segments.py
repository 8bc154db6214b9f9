"""A session's recording while it is made: closed MP4 segments and a journal that outlive the process.

An MP4 is only readable once it is finalized, so a streamer that died mid-session used to lose the
whole recording, and the session's worker had to send its video again from frame 0 (decoded again
from every committed block: a time that grows with the session). Instead the recorder cuts the
recording into segments of a few seconds (`StreamerConfig.segment_seconds`). Each segment starts
on a keyframe the session forces there and is closed, renamed from `.part` and fsynced when the
next one starts; then `<id>.journal.json` is rewritten atomically: the segments, the frame count
they hold and the frames digest after the last of them (`inferix.frames_digest`, a chain whose
state is 32 bytes). That journal is the commit point of everything before it.

A restarted streamer that gets a frame (or a FinishStream) for a session it does not hold reads the
journal and resumes there: the frames after the last durable segment are all it needs, and a worker
keeps those in memory (`PushFramesResponse.durable_frames` tells it which). A journal that does not
match the files (a segment missing or of another size) is not trusted: the session starts over
from frame 0, as before. A draining streamer (SIGTERM) closes the segment in progress and journals
it, so nothing is re-sent at all.

When the session finishes, the segments are joined into `<id>.mp4` without re-encoding (timestamps
made contiguous), then `streamer.finished` writes its manifest and the segments and journal go.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import av

from inferix.media import Mp4Writer
from streamer.finished import (
    PART_SUFFIX,
    fsync_path,
    journal_path,
    recording_path,
    segments_dir,
    write_json_atomically,
)
from streamer.packets import EncodedPacket, StreamFormat

log = logging.getLogger("inferix.streamer.segments")

JOURNAL_VERSION = 1


@dataclass(frozen=True)
class Segment:
    """One closed segment: frames `start` .. `start + frames - 1` in `<start>.mp4`."""

    start: int
    frames: int
    bytes: int

    @property
    def file_name(self) -> str:
        return f"{self.start:010d}.mp4"


@dataclass(frozen=True)
class Journal:
    """What a recording in progress has made durable (the JSON fields, one to one)."""

    version: int
    session_id: str
    width: int
    height: int
    fps: float
    frames: int  # frames 0 .. frames-1 are in `segments`
    frames_digest: str  # `FramesDigest` state after them, hex
    segments: tuple[Segment, ...]

    @property
    def format(self) -> StreamFormat:
        return StreamFormat(self.width, self.height, self.fps)


def write_journal(data_dir: Path, journal: Journal) -> None:
    """Replace the session's journal atomically and durably (blocking: fsync)."""
    write_json_atomically(journal_path(data_dir, journal.session_id), asdict(journal))


def _parse(session_id: str, text: str) -> Journal:
    fields = json.loads(text)
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    segments = tuple(Segment(**segment) for segment in fields.pop("segments"))
    journal = Journal(**fields, segments=segments)
    if journal.version != JOURNAL_VERSION:
        raise ValueError(f"version {journal.version}, this streamer reads {JOURNAL_VERSION}")
    if journal.session_id != session_id:
        raise ValueError(f"it names session {journal.session_id!r}")
    expected = 0
    for segment in segments:
        if segment.start != expected or segment.frames <= 0:
            raise ValueError(f"segment {segment.file_name} does not follow frame {expected - 1}")
        expected += segment.frames
    if expected != journal.frames:
        raise ValueError(f"its segments hold {expected} frames, it says {journal.frames}")
    return journal


def load_journal(data_dir: Path, session_id: str) -> Journal | None:
    """The journal of a recording in progress that a previous process left, if its segments are all
    there as it says (small reads and stats only); None when there is none or it cannot be trusted."""
    try:
        text = journal_path(data_dir, session_id).read_text()
    except FileNotFoundError:
        return None
    try:
        journal = _parse(session_id, text)
    except (ValueError, TypeError, KeyError) as exc:
        log.warning("session %s: its recording journal is unreadable (%s); its video starts over", session_id, exc)
        return None
    folder = segments_dir(data_dir, session_id)
    for segment in journal.segments:
        path = folder / segment.file_name
        size = path.stat().st_size if path.exists() else None
        if size != segment.bytes:
            log.warning("session %s: %s has %s bytes, its journal says %d; its video starts over",
                        session_id, path, size, segment.bytes)  # fmt: skip
            return None
    return journal


class SegmentedRecorder:
    """The MP4 output of a session (a `PacketSink`): packets muxed, unchanged, into segments that
    start where a packet carries `segment` (the session decides where; see `StreamSession.push`).

    Runs on the session's encoder thread; `durable_frames` is read from the event loop (an int).
    """

    name = "mp4"

    def __init__(self, data_dir: Path, session_id: str, fmt: StreamFormat, resumed: Journal | None = None) -> None:
        self.data_dir = data_dir
        self.session_id = session_id
        self.format = fmt
        self.folder = segments_dir(data_dir, session_id)
        self.segments: list[Segment] = list(resumed.segments) if resumed is not None else []
        self.durable_frames = resumed.frames if resumed is not None else 0
        self._writer: Mp4Writer | None = None
        self._start = 0
        self._frames = 0
        self._clear_leftovers()

    @property
    def path(self) -> Path:
        """Where the joined recording goes when the session finishes."""
        return recording_path(self.data_dir, self.session_id)

    def _clear_leftovers(self) -> None:
        """Drop what no journal vouches for: a segment being written when a process died, or a
        session's earlier segments when its video starts over."""
        keep = {segment.file_name for segment in self.segments}
        try:
            if self.folder.exists():
                for path in self.folder.iterdir():
                    if path.name not in keep:
                        path.unlink()
            if not keep:
                journal_path(self.data_dir, self.session_id).unlink(missing_ok=True)
        except OSError as exc:  # only costs disk space: a new segment replaces a file of its name
            log.warning("session %s: cannot remove the leftovers of an earlier recording (%s)", self.session_id, exc)

    def write(self, packet: EncodedPacket) -> None:
        if packet.segment is not None and self._writer is not None:
            self._close_segment()
            if packet.segment.frame_index != self.frames:
                raise RuntimeError(
                    f"segment boundary at frame {packet.segment.frame_index} but the segments end at frame "
                    f"{self.frames}"
                )
            self._journal(packet.segment.frame_index, packet.segment.digest)
        if self._writer is None:
            if not packet.keyframe:
                raise RuntimeError(f"a recording segment must start on a keyframe, frame {packet.pts} is not one")
            self.folder.mkdir(parents=True, exist_ok=True)
            self._start, self._frames = packet.pts, 0
            self._writer = Mp4Writer.for_packets(
                self.folder / f"{packet.pts:010d}.mp4", self.format.width, self.format.height, self.format.rate,
                partial=True, faststart=False,
            )  # fmt: skip
        self._writer.write_packet(
            packet.data, packet.pts - self._start, packet.dts - self._start, packet.duration, packet.keyframe
        )
        self._frames += 1

    def close(self) -> None:
        """The stream ended: close the segment in progress (the session then seals or assembles)."""
        self._close_segment()

    def _close_segment(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        writer.close()
        fsync_path(writer.path)
        fsync_path(self.folder)  # its rename from .part
        self.segments.append(Segment(self._start, self._frames, writer.path.stat().st_size))

    def _journal(self, frames: int, digest: str) -> None:
        fmt = self.format
        journal = Journal(
            JOURNAL_VERSION, self.session_id, fmt.width, fmt.height, fmt.fps, frames, digest, tuple(self.segments)
        )
        write_journal(self.data_dir, journal)
        self.durable_frames = frames

    @property
    def frames(self) -> int:
        """Frames in closed segments."""
        return sum(segment.frames for segment in self.segments)

    def seal(self, digest: str) -> None:
        """Journal every closed segment (after `close`): a draining streamer's successor resumes after
        the last frame. Blocking."""
        if self.segments:
            self._journal(self.frames, digest)

    def assemble(self) -> Path | None:
        """Join the closed segments into the session's MP4 (after `close`; no re-encode, one frame per
        tick from 0, index at the front for progressive download). Blocking. None: no frame was recorded."""
        if not self.segments:
            return None
        target = self.path
        part = target.with_name(f"{self.session_id}{PART_SUFFIX}")
        tick = 0
        with (
            av.open(str(self.folder / self.segments[0].file_name)) as first,
            av.open(str(part), "w", format="mp4", options={"movflags": "+faststart"}) as out,
        ):
            stream = out.add_stream_from_template(first.streams.video[0])
            stream.time_base = self.format.time_base
            for segment in self.segments:
                with av.open(str(self.folder / segment.file_name)) as source:
                    for packet in source.demux(source.streams.video[0]):
                        if packet.size == 0:  # the demuxer's end-of-stream marker
                            continue
                        packet.stream = stream
                        packet.time_base = self.format.time_base  # the muxer rescales to its own
                        packet.pts = packet.dts = tick
                        packet.duration = 1
                        out.mux(packet)
                        tick += 1
        if tick != self.frames:
            raise RuntimeError(f"joined {tick} frames from segments that hold {self.frames}")
        part.replace(target)
        return target

    def discard(self) -> None:
        """Remove the segments and the journal (once the manifest vouches for the joined MP4)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        journal_path(self.data_dir, self.session_id).unlink(missing_ok=True)
