"""What the live side reports: Prometheus metrics and `streamer.publish` spans, from a real streamer process."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import grpc

from inferix.api.v1 import streamer_pb2, streamer_pb2_grpc
from inferix.telemetry import BLOCK_INDEX_ATTR
from tests.otlp import SpanCollector
from tests.streamer.live import SchedulerLink, start_live_streamer, stream_info, wait_until
from tests.streamer.media import Video
from tests.streamer.test_service import scrape


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens here once the socket is closed


def test_metrics_and_publish_spans_of_a_session_that_falls_behind(tmp_path: Path) -> None:
    collector = SpanCollector().start()
    trace_id = "5bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
    streamer, _ = start_live_streamer(tmp_path, rtmp_url=f"rtmp://127.0.0.1:{closed_port()}/live", env=collector.env)
    video = Video("metered", 64, 48, 16.0, (6, 6))
    try:
        with grpc.insecure_channel(streamer.address) as channel:
            stub = streamer_pb2_grpc.StreamerServiceStub(channel)
            link = SchedulerLink(channel)
            link.announce(video.session_id, rtmp=True, created_at=time.time() - 1.0)  # created a second ago
            wait_until(lambda: bool(scrape(streamer)), 5, "metrics")
            assert stub.PushFrames(video.block(0), metadata=traceparent, timeout=30).accepted == 6
            time.sleep(0.9)  # the next block is late: generation fell behind real time
            assert stub.PushFrames(video.block(1), metadata=traceparent, timeout=30).accepted == 6
            stub.FinishStream(streamer_pb2.FinishStreamRequest(session_id=video.session_id), timeout=30)
            wait_until(lambda: stream_info(stub, video.session_id).live.rtmp_state == "ended", 10, "the live end")
            live = stream_info(stub, video.session_id).live
            metrics = scrape(streamer)
            link.close()
        code = streamer.stop()
    finally:
        streamer.kill()
        collector.stop()
    assert code == 0, streamer.log_tail()

    assert live.frames_out == 12 and live.underruns == 1 and live.underrun_seconds > 0.2
    assert 1000 <= live.time_to_first_frame_ms < 3000  # from the announced creation time
    assert metrics["inferix_streamer_frames_out_total"] == 12
    assert metrics["inferix_streamer_underruns_total"] == 1
    assert metrics["inferix_streamer_underrun_seconds_total"] == live.underrun_seconds
    assert metrics["inferix_streamer_frames_dropped_total{output=rtmp}"] == live.dropped_frames["rtmp"] > 0
    assert metrics["inferix_streamer_rtmp_failures_total"] >= 1
    assert metrics["inferix_streamer_time_to_first_frame_seconds_count"] == 1
    assert metrics["inferix_streamer_time_to_first_frame_seconds_sum"] >= 1.0
    assert metrics["inferix_streamer_encode_seconds_count"] == 12
    assert metrics["inferix_streamer_pacing_lateness_seconds_count"] == 12

    publish = [span for span in collector.spans if span.name == "streamer.publish"]
    attributes = [{a.key: a.value.int_value for a in span.attributes} for span in publish]
    assert sorted((a[BLOCK_INDEX_ATTR], a["inferix.frames"], a["inferix.underruns"]) for a in attributes) == [
        (0, 6, 0),
        (1, 6, 1),
    ]
    # each block's publish belongs to the trace of the push that delivered it, like its encode
    assert {span.trace_id.hex() for span in publish} == {trace_id}
    push_spans = {span.span_id for span in collector.spans if span.name.endswith("/PushFrames")}
    assert all(span.parent_span_id in push_spans for span in publish)
    for span in publish:  # a block's frames go out over its duration on the wall clock
        assert (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 >= 5 / 16 - 0.05
