"""What an action-conditioned model takes from its player, as data: its keys and mouse axes.

The action schema says what a client may send per pixel frame: which keys (one column each of the
model's keyboard input, 0/1), whether several may be held at once, and the mouse axes (columns of
its mouse input) with their range. Matrix-Game 2.0's variants and the toyworld-play model publish
one (in their presets); it comes with every session of such a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ActionKey", "ActionSchema", "MouseAxis"]


@dataclass(frozen=True)
class ActionKey:
    """One keyboard column: what it does and the key that drives it in the reference demo (None: no key)."""

    name: str
    key: str | None


@dataclass(frozen=True)
class MouseAxis:
    """One mouse column and the range of its per-frame value (camera rotation step)."""

    name: str
    column: int
    minimum: float
    maximum: float

    def __post_init__(self) -> None:
        if self.minimum > self.maximum:
            raise ValueError(f"mouse axis {self.name!r}: minimum {self.minimum} > maximum {self.maximum}")


@dataclass(frozen=True)
class ActionSchema:
    """The actions of one variant. `one_hot`: exactly one key per frame (templerun's first key is
    the no-op); else any subset. `mouse_columns` is the width of `mouse_cond` (0: no mouse input)."""

    keys: tuple[ActionKey, ...]
    mouse: tuple[MouseAxis, ...] = ()
    mouse_columns: int = 0
    one_hot: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("an action schema needs at least one key")
        if any(not 0 <= axis.column < self.mouse_columns for axis in self.mouse):
            raise ValueError(f"mouse axes must use columns below mouse_columns={self.mouse_columns}")

    @property
    def keyboard_dim(self) -> int:
        return len(self.keys)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ActionSchema:
        return cls(
            keys=tuple(ActionKey(**k) for k in data["keys"]),
            mouse=tuple(MouseAxis(**m) for m in data.get("mouse", ())),
            mouse_columns=int(data.get("mouse_columns", 0)),
            one_hot=bool(data.get("one_hot", False)),
        )
