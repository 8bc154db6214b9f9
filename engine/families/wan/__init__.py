"""Wan-based block-causal models: Self Forcing, CausVid, LongLive and the built-in toyworld models
(their weights live in weights/)."""
