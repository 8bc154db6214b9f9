"""The inference engine: block-diffusion models (torch), their KV cache, and one contract for all.

`engine.registry.load_engine` loads any family's model; its `Engine` opens `Session`s that yield
`VideoBlock`s (`engine.contract`). Each family lives in `engine/families/<name>/`; the shared
machinery (KV cache, quantization, attention, parallelism, batching, decoders, golden cases) beside it.
"""
