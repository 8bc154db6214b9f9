"""The families' capabilities and the one check every front door calls (generate, the worker, load_engine)."""

from __future__ import annotations

import pytest

from engine.capabilities import MAGI, MATRIXGAME, WAN, Capabilities, EngineRequest, check, refusal
from engine.families.magi.engine import MagiEngine
from engine.families.matrixgame.engine import MatrixGameEngine
from engine.families.wan.engine import WanEngine
from engine.registry import family_capabilities
from inferix.errors import UserError


def test_every_engine_declares_its_family() -> None:
    assert (WanEngine.capabilities, MagiEngine.capabilities, MatrixGameEngine.capabilities) == (WAN, MAGI, MATRIXGAME)
    assert family_capabilities(None) is WAN and family_capabilities("toyworld-play") is WAN
    assert family_capabilities("matrixgame2-tiny") is MATRIXGAME


@pytest.mark.parametrize(
    "request_",
    [
        EngineRequest(quant="int8", kv_dtype="fp8", decoder="taehv:/w/taew2_1.pth"),
        EngineRequest(pod=True),
        EngineRequest(compile=True),
        EngineRequest(cuda_graphs=True),
    ],
)
def test_wan_models_do_all_of_it(request_: EngineRequest) -> None:
    assert refusal(WAN, request_) is None


@pytest.mark.parametrize(
    ("caps", "request_", "message"),
    [
        (MAGI, EngineRequest(quant="int8"), "--quant int8: MAGI-1 runs unquantized for now"),
        (MATRIXGAME, EngineRequest(kv_dtype="int8"), "--kv-dtype is not supported for Matrix-Game 2.0 yet"),
        (MAGI, EngineRequest(decoder="taehv:x.pth"), "--decoder taehv:x.pth: MAGI-1 decodes with its own VAE"),
        (MATRIXGAME, EngineRequest(pod=True), "Matrix-Game 2.0 does not run as a sequence-parallel pod"),
        (MAGI, EngineRequest(compile=True), "--compile: MAGI-1 runs eagerly"),
        (MATRIXGAME, EngineRequest(cuda_graphs=True), "--cuda-graphs: Matrix-Game 2.0 runs eagerly"),
        (WAN, EngineRequest(compile=True, cuda_graphs=True), "--cuda-graphs: Wan-family models without --compile"),
        (WAN, EngineRequest(pod=True, compile=True), "--compile: a sequence-parallel pod runs its DiT eagerly"),
        (WAN, EngineRequest(pod=True, kv_dtype="fp8"), "--kv-dtype fp8: a sequence-parallel pod keeps its KV"),
    ],
)
def test_what_a_family_cannot_do_is_one_line(caps: Capabilities, request_: EngineRequest, message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        check(caps, request_)
    assert "\n" not in str(info.value)
