"""A tiny LongLive model folder as LongLive publishes one: a base generator checkpoint plus a peft LoRA
adapter, for the shipped `longlive-tiny` preset (the architecture of the golden case `longlive_tiny`).

The adapter is random (rank 4, alpha 8) and the base checkpoint is the golden DiT minus the adapter's
update, so the merged DiT is the golden one to fp32 rounding: the folder reproduces the golden
vectors only if the adapter is read and merged as peft defines it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

GOLDEN_CASE = Path(__file__).resolve().parents[2] / "golden" / "longlive_tiny"
RANK, ALPHA = 4, 8.0  # as the longlive-tiny preset says
# Every nn.Linear of an attention block, as LongLive's configure_lora_for_model targets them.
TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
           "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")  # fmt: skip


def random_adapter(dit_state: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """A peft-layout adapter state dict (`base_model.model.<module>.lora_{A,B}.weight`)."""
    generator = torch.Generator().manual_seed(seed)
    adapter = {}
    layers = sorted({int(k.split(".")[1]) for k in dit_state if k.startswith("blocks.")})
    for layer in layers:
        for target in TARGETS:
            out_dim, in_dim = dit_state[f"blocks.{layer}.{target}.weight"].shape
            prefix = f"base_model.model.blocks.{layer}.{target}"
            adapter[f"{prefix}.lora_A.weight"] = torch.randn(RANK, in_dim, generator=generator) * in_dim**-0.5
            adapter[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, RANK, generator=generator) * 0.05
    return adapter


def write_longlive_folder(folder: Path) -> Path:
    """The folder (model.yaml, longlive_base.pt, models/lora.pt, a word-level tokenizer); prompts are
    words 'w3'..'w149' of the golden case's vocabulary."""
    config = json.loads((GOLDEN_CASE / "config.json").read_text())
    golden = load_file(str(GOLDEN_CASE / "dit.safetensors"))
    adapter = random_adapter(golden)
    base = dict(golden)
    for key, a in adapter.items():
        if key.endswith("lora_A.weight"):
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            b = adapter[key.replace("lora_A", "lora_B")]
            base[f"{module}.weight"] = golden[f"{module}.weight"] - (ALPHA / RANK) * (b @ a)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    torch.save({"generator": {f"model.{k}": v for k, v in base.items()}}, folder / "longlive_tiny_base.pt")
    torch.save({"generator_lora": adapter}, folder / "models" / "lora.pt")
    vocab_size = config["text_encoder"]["vocab_size"]
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer").mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer" / "tokenizer.json"))
    files = {"vae": str(GOLDEN_CASE / "vae.safetensors"), "text_encoder": str(GOLDEN_CASE / "text.safetensors")}
    (folder / "model.yaml").write_text(yaml.safe_dump({"preset": "longlive-tiny", "files": files}))
    return folder
