"""Streamer service: frame ingest from workers, one H.264 encode per session, fan-out to outputs.

Workers push decoded RGB frames (`PushFrames`); each session's frames are validated in order
(`ingest`), encoded once off the event loop (`stream.EncodedStream` around `encoder.H264Encoder`)
and the packets handed to every `sinks.PacketSink` of the session — the MP4 recorder today,
RTMP push and WebRTC viewers later.
"""
