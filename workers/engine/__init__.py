"""The inference engine: block-diffusion models (torch), their KV cache, and the front door.

`Engine` (load a model, open sessions) and `EngineSession` (blocks out, prompt changes, offload /
restore) are the public in-process API; see `workers/engine/engine.py`.
"""

from workers.engine.engine import Engine, EngineSession, VideoBlock

__all__ = ["Engine", "EngineSession", "VideoBlock"]
