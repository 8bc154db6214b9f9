"""MAGI-1 DiT against the reference golden vectors (tests/golden/magi1_tiny_*, README sections 5-10, 13).

Every pass's inputs are derived from `config.json -> call_log` the way a pipeline would derive them (window,
per-chunk t, key ranges in rows of [cached prefix ; fresh rows], caption rows of each chunk, cache prefix), so
these tests also pin the argument conventions of `MagiDiT.forward`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from engine.families.magi.dit import MagiDiT, MagiDiTConfig
from inferix.errors import UserError
from tests.conftest import GOLDEN_DIR

CASES = ["magi1_tiny_distill", "magi1_tiny_cfg"]
# Tolerances (max abs, fp32, one thread), measured over every captured pass / every pipeline call on two CPUs:
#   rope 0 (bit exact), y_xattn_flat 0, embed_x <= 1.8e-7 (sgemm noise: the reference's gemms see other pointer
#   alignments); condition <= 2.4e-7 on an AVX2 CPU, 1.7e-5 on an AVX512 one (the timestep sinusoid of t up to
#   1000 in fp32: one ulp of the argument is 6e-5 rad, and the vectorized sin/cos differ by CPU); kv_fresh <= 4.5e-6
#   / 3.9e-5, pass outputs <= 4.3e-6 / 4.9e-5 (cfg outputs are divided by x_rescale_factor 0.1), layer outputs
#   <= 8.3e-6 / 1.1e-4 (the post-norms of the "sandwich" amplify the noise of small-variance rows ~30x: our own
#   passes differ that much between AVX512 and SSE kernels). README section 13: fp32 agrees to ~1e-6 relative
#   before that amplification; the tolerances leave 2x over the worst CPU measured.
INPUT_ATOL = 1e-6
CONDITION_ATOL = 5e-5
ATOL = 1e-4
LAYER_ATOL = 2e-4


@dataclass(frozen=True)
class Golden:
    name: str
    config: dict[str, Any]
    model: MagiDiT
    inputs: dict[str, Tensor]
    pipeline: dict[str, Tensor]
    dit_forward: dict[str, Tensor]

    @property
    def distill(self) -> bool:
        return bool(self.config["magi_config"]["engine_config"]["distill"])

    @property
    def ctn(self) -> int:
        return int(self.config["derived"]["clip_token_nums"])


@dataclass(frozen=True)
class PassInputs:
    x: Tensor
    t: Tensor
    captions: list[list[Tensor]]
    kv_ranges: list[tuple[int, int]]
    prefix: list[Tensor] | None
    rope_offset_frames: int
    caption_dropout: bool
    distill_dt: float | None


@cache
def golden(name: str) -> Golden:
    folder = GOLDEN_DIR / name
    config = json.loads((folder / "config.json").read_text())
    dit_config = MagiDiTConfig.from_reference(config["magi_config"]["model_config"])
    with torch.device("meta"):
        model = MagiDiT(dit_config)
    # The pipeline builds on meta and loads with assign=True: every parameter must come from the checkpoint.
    model.load_state_dict(load_file(str(folder / "dit.safetensors")), strict=True, assign=True)
    model.eval()
    return Golden(
        name=name,
        config=config,
        model=model,
        inputs=load_file(str(folder / "inputs.safetensors")),
        pipeline=load_file(str(folder / "pipeline.safetensors")),
        dit_forward=load_file(str(folder / "dit_forward.safetensors")),
    )


def caption_rows(g: Golden, row: int, chunk: int) -> Tensor:
    """Valid rows of y[row, chunk] (row 0 = caption, 1 = null); no caption has valid rows beyond the 64 stored."""
    mask = g.inputs["y_masks"][row, chunk]
    assert mask[64:].sum() == 0
    return g.inputs["y_first_rows"][row, chunk][mask[:64] > 0]


def pass_inputs(g: Golden, call: int, p: int, window: Tensor) -> PassInputs:
    """The inputs of pass p of dispatcher call `call` (window = the call's latent, incl. a prepended chunk)."""
    entry = g.config["call_log"][call]
    info = entry["passes"][p]
    cw, ctn = entry["chunk_width"], g.ctn
    sp = info["slice_point"]
    ss = 1 if entry["fwd_extra_1st_chunk"] else 0
    denoising = len(entry["timestep"]) - ss
    uncond = not g.distill and p == 2
    text = p == 0  # distill's only pass and cfg's cond_pre_and_text read the caption; the others the null rows
    # kv_range: rows [start, end) of [cached prefix ; fresh rows]; k_range (captured calls only) is the same.
    ranges = info["kv_range"]
    assert info.get("k_range", ranges) == ranges
    captions: list[list[Tensor]]
    if uncond:
        # Each denoising chunk alone as a batch element, attending to its own rows only.
        x = torch.cat([window[:, :, (ss + b) * cw : (ss + b + 1) * cw] for b in range(denoising)])
        captions = [[caption_rows(g, 1, sp + ss + b)] for b in range(denoising)]
        # The reference counts the batch's rows one after the other; forward takes them per element.
        base = ranges[0]
        assert all(r == [base[0] + b * ctn, base[1] + b * ctn] for b, r in enumerate(ranges))
        kv_ranges = [(base[0], base[1])]
    else:
        x = window
        chunks = [
            caption_rows(g, 1, 0) if ss and j == 0 else caption_rows(g, 0 if text else 1, sp + j)
            for j in range(ss + denoising)
        ]
        if g.distill and entry["distill_nearly_clean_chunk"]:
            # A copy of the first denoising chunk appended, with its own caption and its own rows as keys.
            x = torch.cat([window, window[:, :, ss * cw : (ss + 1) * cw]], dim=2)
            chunks.append(caption_rows(g, 0, sp + ss))
        captions = [chunks]
        kv_ranges = [(a, b) for a, b in ranges]
    assert [c.shape[0] for per_b in captions for c in per_b] == [int(v) for v in info["xattn_mask_valid"]]
    prefix = None
    if info["uses_kv_cache"] and sp > 0:
        layers = g.model.config.num_layers
        prefix = [g.pipeline[f"kv_clean_l{i}"][: sp * ctn] for i in range(layers)]
    distill_dt = None
    if g.distill:
        steps = entry["num_steps"]
        distill_dt = 4 / entry["distill_interval"] * 2 if steps == 12 else steps / 4 * 2
    return PassInputs(
        x=x,
        t=torch.tensor(info["t"], dtype=torch.float32),
        captions=captions,
        kv_ranges=kv_ranges,
        prefix=prefix,
        rope_offset_frames=0 if uncond else sp * cw,
        caption_dropout=bool(info["caption_dropout_mask"][0]),
        distill_dt=distill_dt,
    )


def run(g: Golden, inputs: PassInputs, capture: dict[str, Tensor] | None = None) -> tuple[Tensor, list[Tensor]]:
    with torch.inference_mode():
        return g.model(
            inputs.x,
            inputs.t,
            inputs.captions,
            inputs.kv_ranges,
            inputs.prefix,
            inputs.rope_offset_frames,
            inputs.caption_dropout,
            inputs.distill_dt,
            capture=capture,
        )


def max_diff(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


def passes(name: str, calls: list[int] | None = None) -> list[tuple[str, int, int]]:
    config = json.loads((GOLDEN_DIR / name / "config.json").read_text())
    log = config["call_log"]
    chosen = range(len(log)) if calls is None else calls
    return [(name, c, p["pass"]) for c in chosen for p in log[c]["passes"]]


def captured_passes() -> list[tuple[str, int, int]]:
    out = []
    for name in CASES:
        config = json.loads((GOLDEN_DIR / name / "config.json").read_text())
        out += passes(name, config["dit_forward_calls"])
    return out


# ---- single forwards with every intermediate ---------------------------------------------------


@pytest.mark.parametrize(("name", "call", "p"), captured_passes())
def test_captured_pass_matches_reference(name: str, call: int, p: int) -> None:
    """Inputs and every intermediate of the captured passes (README "suggested order" step 4)."""
    g = golden(name)
    key = f"call{call:03d}_pass{p}_"
    ref = {k.removeprefix(key): v for k, v in g.dit_forward.items() if k.startswith(key)}
    inputs = pass_inputs(g, call, p, g.pipeline[f"call{call:03d}_x"])
    assert torch.equal(inputs.x, ref["in_x"]) and torch.equal(inputs.t, ref["in_t"])
    capture: dict[str, Tensor] = {}
    out, fresh = run(g, inputs, capture)
    compared = {k for k in ref if k not in ("in_x", "in_t")}
    assert compared <= set(capture)
    if "rope" in ref:
        assert torch.equal(capture["rope"], ref["rope"])
    for k in sorted(compared):
        tol = INPUT_ATOL if k in ("embed_x", "y_xattn_flat") else CONDITION_ATOL if k == "condition" else ATOL
        tol = LAYER_ATOL if k.startswith("layer") else tol
        assert max_diff(capture[k], ref[k]) <= tol, (k, max_diff(capture[k], ref[k]))
    assert all(torch.equal(f, capture[f"kv_fresh_l{i}"]) for i, f in enumerate(fresh))
    assert max_diff(out, g.pipeline[f"{key}out"]) <= ATOL


@pytest.mark.parametrize("name", CASES)
def test_null_caption_rows_are_the_first_50_rows_of_the_null_embedding(name: str) -> None:
    """y[1, c] = null_caption_embedding[:50] for every chunk (README section 2): what a pipeline passes."""
    g = golden(name)
    null = g.model.y_embedder.null_caption_embedding.detach()[:50]
    for chunk in range(g.config["derived"]["chunk_num"]):
        assert torch.equal(caption_rows(g, 1, chunk), null)


def test_rope_is_the_exact_fp32_grid() -> None:
    """README 10.2: coord / (f-1) * (ref-1) in fp32, not the integer frame index; bit-exact to the reference."""
    g = golden("magi1_tiny_distill")
    with torch.inference_mode():
        sin, cos = g.model.rope(18, 2, 3)
    assert torch.equal(torch.cat([sin, cos], -1)[-108:], g.dit_forward["call008_pass0_rope"])
    # Call 9 reads one cached chunk: its tokens are the last 90 rows of an 18-frame grid (slice_point 1, cw 3).
    assert torch.equal(torch.cat([sin, cos], -1)[-90:], g.dit_forward["call009_pass0_rope"])


# ---- every call of the pipeline ----------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_every_pipeline_pass_matches_reference(name: str) -> None:
    """callNNN_x -> callNNN_passP_out for every call and pass, with inputs derived from the call log only.

    The writing pass of a call with a prepended clean chunk also produces that chunk's cache rows: they must be
    the final clean cache `kv_clean_l{i}` (README section 6).
    """
    g = golden(name)
    log = g.config["call_log"]
    ctn = g.ctn
    worst = 0.0
    cache_rows_checked = 0
    for call, entry in enumerate(log):
        window = g.pipeline[f"call{call:03d}_x"]
        for info in entry["passes"]:
            p = info["pass"]
            out, fresh = run(g, pass_inputs(g, call, p, window))
            diff = max_diff(out, g.pipeline[f"call{call:03d}_pass{p}_out"])
            assert diff <= ATOL, (call, p, diff)
            worst = max(worst, diff)
            writes = g.distill or p == 1
            if entry["fwd_extra_1st_chunk"] and writes and info["slice_point"] < g.config["derived"]["chunk_num"] - 1:
                chunk = info["slice_point"]
                for i, kv in enumerate(fresh):
                    clean = g.pipeline[f"kv_clean_l{i}"][chunk * ctn : (chunk + 1) * ctn]
                    assert max_diff(kv[:ctn], clean) <= ATOL, (call, i)
                cache_rows_checked += 1
    assert cache_rows_checked == g.config["derived"]["chunk_num"] - 1
    print(f"{name}: max abs diff over every pass output {worst:.3g}")


def test_look_back_prefix_and_shifted_ranges_give_the_same_output() -> None:
    """Passing only the look-back rows of the cache (ranges shifted by the rows left out) changes nothing."""
    g = golden("magi1_tiny_cfg")
    call = 18  # slice_point 3, chunks see [2,4) and [1,5): cached chunk 0 is not read
    inputs = pass_inputs(g, call, 0, g.pipeline[f"call{call:03d}_x"])
    full, _ = run(g, inputs)
    assert inputs.prefix is not None
    start = min(a for a, _ in inputs.kv_ranges)
    trimmed = replace(
        inputs,
        prefix=[p[start:] for p in inputs.prefix],
        kv_ranges=[(a - start, b - start) for a, b in inputs.kv_ranges],
    )
    assert torch.equal(run(g, trimmed)[0], full)
    # With rows dropped that a chunk does read, the output must change (the ranges really are used).
    shifted = replace(inputs, kv_ranges=[(a + g.ctn, b) for a, b in inputs.kv_ranges])
    assert max_diff(run(g, shifted)[0], full) > 1e-3


def test_uncond_batch_elements_are_independent() -> None:
    """cfg uncond pass: N > 1, each element attends to its own rows; element b alone gives the same result."""
    g = golden("magi1_tiny_cfg")
    inputs = pass_inputs(g, 9, 2, g.pipeline["call009_x"])
    assert inputs.x.shape[0] == 2
    batched, fresh = run(g, inputs)
    for b in range(2):
        alone = replace(inputs, x=inputs.x[b : b + 1], t=inputs.t[b : b + 1], captions=[inputs.captions[b]])
        out, fresh_b = run(g, alone)
        assert max_diff(out[0], batched[b]) <= ATOL
        # (token, batch) order: element b's rows are every second row.
        assert max_diff(fresh_b[0], fresh[0][b::2]) <= ATOL


@pytest.mark.parametrize("fp32_islands", [False, True])
def test_bfloat16_weights_run_close_to_fp32(fp32_islands: bool) -> None:
    """With bf16 weights the fp32 islands keep the output near the fp32 reference (a smoke test of the dtypes)."""
    g = golden("magi1_tiny_distill")
    model = MagiDiT(g.model.config).to(torch.bfloat16)
    if fp32_islands:
        model.keep_fp32_islands()
        assert model.x_embedder.weight.dtype == torch.float32 and model.rope.bands.dtype == torch.float32
    # Without assign, the load copies each value into its parameter's dtype: the islands stay unrounded.
    model.load_state_dict(g.model.state_dict())
    assert model.dtype == torch.bfloat16
    inputs = pass_inputs(g, 9, 0, g.pipeline["call009_x"])
    inputs = replace(inputs, prefix=[p.to(torch.bfloat16) for p in inputs.prefix or []])
    with torch.inference_mode():
        out, fresh = model(
            inputs.x,
            inputs.t,
            inputs.captions,
            inputs.kv_ranges,
            inputs.prefix,
            inputs.rope_offset_frames,
            inputs.caption_dropout,
            inputs.distill_dt,
        )
    ref = g.pipeline["call009_pass0_out"]
    assert out.dtype == torch.float32 and fresh[0].dtype == torch.bfloat16
    # Measured: 1.03% (bf16 everywhere) and 0.97% (fp32 islands) of the output's max (cfg case: 1.30% / 1.27%).
    assert max_diff(out, ref) <= 0.03 * ref.abs().max().item()


# ---- config -------------------------------------------------------------------------------------


def reference_config() -> dict[str, Any]:
    config = json.loads((GOLDEN_DIR / "magi1_tiny_cfg" / "config.json").read_text())
    return dict(config["magi_config"]["model_config"])


def test_config_from_reference() -> None:
    config = MagiDiTConfig.from_reference(reference_config())
    assert config.hidden_size == 96 and config.half_channel_vae and config.gated_linear_unit
    assert config.x_rescale_factor == 0.1 and config.cond_dim == 24 and config.rope_bands == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_query_groups": 3}, "multiple of num_query_groups"),
        ({"kv_channels": 20, "hidden_size": 80}, "multiple of 8"),
        ({"hidden_size": 64}, "num_attention_heads x kv_channels"),
        ({"t_patch_size": 2}, "t_patch_size"),
        ({"in_channels": 33}, "even"),
        ({"cond_gating_ratio": 0.5}, "cond_gating_ratio"),
        ({"apply_layernorm_1p": False}, "apply_layernorm_1p"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_config_rejects_unsupported_models(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        MagiDiTConfig.from_reference({**reference_config(), **change})


def test_config_names_missing_keys() -> None:
    config = reference_config()
    del config["kv_channels"]
    with pytest.raises(UserError, match="kv_channels"):
        MagiDiTConfig.from_reference(config)


def test_forward_rejects_inconsistent_inputs() -> None:
    g = golden("magi1_tiny_distill")
    inputs = pass_inputs(g, 9, 0, g.pipeline["call009_x"])
    with pytest.raises(ValueError, match="kv_ranges"):
        run(g, replace(inputs, kv_ranges=inputs.kv_ranges[:-1]))
    with pytest.raises(ValueError, match="kv_ranges"):
        run(g, replace(inputs, kv_ranges=[(0, 10_000)] * len(inputs.kv_ranges)))
    with pytest.raises(ValueError, match="captions"):
        run(g, replace(inputs, captions=[inputs.captions[0][:-1]]))
    with pytest.raises(ValueError, match="prefix"):
        run(g, replace(inputs, prefix=(inputs.prefix or [])[:1]))
