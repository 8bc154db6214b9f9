"""`--compile`: one DiT call's step is one graph (no breaks), and compiled it computes what eager does."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import Tensor
from torch._dynamo.utils import counters

from engine.compiled import CompileOptions, compile_dit, warm_up, warm_up_blocks
from engine.families.wan.dit import CausalWanDiT, DiTCall
from engine.families.wan.engine import WanEngine
from engine.families.wan.pipeline import WanPipeline
from engine.kv import KVPool, KVPoolSpec, PagedSessionCache
from engine.quant import parse_quant, quantize_linears
from inferix.spec.actions import HeldAction
from inferix.spec.sampling import BlockConfig
from inferix_cli.main import build_parser
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_dit, tiny_pipeline

TOKENS = TINY_DIT.tokens_per_frame(LATENT_H, LATENT_W)
WINDOW, SINK = 4, 1


def paged_session(frames: int = WINDOW) -> PagedSessionCache:
    spec = KVPoolSpec(TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, TOKENS, frames)
    return KVPool(spec).open_session("s", TOKENS, window_frames=WINDOW, sink_frames=SINK)


def step_arguments(dit: CausalWanDiT, call: DiTCall) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments `forward_batch` gives `denoise_step` for `call` (its prologue, `begin` included, runs)."""
    captured: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def capture(*args: Any, **kwargs: Any) -> Tensor | None:
        captured.append((args, kwargs))
        return dit.denoise_step(*args, **kwargs)

    dit.compiled_step = capture
    try:
        dit.forward_batch([call])
    finally:
        dit.compiled_step = None
    return captured[0]


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
@pytest.mark.parametrize("frames_per_block", [1, 2])
def test_a_step_is_one_graph_while_the_window_fills_and_rolls(frames_per_block: int) -> None:
    torch._dynamo.reset()
    dit = tiny_dit()
    cache = paged_session()
    text = dit.encode_prompt(prompt(0))
    # fullgraph: a graph break raises. Every block's step and context pass, through the fill and
    # two turns of the ring.
    whole = torch.compile(dit.denoise_step, backend="eager", fullgraph=True)
    blocks = (WINDOW + 2 * (WINDOW - SINK)) // frames_per_block
    with torch.no_grad():
        for block in range(blocks):
            x = torch.randn(1, frames_per_block, TINY_DIT.in_dim, LATENT_H, LATENT_W)
            t = torch.full((1, frames_per_block), 500.0)
            for kind in ("denoise_step", "context_pass"):
                args, kwargs = step_arguments(dit, DiTCall(x, t, text, cache, block * frames_per_block, kind=kind))
                assert kwargs["cache_only"] == (kind == "context_pass")
                whole(*args, **kwargs)
                if block in (0, blocks - 1):  # filling, rolling
                    explanation = torch._dynamo.explain(dit.denoise_step)(*args, **kwargs)
                    assert explanation.graph_break_count == 0, explanation.break_reasons
                    assert explanation.graph_count == 1
    assert len(cache.frames) == WINDOW  # it rolled


def latents(pipeline: WanPipeline, seeds: list[int], num_blocks: int) -> list[Tensor]:
    out = []
    with torch.no_grad():
        for seed in seeds:
            with pipeline.open_session(prompt(seed), LATENT_H, LATENT_W, seed=seed, num_blocks=num_blocks) as session:
                out.append(torch.cat([block.latents for block in session], dim=1))
    return out


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
@pytest.mark.parametrize(
    "block", [BlockConfig(2, WINDOW, SINK), BlockConfig(1)], ids=["window 4, sink 1, blocks of 2", "global"]
)
def test_compiled_sessions_equal_eager_ones_and_compile_only_in_the_warm_up(block: BlockConfig) -> None:
    torch._dynamo.reset()
    num_blocks = 6
    eager, compiled = tiny_pipeline(block), tiny_pipeline(block)
    compile_dit(compiled.dit, CompileOptions(backend="aot_eager"))
    report = warm_up(compiled, LATENT_H, LATENT_W, num_blocks=num_blocks)
    assert report.blocks == warm_up_blocks(block, num_blocks) and report.graphs >= 1
    graphs = counters["stats"]["unique_graphs"]
    expected = latents(eager, [0, 1], num_blocks)
    got = latents(compiled, [0, 1], num_blocks)
    assert counters["stats"]["unique_graphs"] == graphs  # two sessions, their fill and roll: no compile
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
def test_several_compiled_dits_in_one_process_all_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo files every DiT's graphs under `denoise_step`'s one code object; past its default limit
    of 8 the later DiTs ran eagerly without a word (a bench comparing dtypes did)."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    block = BlockConfig(2, WINDOW, SINK)
    for layers in range(1, 6):  # each DiT its own graphs (fill and roll): about twice the default limit
        pipeline = tiny_pipeline(block, dit_config=dataclasses.replace(TINY_DIT, num_layers=layers))
        compile_dit(pipeline.dit, CompileOptions(backend="eager"))
        assert warm_up(pipeline, LATENT_H, LATENT_W).graphs >= 1, f"the DiT of {layers} layer(s) ran eagerly"


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
def test_an_inductor_step_equals_the_eager_step() -> None:
    torch._dynamo.reset()
    dit = tiny_dit()
    text = dit.encode_prompt(prompt(0))
    x = torch.randn(1, 2, TINY_DIT.in_dim, LATENT_H, LATENT_W)
    t = torch.full((1, 2), 750.0)
    eager_cache, compiled_cache = paged_session(), paged_session()
    with torch.no_grad():
        expected = dit(x, t, text, eager_cache)
        compile_dit(dit)
        got = dit(x, t, text, compiled_cache)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    for layer in range(TINY_DIT.num_layers):
        for ours, theirs in zip(compiled_cache.layer_kv(layer), eager_cache.layer_kv(layer), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_batched_forwards_stay_eager() -> None:
    dit = tiny_dit()
    spec = KVPoolSpec(TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, TOKENS, 2 * WINDOW)
    pool = KVPool(spec)
    text = dit.encode_prompt(prompt(0))
    calls = [
        DiTCall(torch.randn(1, 2, TINY_DIT.in_dim, LATENT_H, LATENT_W), torch.full((1, 2), 500.0), text, cache)
        for cache in (pool.open_session(name, TOKENS, WINDOW, SINK) for name in "ab")
    ]

    def not_for_a_batch(*args: Any, **kwargs: Any) -> Tensor:
        raise AssertionError("a batched forward ran the single-call step")

    dit.compiled_step = not_for_a_batch
    with torch.no_grad():
        assert len(dit.forward_batch(calls)) == 2


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
def test_an_engine_compiles_at_start_up_and_its_sessions_match_eager_ones() -> None:
    torch._dynamo.reset()
    engine = WanEngine.load("toyworld")
    with engine.open("a red ball bouncing to the right", seed=3, num_blocks=3) as session:
        expected = [block.latents for block in session]
    warm = engine.compile(options=CompileOptions(backend="aot_eager"))
    assert warm.blocks == warm_up_blocks(engine.pipeline.config.block) and warm.graphs >= 1
    graphs = counters["stats"]["unique_graphs"]
    with engine.open("a red ball bouncing to the right", seed=3, num_blocks=3) as session:
        got = [block.latents for block in session]
    assert counters["stats"]["unique_graphs"] == graphs
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
def test_a_keyboard_dit_compiles_without_a_break_and_its_sessions_with_keys_held_match_eager_ones() -> None:
    """A play model (a DiT with a keyboard branch): the warm-up compiles with no graph break, and
    compiled sessions holding a key compile nothing more and make the eager latents."""
    torch._dynamo.reset()
    counters.clear()
    engine = WanEngine.load("toyworld-play-1f")

    def blocks(key: int) -> list[Tensor]:
        with engine.open("a red ball", seed=3, num_blocks=4) as session:
            session.hold(HeldAction(keys=(key,), mouse=()))
            return [block.latents for block in session]

    expected = [blocks(key) for key in (0, 1)]
    warm = engine.compile(options=CompileOptions(backend="aot_eager"))
    assert warm.graphs >= 1 and sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    got = [blocks(key) for key in (0, 1)]
    assert counters["stats"]["unique_graphs"] == graphs
    assert not torch.equal(expected[0][-1], expected[1][-1])  # the keys reach the DiT
    for ours, theirs in zip(sum(got, []), sum(expected, []), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("command", [["generate", "--prompt", "a ball"], ["serve"]])
def test_the_commands_take_compile(command: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args([*command, "--compile"]).compile
    assert not parser.parse_args(command).compile


@pytest.mark.slow  # torch.compile's inductor: C++ built with g++, tens of seconds on 2 cores
def test_an_inductor_step_of_a_quantized_dit_with_8bit_kv_equals_the_eager_step() -> None:
    torch._dynamo.reset()
    dit = quantize_linears(tiny_dit(), parse_quant("int8"))  # oneDNN's int8 GEMM as one opaque op in the graph
    text = dit.encode_prompt(prompt(0))
    x = torch.randn(1, 2, TINY_DIT.in_dim, LATENT_H, LATENT_W)
    t = torch.full((1, 2), 750.0)
    spec = KVPoolSpec(TINY_DIT.num_layers, TINY_DIT.num_heads, TINY_DIT.head_dim, TOKENS, WINDOW, kv_dtype="fp8")
    eager_cache, compiled_cache = (KVPool(spec).open_session(s, TOKENS, window_frames=WINDOW) for s in "ec")
    with torch.no_grad():
        expected = dit(x, t, text, eager_cache)
        compile_dit(dit)
        got = dit(x, t, text, compiled_cache)
    # Inductor fuses the per-token activation quantization: a value on a rounding boundary may land
    # one int8 step away, so the flows agree to that step, not bit for bit.
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-3)
