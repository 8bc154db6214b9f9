"""Plans, the cost model, the automatic choice, the partial-attention math and the CLI (one process)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.parallel.attention import attention_with_lse, merge_partials
from engine.parallel.cost import LinkModel, ParallelConfig, WorkloadShape, choose_plan, predict
from engine.parallel.plan import ParallelConfigError, ParallelPlan, candidate_plans
from engine.parallel.pod_main import main
from inferix.spec.architectures import WAN21_T2V_1_3B, WAN21_T2V_14B, WanDiTConfig
from inferix.spec.sampling import BlockConfig


def real_shape(dit: WanDiTConfig = WAN21_T2V_1_3B, context_frames: int = 21) -> WorkloadShape:
    """480x832 (60x104 latents, 1560 tokens/frame), 3-frame blocks, 4 steps, bf16."""
    return WorkloadShape.from_config(
        dit, BlockConfig(), latent_height=60, latent_width=104, denoising_steps=4, context_frames=context_frames
    )


def test_rank_layout_ulysses_groups_are_consecutive_ranks() -> None:
    plan = ParallelPlan(4, 2, "pass-q")
    assert plan.name == "hybrid-u4xr2-pass-q" and plan.world_size == 8
    assert plan.ulysses_group(1) == [4, 5, 6, 7] and plan.ring_group(1) == [1, 5]
    assert plan.coords(6) == (2, 1)
    assert ParallelPlan(2, 1).name == "ulysses" and ParallelPlan(1, 2, "pass-kv").name == "ring-pass-kv"


def test_bad_plans_and_uneven_splits_say_what_to_do() -> None:
    with pytest.raises(ParallelConfigError, match="needs variant"):
        ParallelPlan(1, 2)
    with pytest.raises(ParallelConfigError, match="must divide num_heads=12"):
        ParallelPlan(8, 1).check(num_heads=12, tokens_per_frame=1560)
    with pytest.raises(ParallelConfigError, match="must divide tokens_per_frame=1560"):
        ParallelPlan(1, 16, "pass-q").check(num_heads=12, tokens_per_frame=1560)
    with pytest.raises(ParallelConfigError, match="cannot be split into Ulysses x Ring"):
        candidate_plans("hybrid-pass-q", 2)
    with pytest.raises(ParallelConfigError, match="unknown strategy"):
        candidate_plans("tree", 2)
    # A fixed strategy that cannot run is an error at start-up, with the reason.
    with pytest.raises(ParallelConfigError, match="must divide num_heads=12"):
        choose_plan(ParallelConfig("ulysses"), 8, real_shape())


def test_candidates_cover_every_split_and_variant() -> None:
    names = {p.name for p in candidate_plans("auto", 8)}
    assert names == {
        "ulysses",
        "ring-pass-kv",
        "ring-pass-q",
        "hybrid-u2xr4-pass-kv",
        "hybrid-u2xr4-pass-q",
        "hybrid-u4xr2-pass-kv",
        "hybrid-u4xr2-pass-q",
    }
    assert [p.name for p in candidate_plans("hybrid-pass-kv", 8, ulysses_degree=2)] == ["hybrid-u2xr4-pass-kv"]


def test_pass_q_moves_a_block_where_pass_kv_moves_the_whole_context() -> None:
    shape = real_shape()
    kv = predict(ParallelPlan(1, 2, "pass-kv"), shape)
    q = predict(ParallelPlan(1, 2, "pass-q"), shape)
    # 3-frame block against a 21-frame context: about 3/21 of the bytes (plus the fp32 lse).
    assert 3 / 21 < q.ring_bytes / kv.ring_bytes < 1.01 * 3 / 21
    # With only the block itself as context the two variants move about the same.
    first = real_shape(context_frames=3)
    q_first, kv_first = (predict(ParallelPlan(1, 2, v), first).ring_bytes for v in ("pass-q", "pass-kv"))
    assert 1.0 < q_first / kv_first < 1.01


@pytest.mark.parametrize(
    ("dit", "world", "expected"),
    [
        (WAN21_T2V_1_3B, 2, "ulysses"),
        (WAN21_T2V_1_3B, 4, "ulysses"),
        (WAN21_T2V_1_3B, 8, "hybrid-u4xr2-pass-q"),  # 12 heads: Ulysses stops at 4
        (WAN21_T2V_14B, 2, "ulysses"),
        (WAN21_T2V_14B, 8, "ulysses"),
    ],
)
def test_automatic_choice_is_logged_with_its_prediction(
    dit: WanDiTConfig, world: int, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="engine.parallel.cost"):
        choice = choose_plan(ParallelConfig(), world, real_shape(dit))
    assert choice.plan.name == expected
    assert choice.alternatives[0] is choice.cost
    assert all(choice.seconds <= c.seconds(LinkModel()) for c in choice.alternatives)
    assert f"sequence parallel: {expected}" in caplog.text and "MiB/block/rank" in caplog.text


def test_configuration_overrides_the_automatic_choice() -> None:
    assert choose_plan(ParallelConfig("ring-pass-kv"), 4, real_shape()).plan == ParallelPlan(1, 4, "pass-kv")
    hybrid = choose_plan(ParallelConfig("hybrid-pass-q", ulysses_degree=2), 8, real_shape())
    assert hybrid.plan == ParallelPlan(2, 4, "pass-q")


def test_partials_over_disjoint_keys_merge_to_exact_attention() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, n, 3, 8) for n in (5, 11, 11))
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    parts = [attention_with_lse(q, k[:, s], v[:, s]) for s in (slice(0, 4), slice(4, 5), slice(5, 11))]
    merged = merge_partials([o for o, _ in parts], [lse for _, lse in parts])
    torch.testing.assert_close(merged, expected, rtol=0, atol=1e-6)
    out, lse = attention_with_lse(q, k, v)
    torch.testing.assert_close(lse, torch.logsumexp(torch.einsum("bqhd,bkhd->bqhk", q, k) / 8**0.5, -1))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_entry_point_help_and_plan(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "generate" in capsys.readouterr().out
    assert main(["plan", "--dit-config", "wan2.1-14b", "--world-size", "2", "8"]) == 0
    out = capsys.readouterr().out
    assert "world 8: sequence parallel: ulysses" in out and "ring-pass-kv" in out
    assert main(["plan", "--world-size", "8", "--strategy", "ulysses"]) == 2
    assert "must divide num_heads=12" in capsys.readouterr().err
