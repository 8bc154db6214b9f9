"""`inferix.media.Mp4Writer`, the one MP4 writer: encoding RGB frames (`inferix generate`) and muxing
packets encoded elsewhere (the streamer's recording segments, `streamer.segments`)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from inferix.media import Mp4Writer
from streamer.encoder import H264Encoder
from streamer.packets import StreamFormat
from tests.streamer.media import pattern

WIDTH, HEIGHT = 64, 48


def _frames(count: int) -> np.ndarray:
    return np.stack([pattern(i, WIDTH, HEIGHT) for i in range(count)])


def _decode(path: Path) -> tuple[list[np.ndarray], Fraction | None]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)], stream.average_rate


def _top_level_boxes(path: Path) -> list[str]:
    data, boxes, offset = path.read_bytes(), [], 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        boxes.append(data[offset + 4 : offset + 8].decode("ascii"))
        offset += size if size >= 8 else len(data)
    return boxes


def test_encoding_writer_writes_every_frame_at_its_rate(tmp_path: Path) -> None:
    frames = _frames(12)
    out = tmp_path / "sub" / "video.mp4"
    with Mp4Writer(out, WIDTH, HEIGHT, 16, crf=0) as writer:
        assert out.parent.is_dir(), "the encoding writer makes its folder at once"
        writer.write(frames[:5])
        writer.write(frames[5:])
    assert writer.frames == 12
    decoded, rate = _decode(out)
    assert len(decoded) == 12 and rate == 16
    assert np.abs(decoded[3].astype(int) - frames[3].astype(int)).mean() < 3  # crf 0: close to lossless
    with pytest.raises(TypeError, match="encodes RGB frames"):
        writer.write_packet(b"", 0, 0, 1, True)


def test_encoding_writer_refuses_odd_sizes_and_bad_frames(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="even frame sizes"):
        Mp4Writer(tmp_path / "odd.mp4", 63, 48, 16)
    with Mp4Writer(tmp_path / "v.mp4", WIDTH, HEIGHT, 16) as writer, pytest.raises(ValueError, match="uint8"):
        writer.write(np.zeros((1, HEIGHT, WIDTH, 3), dtype=np.float32))


def test_packet_writer_muxes_packets_unchanged(tmp_path: Path) -> None:
    fmt = StreamFormat(WIDTH, HEIGHT, 16.0)
    encoder = H264Encoder(fmt)
    packets = [p for i in range(20) for p in encoder.encode(pattern(i, WIDTH, HEIGHT).tobytes(), i)]
    packets += encoder.flush()
    out = tmp_path / "rec" / "s1.mp4"
    writer = Mp4Writer.for_packets(out, WIDTH, HEIGHT, fmt.rate, partial=True, faststart=True)
    for packet in packets:
        writer.write_packet(packet.data, packet.pts, packet.dts, packet.duration, packet.keyframe)
    assert not out.exists() and out.with_name("s1.mp4.part").exists(), "written as .part until closed"
    writer.close()
    assert out.exists() and not out.with_name("s1.mp4.part").exists()
    boxes = _top_level_boxes(out)
    assert boxes.index("moov") < boxes.index("mdat"), f"faststart puts the index first: {boxes}"
    decoded, rate = _decode(out)
    assert len(decoded) == 20 and rate == 16

    # The packets are muxed unchanged: the same packets through another writer decode to the same frames.
    again = tmp_path / "again.mp4"
    with Mp4Writer.for_packets(again, WIDTH, HEIGHT, fmt.rate, partial=False, faststart=False) as writer:
        for packet in packets:
            writer.write_packet(packet.data, packet.pts, packet.dts, packet.duration, packet.keyframe)
        with pytest.raises(TypeError, match="use write_packet"):
            writer.write(_frames(1))
    assert _top_level_boxes(again).index("mdat") < _top_level_boxes(again).index("moov")
    assert all(np.array_equal(a, b) for a, b in zip(_decode(again)[0], decoded, strict=True))


def test_packet_writer_without_packets_leaves_no_file(tmp_path: Path) -> None:
    writer = Mp4Writer.for_packets(tmp_path / "empty.mp4", WIDTH, HEIGHT, Fraction(16))
    writer.close()
    writer.close()
    assert list(tmp_path.iterdir()) == []
