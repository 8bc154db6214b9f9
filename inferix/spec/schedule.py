"""A session's prompt schedule: which prompt applies from which block, and its one validation.

Shared by the SDK, the CLI, the scheduler and the engine, so that a schedule accepted (or refused,
with the same message) in one place is accepted (or refused) everywhere. Errors name the field.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from inferix.errors import UserError

MAX_PROMPT_BYTES = 2048
MAX_PROMPT_CHANGES = 64

_PROMPT_AT = re.compile(r"^(\d+):(.*)$", re.DOTALL)


@dataclass(frozen=True)
class PromptChange:
    """`text` applies from block `at_block` on; `recache` re-encodes the cached frames under it."""

    at_block: int
    text: str
    recache: bool = False


def check_prompt_text(text: str, field: str) -> str:
    """`text` if it can be a prompt; a `UserError` naming `field` otherwise."""
    if not text.strip():
        raise UserError(f"{field}: the prompt is empty; describe what the video should show")
    size = len(text.encode("utf-8"))
    if size > MAX_PROMPT_BYTES:
        raise UserError(f"{field}: the prompt is {size} bytes; the limit is {MAX_PROMPT_BYTES} bytes")
    if "\x00" in text:
        raise UserError(f"{field}: the prompt contains a NUL character")
    return text


def validate_schedule(
    changes: Sequence[PromptChange], num_blocks: int | None = None, field: str = "prompts"
) -> list[PromptChange]:
    """The schedule, checked: at least one entry, the first at block 0, blocks strictly increasing
    (and below `num_blocks` when the session has a length), every text a valid prompt."""
    if not changes:
        raise UserError(f"{field}: at least one prompt is required (at_block 0)")
    if len(changes) > MAX_PROMPT_CHANGES:
        raise UserError(f"{field}: {len(changes)} entries; the limit is {MAX_PROMPT_CHANGES}")
    previous = -1
    for i, change in enumerate(changes):
        where = f"{field}[{i}]"
        if i == 0 and change.at_block != 0:
            raise UserError(f"{where}.at_block: the first prompt must apply at block 0, got {change.at_block}")
        if change.at_block <= previous:
            raise UserError(f"{where}.at_block: must be greater than {previous} (strictly increasing)")
        if num_blocks is not None and change.at_block >= num_blocks:
            raise UserError(f"{where}.at_block: block {change.at_block} is past the last block ({num_blocks - 1})")
        check_prompt_text(change.text, f"{where}.text")
        previous = change.at_block
    return list(changes)


def parse_prompt_schedule(
    first: str, changes: Sequence[str], recache: bool = False, num_blocks: int | None = None
) -> list[PromptChange]:
    """The schedule of a command line: `first` from block 0 and `--prompt-at N:"text"` entries (any order)."""
    schedule = [PromptChange(0, first)]
    for item in changes:
        match = _PROMPT_AT.match(item)
        if match is None:
            raise UserError(f'--prompt-at must look like 4:"the ball turns green", got {item!r}')
        schedule.append(PromptChange(int(match.group(1)), match.group(2).strip().strip('"'), recache))
    return validate_schedule(sorted(schedule, key=lambda c: c.at_block), num_blocks, field="prompts")
