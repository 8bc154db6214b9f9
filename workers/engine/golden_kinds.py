"""The table of golden case kinds: how a case folder is recognised and which checks verify it.

`inferix verify-golden` and the benches that read golden cases ask `kind_of`; none of them tells the
layouts apart by hand. A new family's golden folder adds a row here (before `WAN`, which reads every
folder in the Self Forcing layout).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workers.engine.decoders.taehv_golden import is_taehv_case, verify_taehv_case
from workers.engine.golden import Comparison, GoldenCase, is_magi_case, is_matrixgame_case, verify_case
from workers.engine.magi_golden import verify_magi_case
from workers.engine.matrixgame_golden import verify_matrixgame_case

__all__ = ["KINDS", "GoldenKind", "is_wan_case", "kind_of", "verify"]


@dataclass(frozen=True)
class GoldenKind:
    """One layout of golden folder. `reference_only`: its checks run on the CPU in fp32 only (their
    tolerances were measured there), so another device or dtype skips it."""

    name: str
    recognises: Callable[[GoldenCase], bool]
    verify: Callable[[GoldenCase, float], list[Comparison]]
    reference_only: bool


TAEHV = GoldenKind(
    "TAEHV",
    lambda case: is_taehv_case(case.config),
    lambda case, tol: verify_taehv_case(case.folder, tol, case.device, case.dtype),
    reference_only=False,
)
MAGI = GoldenKind("MAGI-1", is_magi_case, lambda case, _tol: verify_magi_case(case.folder), reference_only=True)
MATRIXGAME = GoldenKind(
    "Matrix-Game 2.0", is_matrixgame_case, lambda case, tol: verify_matrixgame_case(case.folder, tol), True
)
WAN = GoldenKind("Wan (Self Forcing, CausVid, LongLive)", lambda _case: True, verify_case, reference_only=False)
KINDS = (TAEHV, MAGI, MATRIXGAME, WAN)


def kind_of(case: GoldenCase) -> GoldenKind:
    """The first kind that recognises the case (`WAN` takes the rest)."""
    return next(kind for kind in KINDS if kind.recognises(case))


def verify(case: GoldenCase, tolerance: float) -> list[Comparison]:
    return kind_of(case).verify(case, tolerance)


def is_wan_case(case: GoldenCase) -> bool:
    """A Wan text-to-video case (Self Forcing, CausVid, LongLive): the layout `GoldenCase` reads."""
    return kind_of(case) is WAN
