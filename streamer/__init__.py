"""Streamer service: frame ingest from workers, one H.264 encode per session, fan-out to outputs.

Workers push decoded RGB frames (`PushBlock`, a block per call; `PushFrames`, a frame per message);
each session's frames are validated in order (`ingest`), encoded once off the event loop
(`stream.EncodedStream` around `encoder.H264Encoder`) and the packets handed to every
`sinks.PacketSink` of the session: the MP4 recorder, and the
live pacer (`pacing.Pacer`) that releases them on the wall clock to the RTMP publisher (`rtmp`)
and the WebRTC viewers (`webrtc`, signalled over WHEP by `web`, which also serves the viewer page).
`live` ties a session's live outputs together; `link` is the scheduler's control link and
`control` forwards the viewer page's commands to the scheduler.
"""
