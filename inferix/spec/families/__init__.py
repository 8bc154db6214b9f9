"""The torch-free half of each model family: its preset, sampling settings and session sizing
(the torch half is engine/families/)."""
