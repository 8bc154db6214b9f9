"""The model families, one folder each: its engine, loop, loader, golden checks and model files.

What a family provides and how one is added: `engine.registry` and the README's "Adding a model family".
"""
