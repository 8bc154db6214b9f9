"""A MAGI-1 model folder in the released layout, made from a golden case's tiny weights.

The golden T5 ran on a toy tokenizer (one id per whitespace word: 3 + crc32(word) % (vocab - 3));
`tokenizer.json` here is that mapping as a word-level tokenizer over the words the tests use, so the
front door reproduces the reference's `text_ids` from the prompt text.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.families.magi.clean_caption import clean_prompt
from tests.conftest import GOLDEN_DIR

SECOND_PROMPT = "a blue whale sings under the ice at night"


def write_toy_tokenizer(folder: Path, vocab_size: int, texts: list[str]) -> None:
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for text in texts:
        for word in clean_prompt(text).split():
            vocab.setdefault(word, 3 + zlib.crc32(word.encode()) % (vocab_size - 3))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))


def make_magi_folder(case: str, root: Path, preset: str | None = None) -> Path:
    """`root` laid out as a released MAGI-1 model folder holding the golden case's weights, described
    by the reference's run config, or by a model.yaml naming `preset` (what the mesh serves)."""
    golden = GOLDEN_DIR / case
    config = json.loads((golden / "config.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    if preset is None:
        (root / "magi_config.json").write_text(json.dumps(config["magi_config"]))
    else:
        (root / "model.yaml").write_text(f"preset: {preset}\n")
    weights = root / (
        "inference_weight.distill" if config["magi_config"]["engine_config"]["distill"] else "inference_weight"
    )
    weights.mkdir()
    shutil.copy(golden / "dit.safetensors", weights / "model.safetensors")
    t5 = root / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps(config["t5_config"]))
    shutil.copy(golden / "t5.safetensors", t5 / "model.safetensors")
    write_toy_tokenizer(t5, config["t5_config"]["vocab_size"], [config["prompt"], SECOND_PROMPT])
    vae = root / "vae"
    vae.mkdir()
    (vae / "config.json").write_text(json.dumps(config["vae_config"]))
    shutil.copy(golden / "vae.safetensors", vae / "diffusion_pytorch_model.safetensors")
    shutil.copy(golden / "special_tokens.npz", root / "special_tokens.npz")
    return root


@pytest.fixture(scope="module")
def magi_distill(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_magi_folder("magi1_tiny_distill", tmp_path_factory.mktemp("magi") / "distill")


@pytest.fixture(scope="module")
def magi_cfg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_magi_folder("magi1_tiny_cfg", tmp_path_factory.mktemp("magi") / "cfg")
