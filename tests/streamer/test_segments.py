"""The recording in progress (`streamer.segments`): closed segments, a journal that vouches for them,
resuming after the journal's last frame, and the joined MP4 at the end."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from inferix.frames_digest import FramesDigest
from inferix.media import Mp4Writer
from streamer.encoder import H264Encoder
from streamer.finished import journal_path, segments_dir
from streamer.packets import EncodedPacket, SegmentStart, StreamFormat
from streamer.segments import SegmentedRecorder, load_journal
from tests.streamer.media import pattern

FMT = StreamFormat(64, 48, 16.0)
SEGMENT = 8


def frame_bytes(index: int) -> bytes:
    return pattern(index, FMT.width, FMT.height).tobytes()


def digest_of(indices: range) -> FramesDigest:
    digest = FramesDigest()
    for index in indices:
        digest.update(frame_bytes(index))
    return digest


def encoded(indices: range, segment_from: int) -> list[EncodedPacket]:
    """Packets as `EncodedStream` makes them for a session whose segment started at `segment_from`:
    a forced keyframe and a `SegmentStart` every SEGMENT frames after it."""
    encoder = H264Encoder(FMT)
    packets = []
    for index in indices:
        cut = index > segment_from and (index - segment_from) % SEGMENT == 0
        for packet in encoder.encode(frame_bytes(index), index, keyframe=cut):
            mark = SegmentStart(index, digest_of(range(index)).hexdigest()) if cut else None
            packets.append(replace(packet, segment=mark))
    return packets + encoder.flush()


def decode(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 16
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]


def test_a_journal_vouches_for_every_closed_segment_and_the_joined_mp4_holds_every_frame(tmp_path: Path) -> None:
    recorder = SegmentedRecorder(tmp_path, "s1", FMT)
    packets = encoded(range(20), 0)
    for packet in packets[:17]:  # frames 0..16: segments 0-7 and 8-15 closed, 16 in progress
        recorder.write(packet)
    journal = load_journal(tmp_path, "s1")
    assert journal is not None and journal.frames == 16 and recorder.durable_frames == 16
    assert journal.frames_digest == digest_of(range(16)).hexdigest()
    assert [(s.start, s.frames) for s in journal.segments] == [(0, 8), (8, 8)]
    folder = segments_dir(tmp_path, "s1")
    assert sorted(p.name for p in folder.iterdir()) == ["0000000000.mp4", "0000000008.mp4", "0000000016.mp4.part"]
    for packet in packets[17:]:
        recorder.write(packet)
    recorder.close()
    joined = recorder.assemble()
    assert joined == tmp_path / "s1.mp4" and not (tmp_path / "s1.mp4.part").exists()

    # The same packets in one file decode to the same frames: joining re-encodes nothing.
    whole = tmp_path / "whole.mp4"
    with Mp4Writer.for_packets(whole, FMT.width, FMT.height, FMT.rate, partial=False) as writer:
        for packet in packets:
            writer.write_packet(packet.data, packet.pts, packet.dts, packet.duration, packet.keyframe)
    ours, reference = decode(joined), decode(whole)
    assert len(ours) == 20 and all(np.array_equal(a, b) for a, b in zip(ours, reference, strict=True))
    with av.open(str(joined)) as container:
        times = [p.pts * p.time_base for p in container.demux(container.streams.video[0]) if p.size]
    assert times == [Fraction(i, 16) for i in range(20)], "one frame per tick from 0, no gap at a segment"
    recorder.discard()
    assert not folder.exists() and not journal_path(tmp_path, "s1").exists()


def test_a_recording_resumes_after_its_journal_and_drops_what_the_journal_does_not_name(tmp_path: Path) -> None:
    first = SegmentedRecorder(tmp_path, "s2", FMT)
    for packet in encoded(range(19), 0):  # the process dies with frames 16..18 in an unclosed segment
        first.write(packet)
    journal = load_journal(tmp_path, "s2")
    assert journal is not None and journal.frames == 16
    (segments_dir(tmp_path, "s2") / "stray.mp4").write_bytes(b"junk")

    second = SegmentedRecorder(tmp_path, "s2", FMT, resumed=journal)
    assert sorted(p.name for p in segments_dir(tmp_path, "s2").iterdir()) == ["0000000000.mp4", "0000000008.mp4"]
    for packet in encoded(range(16, 30), 16):  # a new encoder from frame 16 (a keyframe), cut at 24
        second.write(packet)
    resumed = load_journal(tmp_path, "s2")
    assert resumed is not None and resumed.frames == 24
    assert resumed.frames_digest == digest_of(range(24)).hexdigest()
    second.close()
    second.seal(digest_of(range(30)).hexdigest())  # a drain: every frame journaled
    sealed = load_journal(tmp_path, "s2")
    assert sealed is not None and sealed.frames == 30 and sealed.frames_digest == digest_of(range(30)).hexdigest()
    joined = second.assemble()
    assert joined is not None
    frames = decode(joined)
    assert len(frames) == 30
    # lossy, but each decoded frame is its own frame (no frame twice, none shifted)
    errors = [
        np.abs(f.astype(int) - pattern(i, FMT.width, FMT.height).astype(int)).mean() for i, f in enumerate(frames)
    ]
    assert max(errors) < 6, errors


def test_a_journal_that_does_not_match_its_files_is_not_trusted(tmp_path: Path) -> None:
    recorder = SegmentedRecorder(tmp_path, "s3", FMT)
    for packet in encoded(range(17), 0):
        recorder.write(packet)
    assert load_journal(tmp_path, "s3") is not None
    segment = segments_dir(tmp_path, "s3") / "0000000008.mp4"
    segment.write_bytes(segment.read_bytes()[:-5])
    assert load_journal(tmp_path, "s3") is None
    segment.unlink()
    assert load_journal(tmp_path, "s3") is None
    path = journal_path(tmp_path, "s3")
    fields = json.loads(path.read_text())
    path.write_text(json.dumps({**fields, "frames": 17}))
    assert load_journal(tmp_path, "s3") is None
    path.write_text("{not json")
    assert load_journal(tmp_path, "s3") is None
    # a session whose journal is not trusted starts over: its old files go
    SegmentedRecorder(tmp_path, "s3", FMT)
    assert list(segments_dir(tmp_path, "s3").iterdir()) == [] and not path.exists()


def test_a_recording_without_frames_leaves_no_file(tmp_path: Path) -> None:
    recorder = SegmentedRecorder(tmp_path, "empty", FMT)
    recorder.close()
    recorder.seal(FramesDigest().hexdigest())
    assert recorder.assemble() is None
    assert list(tmp_path.iterdir()) == []
