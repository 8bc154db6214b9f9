"""The keyboard branch of an action-conditioned DiT (toyworld-play's) in the block loop: what each
frame reads, that keys reach the frames, and that replay, batching and re-caching keep a session's
blocks bit-identical to an uninterrupted run alone under the same keys."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.batching import BlockBatcher
from engine.families.wan.keyboard import KeyboardBranch
from engine.families.wan.pipeline import BlockOutput, ReplayBlock, WanLoop, WanPipeline
from inferix.spec.architectures import KeyboardActionConfig
from inferix.spec.sampling import BlockConfig
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_dit, tiny_pipeline

KEYS = KeyboardActionConfig(keys=4, window=3, embed_dim=8, attn_dim=16, heads=2, layers=(0,))
ACTION_DIT = dataclasses.replace(TINY_DIT, action=KEYS)
WINDOW = BlockConfig(num_frame_per_block=3, local_attn_size=6, sink_size=0)
NF = WINDOW.num_frame_per_block


def action_pipeline() -> WanPipeline:
    """A tiny action DiT whose branch is not the identity (its output projection is randomised)."""
    pipe = tiny_pipeline(WINDOW, dit_config=ACTION_DIT)
    torch.manual_seed(7)
    for module in pipe.dit.modules():
        if isinstance(module, KeyboardBranch):
            torch.nn.init.normal_(module.out.weight, std=0.5)
    return pipe


def held(*keys: int) -> torch.Tensor:
    """Key rows of one block with `keys` held in every frame."""
    rows = torch.zeros(NF, KEYS.keys)
    rows[:, list(keys)] = 1.0
    return rows


PLAN = [held(), held(3), held(3), held(0, 2), held(), held(1), held(1)]


def run(session: WanLoop, plan: list[torch.Tensor]) -> list[BlockOutput]:
    out = []
    for rows in plan:
        session.set_key_rows(rows)
        out.append(session.generate_block())
    return out


def test_an_untrained_branch_leaves_the_text_model_unchanged() -> None:
    plain, with_branch = tiny_dit(1), tiny_dit(2, ACTION_DIT)
    missing, unexpected = with_branch.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".keyboard." in name for name in missing)
    x, t, text = torch.randn(1, NF, TINY_DIT.in_dim, LATENT_H, LATENT_W), torch.full((1, NF), 500.0), prompt(0)
    rows = torch.ones(1, KEYS.rows_before + NF, KEYS.keys)
    with torch.no_grad():
        expected = plain(x, t, plain.encode_prompt(text))
        assert torch.equal(with_branch(x, t, with_branch.encode_prompt(text), key_rows=rows), expected)


def test_a_frame_reads_the_keys_of_its_own_window_only() -> None:
    torch.manual_seed(3)
    branch = KeyboardBranch(KEYS, dim=32, eps=1e-6)
    torch.nn.init.normal_(branch.out.weight)
    frames, positions = 3, 5
    x = torch.randn(1, frames * positions, 32)
    rows = torch.zeros(1, KEYS.rows_before + frames, KEYS.keys)
    with torch.no_grad():
        base = branch(x, rows).view(frames, positions, -1)
        for row in range(rows.shape[1]):
            pressed = rows.clone()
            pressed[0, row, 1] = 1.0
            changed = (branch(x, pressed).view(frames, positions, -1) != base).flatten(1).any(1).tolist()
            # Frame f (at row rows_before + f) reads the rows of frames f - 2 (window - 1) .. f.
            assert changed == [f <= row <= f + KEYS.rows_before for f in range(frames)], row


def test_a_branch_reusing_its_keyboard_tokens_answers_as_a_fresh_one_for_every_call() -> None:
    """The branch keeps the last call's keyboard K/V (a block's steps share their key rows); a call with
    other rows, another token count or another dtype must not get them."""
    torch.manual_seed(4)
    branch = KeyboardBranch(KEYS, dim=32, eps=1e-6)
    torch.nn.init.normal_(branch.out.weight)
    pressed = torch.zeros(1, KEYS.rows_before + 3, KEYS.keys)
    pressed[0, -1, 2] = 1.0
    calls = [
        (torch.randn(1, 15, 32), torch.zeros(1, KEYS.rows_before + 3, KEYS.keys)),
        (torch.randn(1, 15, 32), torch.zeros(1, KEYS.rows_before + 3, KEYS.keys)),  # the same rows: reused
        (torch.randn(1, 15, 32), pressed),
        (torch.randn(1, 6, 32), pressed),  # 2 tokens per frame of the same 3 frames
        (torch.randn(1, 6, 32).double(), pressed),
        (torch.randn(1, 15, 32), torch.zeros(1, KEYS.rows_before + 3, KEYS.keys)),
    ]
    calls.append((calls[-1][0], calls[-1][1]))
    with torch.no_grad():
        for index, (x, rows) in enumerate(calls):
            if index == len(calls) - 1:
                rows[0, -1, 0] = 1.0  # the rows of the call before, changed in place
            fresh = KeyboardBranch(KEYS, dim=32, eps=1e-6).to(x.dtype)
            fresh.load_state_dict(branch.state_dict())
            assert torch.equal(branch.to(x.dtype)(x, rows), fresh(x, rows)), index


def test_keys_change_the_blocks_they_are_held_in_and_after() -> None:
    pipe = action_pipeline()
    text = prompt(1)
    a = run(pipe.open_session(text, LATENT_H, LATENT_W, seed=5), PLAN)
    other = [*PLAN[:3], held(1), *PLAN[4:]]
    b = run(pipe.open_session(text, LATENT_H, LATENT_W, seed=5), other)
    assert all(torch.equal(x.latents, y.latents) for x, y in zip(a[:3], b[:3], strict=True))
    assert not torch.equal(a[3].latents, b[3].latents)


def test_replay_under_the_stored_keys_continues_bit_identically() -> None:
    pipe = action_pipeline()
    text = prompt(2)
    full = run(pipe.open_session(text, LATENT_H, LATENT_W, seed=9), PLAN)
    split = 4  # past the window: the replay must roll it and keep the keys later windows read
    resumed = pipe.open_session(text, LATENT_H, LATENT_W, seed=9)
    resumed.replay(
        [ReplayBlock(b.start_frame, b.latents, text, rows) for b, rows in zip(full[:split], PLAN, strict=False)],
        next_block_index=split,
    )
    rest = run(resumed, PLAN[split:])
    assert all(torch.equal(x.latents, y.latents) for x, y in zip(full[split:], rest, strict=True))
    wrong = pipe.open_session(text, LATENT_H, LATENT_W, seed=9)
    wrong.replay([ReplayBlock(b.start_frame, b.latents, text) for b in full[:split]], next_block_index=split)
    assert not torch.equal(run(wrong, PLAN[split:])[0].latents, full[split].latents)  # keys are part of the past


def test_sessions_batched_with_different_keys_equal_each_alone() -> None:
    pipe = action_pipeline()
    plans = [PLAN, [held(2)] * len(PLAN), list(reversed(PLAN))]
    alone = [run(pipe.open_session(prompt(n), LATENT_H, LATENT_W, seed=n), plan) for n, plan in enumerate(plans)]
    sessions = [pipe.open_session(prompt(n), LATENT_H, LATENT_W, seed=n) for n in range(len(plans))]
    batcher = BlockBatcher(pipe.dit)
    together: list[list[BlockOutput]] = [[] for _ in plans]
    with torch.no_grad():
        for block in range(len(PLAN)):
            for session, plan in zip(sessions, plans, strict=True):
                session.set_key_rows(plan[block])
            for n, out in enumerate(batcher.run([s.block_job() for s in sessions])):
                together[n].append(out)
    for solo, batched in zip(alone, together, strict=True):
        assert all(torch.equal(x.latents, y.latents) for x, y in zip(solo, batched, strict=True))


def test_a_recache_after_the_window_rolled_reads_the_keys_it_kept() -> None:
    pipe = action_pipeline()
    runs = []
    for _ in range(2):
        session = pipe.open_session(prompt(3), LATENT_H, LATENT_W, seed=4)
        run(session, PLAN[:5])
        session.set_prompt(prompt(4), recache=True)
        runs.append(run(session, PLAN[5:]))
    assert all(torch.equal(x.latents, y.latents) for x, y in zip(*runs, strict=True))


def test_key_rows_of_the_wrong_shape_or_for_a_text_model_are_refused() -> None:
    session = action_pipeline().open_session(prompt(0), LATENT_H, LATENT_W)
    with pytest.raises(ValueError, match=r"key rows must have shape \[3, 4\], got \[3, 2\]"):
        session.set_key_rows(torch.zeros(NF, 2))
    text_only = tiny_pipeline(WINDOW).open_session(prompt(0), LATENT_H, LATENT_W)
    with pytest.raises(ValueError, match="this model takes no actions"):
        text_only.set_key_rows(held(1))
