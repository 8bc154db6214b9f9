"""Matrix-Game 2.0 semantics beyond the golden case, on a tiny random model: which raw action rows a
frame reads, causality of actions across blocks, the keyboard-only path, and the rolling caches."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from engine.families.matrixgame.action import ActionInputs, window_rows
from engine.families.matrixgame.conditioning import WorldConditioning
from engine.families.matrixgame.config import ActionConfig, MatrixGameConfig
from engine.families.matrixgame.dit import MatrixGameDiT
from engine.families.matrixgame.pipeline import MatrixGamePipeline
from engine.families.matrixgame.rolling_cache import RollingFrameCache, slots_of
from engine.families.wan.vae import WanVAE
from engine.noise import SeededNoise
from inferix.spec.architectures import WanDiTConfig, WanVAEConfig
from inferix.spec.sampling import BlockConfig, PipelineConfig, SamplingConfig

FRAMES, NF, H, W = 12, 3, 4, 6
ROWS = 1 + 4 * (FRAMES - 1)


def _pipeline(window: int, mouse: bool = True) -> MatrixGamePipeline:
    torch.manual_seed(0)
    action = ActionConfig(
        blocks=(0,), heads_num=2, hidden_size=8, img_hidden_size=32, keyboard_dim_in=4,
        keyboard_hidden_dim=128, mouse_hidden_dim=128, enable_mouse=mouse,
    )  # fmt: skip
    dit_config = WanDiTConfig(in_dim=36, dim=32, ffn_dim=64, freq_dim=16, num_heads=2, num_layers=2)
    dit = MatrixGameDiT(MatrixGameConfig(dit_config, action, clip_dim=16), attention_backend="sdpa").eval()
    vae = WanVAE(WanVAEConfig(dim=4, num_res_blocks=1)).eval()
    config = PipelineConfig(BlockConfig(NF, window, 0), SamplingConfig(denoising_steps=(1000, 500)))
    return MatrixGamePipeline(dit, vae, config)


def _conditioning() -> WorldConditioning:
    g = torch.Generator().manual_seed(1)
    return WorldConditioning(torch.randn(1, FRAMES, 20, H, W, generator=g), torch.randn(1, 5, 16, generator=g))


def _actions(mouse: bool = True) -> ActionInputs:
    g = torch.Generator().manual_seed(2)
    keyboard = (torch.rand(1, ROWS, 4, generator=g) < 0.4).float()
    return ActionInputs(keyboard, (torch.rand(1, ROWS, 2, generator=g) - 0.5) * 0.3 if mouse else None)


def _run(pipeline: MatrixGamePipeline, actions: ActionInputs) -> list[Tensor]:
    session = pipeline.open_session(_conditioning(), actions, SeededNoise(3))
    return [session.generate_block().latents for _ in range(session.num_blocks)]


def test_window_rows_end_before_the_frames_last_pixel_frame() -> None:
    config = ActionConfig(windows_size=3)
    rows = window_rows(0, 3, config)
    assert rows[0].tolist() == [0] * 12
    assert rows[1].tolist() == [0] * 8 + [0, 1, 2, 3]
    assert window_rows(6, 1, config)[0].tolist() == list(range(12, 24))


@pytest.mark.parametrize("kind", ["keyboard", "mouse"])
def test_a_changed_action_changes_only_the_frames_that_read_it(kind: str) -> None:
    pipeline = _pipeline(window=6)
    base = _actions()
    before = _run(pipeline, base)
    changed = ActionInputs(base.keyboard.clone(), None if base.mouse is None else base.mouse.clone())
    row = 20  # read first by latent frame 6 (rows [12, 24)): block 2
    target = changed.keyboard if kind == "keyboard" else changed.mouse
    assert target is not None
    target[0, row] = 1 - target[0, row] if kind == "keyboard" else target[0, row] + 0.1
    after = _run(pipeline, changed)
    assert [torch.equal(a, b) for a, b in zip(before, after, strict=True)] == [True, True, False, False]


def test_the_last_raw_row_is_never_read() -> None:
    pipeline = _pipeline(window=6)
    base = _actions()
    before = _run(pipeline, base)
    keyboard = base.keyboard.clone()
    keyboard[0, -1] = 1 - keyboard[0, -1]
    assert all(
        torch.equal(a, b) for a, b in zip(before, _run(pipeline, ActionInputs(keyboard, base.mouse)), strict=True)
    )


def test_keyboard_only_model_runs_without_mouse_rows() -> None:
    latents = _run(_pipeline(window=6, mouse=False), _actions(mouse=False))
    assert len(latents) == FRAMES // NF and all(torch.isfinite(x).all() for x in latents)


def test_caches_roll_with_the_window() -> None:
    pipeline = _pipeline(window=4)
    session = pipeline.open_session(_conditioning(), _actions(), SeededNoise(3))
    held = []
    for _ in range(session.num_blocks):
        session.generate_block()
        caches = session.action_caches[0]
        assert slots_of(caches.keyboard) == slots_of(caches.mouse) == sorted(session.cache.frames)
        held.append(slots_of(caches.keyboard))
    assert held == [[0, 1, 2], [2, 3, 4, 5], [5, 6, 7, 8], [8, 9, 10, 11]]
    assert caches.mouse.k is not None and caches.mouse.k.shape[:2] == (H // 2 * W // 2, 4)


def test_rolling_cache_keeps_frames_in_order_and_rewrites_a_block() -> None:
    cache = RollingFrameCache(size=6)

    def block(start: int, value: float) -> tuple[Tensor, Tensor]:
        k = torch.arange(start, start + 3, dtype=torch.float32).view(1, 3, 1, 1) + value
        return cache.update(start, k, k)

    block(0, 0.0)
    block(3, 0.0)
    block(3, 0.5)  # the same frames again (a later step): overwritten in place
    keys, _ = block(6, 0.0)
    assert keys.flatten().tolist() == [3.5, 4.5, 5.5, 6.0, 7.0, 8.0]
    assert (cache.global_end, cache.local_end) == (9, 6)
    with pytest.raises(ValueError, match="neither the next frames"):
        block(1, 0.0)


def test_held_actions_fill_the_rows_of_the_next_block() -> None:
    pipeline = _pipeline(window=6)
    base = _actions()
    session = pipeline.open_session(_conditioning(), base, SeededNoise(3))
    keys, look = torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0.1, -0.1])
    session.generate_block()
    session.hold_actions(keys, look)
    held = session.generate_block().latents
    assert session.actions.mouse is not None and base.mouse is not None
    assert torch.equal(session.actions.keyboard[0, 9:21], keys.expand(12, 4))
    assert torch.equal(base.keyboard, _actions().keyboard)  # the session wrote its own copy
    expected = ActionInputs(base.keyboard.clone(), base.mouse.clone())
    expected.keyboard[0, 9:21] = keys
    assert expected.mouse is not None
    expected.mouse[0, 9:21] = look
    assert torch.equal(held, _run(pipeline, expected)[1])
