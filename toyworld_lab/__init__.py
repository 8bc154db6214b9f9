"""Toyworld lab: the synthetic 2-D world of the built-in ``toyworld`` model, its training and evaluation.

This package owns the procedural world (`world.py`), the measurements of its frames
(`measure.py`), the simulator that follows a model's own rollouts (`oracle.py`), the trainer
(`train.py`) and the evaluation of a trained model against the simulator (`evaluate.py`). It
depends on the engine; the engine never imports it and keeps only the model definition and the
shipped weights (`engine/families/wan/weights/toyworld/`). The package is not named
``toyworld``: a folder of that name in the working directory would take the place of the
built-in model ``toyworld`` (`engine.families.wan.loader.builtin_model_name`).
"""
