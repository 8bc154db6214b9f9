"""LV-Bench for Inferix: Video Drift Error (VDE) metrics, VBench dimensions and a benchmark runner.

`lvbench.vde` holds the drift formula, `lvbench.metrics` the five metrics (weight-free and deep
backends), `lvbench.dataset` / `lvbench.schedule` the annotations and their prompt schedules,
`lvbench.runner` the generation through a mesh and `lvbench.evaluate` / `lvbench.report` the
scoring of a folder of videos. The CLI is `inferix lvbench run|eval`.
"""
