"""Action tracks of action-conditioned models (Matrix-Game 2.0): which keys and mouse values are held
from which frame, read from JSON or CSV, checked against the model's `ActionSchema`, and expanded
to the raw action rows (one per pixel frame) that the sampler reads.

JSON: a list of entries, each holding until the next::

    [{"frame": 0, "keys": ["W"]}, {"block": 2, "keys": ["W", "A"], "mouse": [0, 0.05]}]

CSV: a header line, then one entry per line (`keys` joined by `+` or spaces; a mouse column per
axis of the schema, by name; missing or empty cells are 0)::

    frame,keys,pitch,yaw
    0,W,0,0
    21,W+A,0,0.05

An entry starts at a pixel `frame`, or at the first pixel frame of `block` (a block of nf latent
frames makes 1 + 4(nf - 1) pixel frames first, 4 nf after). Keys are named by their key (`W`) or
their action name (`forward`), case-insensitively; `mouse` lists one value per mouse axis of the
schema, in its order (or maps axis names to values). Before the first entry, and where an entry
gives none, actions are neutral: no key (a one-hot schema's no-op key) and a still mouse. Entries
past the end of the video are unused.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix.spec.action_schema import ActionSchema

__all__ = [
    "ActionEntry",
    "ActionRows",
    "ActionTrack",
    "HeldAction",
    "block_start_frame",
    "parse_action_track",
    "parse_held_action",
]

_ENTRY_FIELDS = ("frame", "block", "keys", "mouse")


@dataclass(frozen=True)
class ActionEntry:
    """Keys (schema indices) and mouse values (one per schema axis) held from `frame` or `block` on."""

    where: str  # "entry 3" / "line 4": how errors name it
    frame: int | None
    block: int | None
    keys: tuple[int, ...]
    mouse: tuple[float, ...]

    def start(self, frames_per_block: int, ratio: int) -> int:
        return self.frame if self.frame is not None else block_start_frame(self.block or 0, frames_per_block, ratio)


@dataclass(frozen=True)
class ActionRows:
    """Raw rows, one per pixel frame: keyboard [rows][keys] (0/1) and mouse [rows][mouse_columns]
    (None: the schema has no mouse)."""

    keyboard: list[list[float]]
    mouse: list[list[float]] | None


def block_start_frame(block: int, frames_per_block: int, ratio: int) -> int:
    """The first pixel frame of `block`: block 0 decodes to 1 + ratio (nf - 1) frames, later ones ratio nf."""
    return 0 if block == 0 else ratio * frames_per_block * block - (ratio - 1)


def _neutral_keys(schema: ActionSchema) -> tuple[int, ...] | None:
    """No key held: nothing, or a one-hot schema's no-op key (None: it has none)."""
    if not schema.one_hot:
        return ()
    return next(((i,) for i, key in enumerate(schema.keys) if key.key is None), None)


@dataclass(frozen=True)
class ActionTrack:
    """A validated track; `origin` names it in errors (e.g. "--actions moves.json")."""

    origin: str
    entries: tuple[ActionEntry, ...] = ()

    def rows(self, schema: ActionSchema, num_rows: int, frames_per_block: int, ratio: int) -> ActionRows:
        """The raw rows of a `num_rows`-pixel-frame video: each entry fills its frames up to the next."""
        starts = [entry.start(frames_per_block, ratio) for entry in self.entries]
        for previous, entry, start, before in zip(self.entries, self.entries[1:], starts[1:], starts, strict=False):
            if start <= before:
                raise UserError(
                    f"{self.origin} {entry.where}: frame: starts at pixel frame {start}, not after "
                    f"{previous.where} (frame {before}); entries must be in order"
                )
        neutral = _neutral_keys(schema) or ()
        keyboard = [[0.0] * schema.keyboard_dim for _ in range(num_rows)]
        mouse = [[0.0] * schema.mouse_columns for _ in range(num_rows)] if schema.mouse_columns else None
        spans: list[tuple[int, int, tuple[int, ...], tuple[float, ...]]] = [
            (0, starts[0] if starts else num_rows, neutral, ())
        ]
        ends = starts[1:] + [num_rows] if starts else []
        spans += [(s, e, entry.keys, entry.mouse) for entry, s, e in zip(self.entries, starts, ends, strict=True)]
        for first, end, keys, moves in spans:
            for row in range(first, min(end, num_rows)):
                for key in keys:
                    keyboard[row][key] = 1.0
                if mouse is not None:
                    for axis, value in zip(schema.mouse, moves, strict=False):
                        mouse[row][axis.column] = value
        return ActionRows(keyboard, mouse)


@dataclass(frozen=True)
class HeldAction:
    """Keys (schema indices) and mouse values (one per schema axis) held live, e.g. during a block
    of a served session; no keys and a still mouse when built from nothing."""

    keys: tuple[int, ...]
    mouse: tuple[float, ...]

    def key_names(self, schema: ActionSchema) -> list[str]:
        """The keys as a client names them (the key, else the action name)."""
        return [schema.keys[i].key or schema.keys[i].name for i in self.keys]

    def keyboard_row(self, schema: ActionSchema) -> list[float]:
        """One raw keyboard row (0/1 per key), as a track's row of the same entry."""
        return [1.0 if i in self.keys else 0.0 for i in range(schema.keyboard_dim)]

    def mouse_row(self, schema: ActionSchema) -> list[float] | None:
        """One raw mouse row (None: the schema has no mouse), as a track's row of the same entry."""
        if not schema.mouse_columns:
            return None
        row = [0.0] * schema.mouse_columns
        for axis, value in zip(schema.mouse, self.mouse, strict=False):
            row[axis.column] = value
        return row


def parse_held_action(schema: ActionSchema, keys: list[str], mouse: list[float], where: str) -> HeldAction:
    """Keys by name and mouse values in the schema's axis order (empty: still), checked as a track
    entry is (one-line `UserError`s naming `where` and the field)."""
    if mouse and len(mouse) != len(schema.mouse):
        if not schema.mouse:
            raise UserError(f"{where}: mouse: this model takes no mouse input (keys only)")
        axes = ", ".join(a.name for a in schema.mouse)
        raise UserError(f"{where}: mouse: expected {len(schema.mouse)} value(s) ({axes}), got {len(mouse)}")
    moves = {axis.name: value for axis, value in zip(schema.mouse, mouse, strict=False)}
    return HeldAction(_keys(schema, list(keys), where), _mouse(schema, moves, where))


def _schema_keys(schema: ActionSchema) -> str:
    return ", ".join(k.key or k.name for k in schema.keys)


def _key_index(schema: ActionSchema, name: str, where: str) -> int:
    wanted = name.strip().casefold()
    for i, key in enumerate(schema.keys):
        if wanted in {key.name.casefold(), (key.key or "").casefold()}:
            return i
    raise UserError(f"{where}: keys: unknown key {name!r} (this model takes {_schema_keys(schema)})")


def _keys(schema: ActionSchema, names: list[str], where: str) -> tuple[int, ...]:
    indices = tuple(sorted({_key_index(schema, name, where) for name in names}))
    if not schema.one_hot:
        return indices
    if not indices:
        neutral = _neutral_keys(schema)
        if neutral is None:
            raise UserError(f"{where}: keys: this model takes exactly one key per entry ({_schema_keys(schema)})")
        return neutral
    if len(indices) > 1:
        raise UserError(f"{where}: keys: this model takes one key at a time (one-hot), got {', '.join(names)}")
    return indices


def _number(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserError(f"{where}: {field}: expected a number, got {value!r}")
    try:
        number = float(value) if value != "" else 0.0
    except ValueError:
        raise UserError(f"{where}: {field}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UserError(f"{where}: {field}: expected a finite number, got {value!r}")
    return number


def _mouse(schema: ActionSchema, values: dict[str, Any], where: str) -> tuple[float, ...]:
    """One value per schema axis from {axis name: value}, each within the axis's range."""
    if values and not schema.mouse:
        raise UserError(f"{where}: mouse: this model takes no mouse input (keys only)")
    names = {axis.name for axis in schema.mouse}
    unknown = sorted(set(values) - names)
    if unknown:
        raise UserError(f"{where}: mouse: unknown axis {unknown[0]!r} (this model's axes: {', '.join(sorted(names))})")
    moves = []
    for axis in schema.mouse:
        value = _number(values.get(axis.name, 0.0), where, f"mouse {axis.name}")
        if not axis.minimum <= value <= axis.maximum:
            raise UserError(f"{where}: mouse {axis.name}: {value} is outside [{axis.minimum}, {axis.maximum}]")
        moves.append(value)
    return tuple(moves)


def _position(value: Any, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise UserError(f"{where}: {field}: expected a whole number >= 0, got {value!r}")
    return int(value)


def _entry(schema: ActionSchema, where: str, data: dict[str, Any]) -> ActionEntry:
    unknown = [name for name in data if name not in _ENTRY_FIELDS]
    if unknown:
        raise UserError(f"{where}: {unknown[0]}: unknown field (an entry has frame or block, keys, mouse)")
    if ("frame" in data) == ("block" in data):
        raise UserError(f"{where}: frame: give exactly one of frame or block")
    frame = _position(data["frame"], where, "frame") if "frame" in data else None
    block = _position(data["block"], where, "block") if "block" in data else None
    names = data.get("keys", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{where}: keys: expected a list of key names, got {names!r}")
    moves = data.get("mouse", {})
    if isinstance(moves, list):
        if len(moves) != len(schema.mouse):
            axes = ", ".join(a.name for a in schema.mouse) or "none"
            raise UserError(f"{where}: mouse: expected {len(schema.mouse)} value(s) ({axes}), got {len(moves)}")
        moves = {axis.name: value for axis, value in zip(schema.mouse, moves, strict=True)}
    if not isinstance(moves, dict):
        raise UserError(f"{where}: mouse: expected a list of numbers or an object of axis values, got {moves!r}")
    return ActionEntry(where, frame, block, _keys(schema, names, where), _mouse(schema, moves, where))


def _from_json(text: str, schema: ActionSchema, origin: str) -> tuple[ActionEntry, ...]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin}: not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise UserError(f'{origin}: expected a JSON list of entries like {{"frame": 0, "keys": ["W"]}}')
    entries = []
    for index, item in enumerate(data):
        where = f"{origin} entry {index}"
        if not isinstance(item, dict):
            raise UserError(f'{where}: expected an object like {{"frame": 0, "keys": ["W"]}}, got {item!r}')
        entries.append(_entry(schema, where, item))
    return tuple(entries)


def _from_csv(text: str, schema: ActionSchema, origin: str) -> tuple[ActionEntry, ...]:
    cells_of = [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(text))]
    numbered = [(n, row) for n, row in enumerate(cells_of, start=1) if any(row)]
    if not numbered:
        raise UserError(f"{origin}: empty; the first line is the header, e.g. frame,keys,pitch,yaw")
    header_line, header = numbered[0]
    axes = [axis.name for axis in schema.mouse]
    for column in header:
        if column not in ("frame", "block", "keys", *axes):
            expected = ", ".join(["frame or block", "keys", *axes])
            raise UserError(f"{origin} line {header_line}: {column or '(empty)'}: unknown column (expected {expected})")
    entries = []
    for number, row in numbered[1:]:
        where = f"{origin} line {number}"
        if len(row) != len(header):
            raise UserError(f"{where}: has {len(row)} cells, the header {len(header)}")
        cells = dict(zip(header, row, strict=True))
        item: dict[str, Any] = {k: v for k, v in cells.items() if k in ("frame", "block")}
        item["keys"] = cells.get("keys", "").replace("+", " ").split()
        item["mouse"] = {axis: cells[axis] for axis in axes if axis in cells}
        entries.append(_entry(schema, where, item))
    return tuple(entries)


def parse_action_track(path: Path, schema: ActionSchema, origin: str | None = None) -> ActionTrack:
    """A track from a .json or .csv file, every entry checked against `schema` (one-line `UserError`s)."""
    origin = origin or str(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise UserError(f"{origin}: an action track is a .json or .csv file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{origin}: cannot read it: {exc}") from None
    parse = _from_json if suffix == ".json" else _from_csv
    return ActionTrack(origin, parse(text, schema, origin))
