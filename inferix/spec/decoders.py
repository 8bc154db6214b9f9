"""Which decoder turns a model's latents into frames: its own VAE (the default) or TAEHV.

Spelled ``vae`` or ``taehv:PATH`` (a TAEHV weight file, ``.pth`` or ``.safetensors``) in a preset's or
``model.yaml``'s ``decoder:`` key and in ``--decoder`` (`inferix generate`, `inferix serve`,
``python -m workers``). A relative PATH in ``model.yaml`` is inside the model folder; on a command
line it is relative to the working directory. Torch-free: the control plane parses it too.

A session records what it was decoded with (`decoder_identity`, ``SessionSpec.decoder``) so that
every worker that hosts it later decodes alike.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from inferix.errors import UserError

__all__ = ["DEFAULT_DECODER", "DecoderChoice", "decoder_identity", "parse_decoder"]

DEFAULT_DECODER = "vae"
TAEHV = "taehv"
FORMS = "'vae' (the model's own VAE) or 'taehv:PATH' (a TAEHV weight file, .pth or .safetensors)"


@dataclass(frozen=True)
class DecoderChoice:
    """A parsed decoder spelling: ``kind`` "vae" or "taehv", and the TAEHV weight file."""

    kind: str = DEFAULT_DECODER
    path: Path | None = None

    @property
    def is_vae(self) -> bool:
        return self.kind == DEFAULT_DECODER

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def parse_decoder(value: str, where: str, relative_to: Path | None = None) -> DecoderChoice:
    """``value`` as a `DecoderChoice` (`UserError` naming ``where`` if it is neither form).

    ``relative_to``: the folder a relative TAEHV path is in (a model folder); None keeps it as given.
    """
    text = str(value).strip()
    if text == DEFAULT_DECODER:
        return DecoderChoice()
    kind, sep, path = text.partition(":")
    if kind != TAEHV or not sep or not path.strip():
        raise UserError(f"{where}: unknown decoder {text!r}; use {FORMS}")
    file = Path(path.strip()).expanduser()
    if relative_to is not None and not file.is_absolute():
        file = relative_to / file
    return DecoderChoice(TAEHV, file)


def decoder_identity(choice: DecoderChoice) -> str:
    """What a session records as its decoder: "vae", or "taehv:sha256:" and the first 16 hex digits
    of the weight file's SHA-256. The file's content, not its path: workers that mount the same
    weights at other paths agree, and a file replaced under the same path does not."""
    if choice.is_vae or choice.path is None:
        return choice.kind
    digest = hashlib.sha256()
    with choice.path.open("rb") as weights:
        for chunk in iter(lambda: weights.read(1 << 20), b""):
            digest.update(chunk)
    return f"{choice.kind}:sha256:{digest.hexdigest()[:16]}"
