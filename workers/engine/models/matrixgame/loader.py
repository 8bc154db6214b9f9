"""Loading a Matrix-Game 2.0 DiT checkpoint (reference names, optionally under the released `model.` prefix)."""

from __future__ import annotations

from pathlib import Path

import torch

from workers.engine.checkpoint import load_into, read_state_dict
from workers.engine.models.matrixgame.config import MatrixGameConfig
from workers.engine.models.matrixgame.dit import MatrixGameDiT

RELEASED_PREFIX = "model."


def load_matrixgame_dit(
    path: str | Path,
    config: MatrixGameConfig,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
) -> MatrixGameDiT:
    state = read_state_dict(path, "Matrix-Game DiT checkpoint", "Expected the CausalWanModel state dict.")
    if state and all(name.startswith(RELEASED_PREFIX) for name in state):
        state = {name.removeprefix(RELEASED_PREFIX): tensor for name, tensor in state.items()}
    dit = load_into(
        lambda: MatrixGameDiT(config, attention_backend),
        state,
        path,
        dtype=dtype,
        device=device,
        what="Matrix-Game DiT",
        hint="check the DiT config (dim, num_layers, action_config) against the checkpoint",
    )
    return dit.eval()
