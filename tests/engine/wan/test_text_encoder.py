"""UMT5 text encoder: golden parity with the reference, checkpoint loading, tokenizer, prompt cache."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from pathlib import Path

import pytest
import sentencepiece
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from engine.families.wan.text_encoder import PromptEncoder, UMT5Encoder, _clamp_fp16, relative_position_buckets
from engine.families.wan.tokenizer import PromptTokenizer, clean_prompt
from inferix.errors import CheckpointError, UserError
from inferix.spec.architectures import UMT5Config

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
GOLDEN_CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "text.safetensors").is_file())
# The README promises ~1e-5 agreement in fp32 against the reference.
TOLERANCE = 1e-5

SENTENCES = [
    "a red fox runs through the snowy forest at dawn",
    "the camera pans slowly over a quiet mountain lake",
    "waves crash against black rocks under a stormy sky",
    "a small robot walks down a neon lit city street at night",
    "golden light falls on a field of tall grass and wild flowers",
    "two birds fly above the river while the sun sets behind hills",
]


def _golden_config(case: str) -> UMT5Config:
    return UMT5Config.from_dict(json.loads((GOLDEN / case / "config.json").read_text())["text_encoder"])


def _golden_encoder(case: str) -> UMT5Encoder:
    encoder = UMT5Encoder(_golden_config(case))
    encoder.load_state_dict(load_file(GOLDEN / case / "text.safetensors"), strict=True)
    return encoder.eval()


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape and a.dtype == b.dtype
    return (a - b).abs().max().item()


def _train_sentencepiece(directory: Path, *, pad_id: int = 0) -> Path:
    """A 64-piece unigram model with T5's special ids (pad 0, eos 1, unk 2, no bos) as spiece.model."""
    directory.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 4),
        model_writer=model,
        vocab_size=64,
        model_type="unigram",
        pad_id=pad_id,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    (directory / "spiece.model").write_bytes(model.getvalue())
    return directory


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_sentencepiece(tmp_path_factory.mktemp("umt5_tokenizer"))


@pytest.fixture(scope="module")
def spm(spm_dir: Path) -> sentencepiece.SentencePieceProcessor:
    return sentencepiece.SentencePieceProcessor(model_file=str(spm_dir / "spiece.model"))


def _write_tokenizer_json(directory: Path) -> Path:
    """A word-level tokenizer.json shaped like umt5's: EOS post-processor, stored truncation/padding."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "red": 4, "fox": 5, "runs": 6}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer.enable_truncation(max_length=2)
    tokenizer.enable_padding(length=20, pad_id=0, pad_token="<pad>")
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


# ---------------------------------------------------------------- golden parity


@pytest.mark.parametrize("case", GOLDEN_CASES)
@torch.no_grad()
def test_golden_text_case(case: str) -> None:
    encoder = _golden_encoder(case)
    golden = load_file(GOLDEN / case / "text_case.safetensors")
    ids, mask = golden["text_ids"], golden["text_mask"]

    assert _max_diff(encoder(ids, mask), golden["text_embeds_unzeroed"]) <= TOLERANCE
    embeds = encoder.prompt_embeds(ids, mask)
    assert _max_diff(embeds, golden["text_embeds"]) <= TOLERANCE
    for row, length in enumerate(mask.sum(dim=1).tolist()):
        assert torch.all(embeds[row, length:] == 0)


@pytest.mark.parametrize("case", GOLDEN_CASES)
@torch.no_grad()
def test_golden_pipeline_prompt(case: str) -> None:
    encoder = _golden_encoder(case)
    inputs = load_file(GOLDEN / case / "inputs.safetensors")
    embeds = encoder.prompt_embeds(inputs["text_ids"], inputs["text_mask"])
    assert _max_diff(embeds, inputs["prompt_embeds"]) <= TOLERANCE


def test_golden_cases_exist() -> None:
    assert GOLDEN_CASES, f"no golden text encoder vectors under {GOLDEN}"


# ---------------------------------------------------------------- model structure and config


def test_umt5_xxl_layout_matches_released_checkpoint() -> None:
    """Names and shapes of models_t5_umt5-xxl-enc-bf16.pth, checked without the 11 GB file."""
    config = UMT5Config()
    with torch.device("meta"):
        state = UMT5Encoder(config).state_dict()
    per_block = {
        "norm1.weight": (4096,),
        "attn.q.weight": (4096, 4096),
        "attn.k.weight": (4096, 4096),
        "attn.v.weight": (4096, 4096),
        "attn.o.weight": (4096, 4096),
        "norm2.weight": (4096,),
        "ffn.gate.0.weight": (10240, 4096),
        "ffn.fc1.weight": (10240, 4096),
        "ffn.fc2.weight": (4096, 10240),
        "pos_embedding.embedding.weight": (32, 64),
    }
    expected = {"token_embedding.weight": (256384, 4096), "norm.weight": (4096,)}
    expected |= {f"blocks.{i}.{name}": shape for i in range(24) for name, shape in per_block.items()}
    assert {name: tuple(t.shape) for name, t in state.items()} == expected


def test_config_from_golden_section() -> None:
    section = json.loads((GOLDEN / GOLDEN_CASES[0] / "config.json").read_text())["text_encoder"]
    config = UMT5Config.from_dict(section)
    assert config.num_layers == section["encoder_layers"]
    assert (config.vocab_size, config.dim, config.text_len) == (
        section["vocab_size"],
        section["dim"],
        section["text_len"],
    )


def test_config_rejects_bad_values() -> None:
    with pytest.raises(UserError, match="unknown key 'num_layer'"):
        UMT5Config.from_dict({"num_layer": 2})
    with pytest.raises(UserError, match="divisible"):
        UMT5Config(dim_attn=100, num_heads=64)
    with pytest.raises(UserError, match="shared_pos"):
        UMT5Config(shared_pos=True)
    with pytest.raises(UserError, match="num_buckets"):
        UMT5Config(num_buckets=7)
    with pytest.raises(UserError, match="max_dist"):
        UMT5Config(max_dist=8)


def test_relative_position_buckets_hand_values() -> None:
    """32 buckets / max_dist 128: 16 per direction, distances 0..7 exact, then log-spaced, capped at 15."""
    buckets = relative_position_buckets(256, 32, 128, torch.device("cpu"))
    query = 128
    expected = {0: 0, -1: 1, -7: 7, -8: 8, -12: 9, -127: 15, 1: 17, 7: 23, 8: 24, 12: 25, 127: 31}
    for offset, bucket in expected.items():
        assert buckets[query, query + offset].item() == bucket, offset


def test_fp16_overflow_is_clamped_only_when_inf_present() -> None:
    big = torch.tensor([65000.0, -1.0], dtype=torch.float16)
    assert torch.equal(_clamp_fp16(big), big)
    clamped = _clamp_fp16(torch.tensor([float("inf"), float("-inf"), 65000.0], dtype=torch.float16))
    limit = torch.finfo(torch.float16).max - 1000  # 64504, which fp16 stores as 64512
    assert torch.equal(clamped, torch.tensor([limit, -limit, limit], dtype=torch.float16))


def test_forward_rejects_mismatched_shapes() -> None:
    encoder = _golden_encoder(GOLDEN_CASES[0])
    with pytest.raises(ValueError, match="batch, length"):
        encoder(torch.zeros(2, 5, dtype=torch.int64), torch.ones(2, 4, dtype=torch.int64))


# ---------------------------------------------------------------- checkpoint loading


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
@torch.no_grad()
def test_from_checkpoint_loads_reference_files(tmp_path: Path, suffix: str) -> None:
    case = GOLDEN_CASES[0]
    path = GOLDEN / case / "text.safetensors"
    if suffix == ".pth":  # the released umt5 checkpoint is a torch.save'd flat state dict
        path = tmp_path / "models_t5_umt5-xxl-enc.pth"
        torch.save(load_file(GOLDEN / case / "text.safetensors"), path)
    encoder = UMT5Encoder.from_checkpoint(path, _golden_config(case), dtype=torch.float32)
    assert not encoder.training
    assert not any(p.requires_grad for p in encoder.parameters())
    golden = load_file(GOLDEN / case / "text_case.safetensors")
    embeds = encoder.prompt_embeds(golden["text_ids"], golden["text_mask"])
    assert _max_diff(embeds, golden["text_embeds"]) <= TOLERANCE


def test_from_checkpoint_casts_to_requested_dtype() -> None:
    case = GOLDEN_CASES[0]
    encoder = UMT5Encoder.from_checkpoint(GOLDEN / case / "text.safetensors", _golden_config(case))
    assert {p.dtype for p in encoder.parameters()} == {torch.bfloat16}


def test_from_checkpoint_errors(tmp_path: Path) -> None:
    case = GOLDEN_CASES[0]
    config = _golden_config(case)
    state = load_file(GOLDEN / case / "text.safetensors")

    with pytest.raises(CheckpointError, match="does not exist"):
        UMT5Encoder.from_checkpoint(tmp_path / "absent.pth", config)

    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        UMT5Encoder.from_checkpoint(garbage, config)

    partial = tmp_path / "partial.pth"
    torch.save({k: v for k, v in state.items() if k != "norm.weight"}, partial)
    with pytest.raises(CheckpointError, match=r"missing keys \['norm.weight'\]"):
        UMT5Encoder.from_checkpoint(partial, config)

    nested = tmp_path / "nested.pth"
    torch.save({"model": state}, nested)
    with pytest.raises(CheckpointError, match="flat state dict"):
        UMT5Encoder.from_checkpoint(nested, config)

    wider = dataclasses.replace(config, dim_ffn=config.dim_ffn * 2)
    with pytest.raises(CheckpointError, match="ffn.fc1.weight"):
        UMT5Encoder.from_checkpoint(GOLDEN / case / "text.safetensors", wider)


# ---------------------------------------------------------------- tokenizer


def test_clean_prompt_matches_reference_whitespace_mode() -> None:
    assert clean_prompt("  a\tred \n\n fox\u3000runs  ") == "a red fox runs"
    assert clean_prompt("rock &amp;amp; roll &lt;3") == "rock & roll <3"
    assert clean_prompt("caf\u00c3\u00a9 at dawn") == "café at dawn"  # ftfy repairs the mojibake


def test_sentencepiece_tokenizer_eos_padding_mask(spm_dir: Path, spm: sentencepiece.SentencePieceProcessor) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=40)
    prompts = ["a red fox runs", "  waves   crash\n"]
    ids, mask = tokenizer(prompts)
    assert ids.shape == mask.shape == (2, 40)
    assert ids.dtype == mask.dtype == torch.int64
    for row, prompt in enumerate(prompts):
        tokens = [*spm.encode(clean_prompt(prompt)), spm.eos_id()]
        assert ids[row].tolist() == tokens + [spm.pad_id()] * (40 - len(tokens))
        assert mask[row].tolist() == [1] * len(tokens) + [0] * (40 - len(tokens))
    assert tokenizer.vocab_size == 64


def test_tokenizer_applies_cleaning(spm_dir: Path) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=24)
    raw_ids, _ = tokenizer(["  a red\t\tfox &amp;amp;  snow "])
    clean_ids, _ = tokenizer(["a red fox & snow"])
    assert torch.equal(raw_ids, clean_ids)


def test_tokenizer_truncation_keeps_eos(
    spm_dir: Path, spm: sentencepiece.SentencePieceProcessor, caplog: pytest.LogCaptureFixture
) -> None:
    prompt = SENTENCES[0]
    tokens = spm.encode(prompt)
    exact = PromptTokenizer(spm_dir, text_len=len(tokens) + 1)
    with caplog.at_level(logging.WARNING):
        ids, mask = exact([prompt])
    assert ids[0].tolist() == [*tokens, spm.eos_id()] and mask.all()
    assert "truncated" not in caplog.text

    short = PromptTokenizer(spm_dir, text_len=6)
    with caplog.at_level(logging.WARNING):
        ids, mask = short([prompt])
    assert ids[0].tolist() == [*tokens[:5], spm.eos_id()] and mask.all()
    assert "truncated" in caplog.text


def test_tokenizer_json_is_preferred_and_gets_one_eos(spm_dir: Path, tmp_path: Path) -> None:
    directory = _write_tokenizer_json(tmp_path / "fast")
    (directory / "spiece.model").write_bytes((spm_dir / "spiece.model").read_bytes())
    ids, mask = PromptTokenizer(directory, text_len=8)(["a red  fox runs", "fox wolf"])
    # The file's post-processor EOS, truncation (2) and padding (20) must not apply.
    assert ids.tolist() == [[3, 4, 5, 6, 1, 0, 0, 0], [5, 2, 1, 0, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]]


def test_tokenizer_directory_errors(tmp_path: Path) -> None:
    absent = tmp_path / "umt5-xxl"
    with pytest.raises(UserError, match="tokenizer.json or spiece.model") as info:
        PromptTokenizer(absent)
    assert str(absent) in str(info.value)

    absent.mkdir()
    with pytest.raises(UserError, match="neither tokenizer.json nor spiece.model") as info:
        PromptTokenizer(absent)
    assert str(absent) in str(info.value)

    (absent / "spiece.model").write_bytes(b"\x00garbage")
    with pytest.raises(UserError, match="cannot read sentencepiece model"):
        PromptTokenizer(absent)

    (absent / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read tokenizer file"):
        PromptTokenizer(absent)

    with pytest.raises(UserError, match="text_len"):
        PromptTokenizer(absent, text_len=0)


def test_tokenizer_without_pad_token_is_rejected(tmp_path: Path) -> None:
    directory = _train_sentencepiece(tmp_path / "nopad", pad_id=-1)
    with pytest.raises(UserError, match="no <pad> token"):
        PromptTokenizer(directory)


def test_tokenizer_bad_prompts(spm_dir: Path) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=16)
    with pytest.raises(UserError, match="empty"):
        tokenizer(["a red fox", " \n\t "])
    with pytest.raises(UserError, match="no prompts"):
        tokenizer([])
    with pytest.raises(TypeError, match="single string"):
        tokenizer("a red fox")


# ---------------------------------------------------------------- prompt encoder


def _tiny_encoder(text_len: int = 16, vocab_size: int = 64) -> UMT5Encoder:
    torch.manual_seed(0)
    config = UMT5Config(
        vocab_size=vocab_size,
        dim=16,
        dim_attn=16,
        dim_ffn=32,
        num_heads=2,
        num_layers=2,
        num_buckets=8,
        text_len=text_len,
    )
    return UMT5Encoder(config).eval()


@torch.no_grad()
def test_prompt_encoder_matches_direct_encoding_and_caches(spm_dir: Path) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=16)
    encoder = _tiny_encoder()
    prompts = PromptEncoder(tokenizer, encoder, cache_size=2)

    embeds = prompts.encode(["a red fox", "waves crash", "a red fox"])
    assert embeds.shape == (3, 16, 16)
    assert torch.equal(embeds, encoder.prompt_embeds(*tokenizer(["a red fox", "waves crash", "a red fox"])))
    assert (prompts.cache_hits, prompts.cache_misses) == (1, 2)

    embeds[0].fill_(7.0)  # the caller owns the result: editing it must not reach the cache
    again = prompts.encode(["waves crash", "a red fox"])
    assert (prompts.cache_hits, prompts.cache_misses) == (3, 2)
    assert torch.equal(again, encoder.prompt_embeds(*tokenizer(["waves crash", "a red fox"])))

    # LRU: "a red fox" was used last, so a third prompt evicts "waves crash".
    prompts.encode(["the sun sets"])
    prompts.encode(["a red fox"])
    assert (prompts.cache_hits, prompts.cache_misses) == (4, 3)
    prompts.encode(["waves crash"])
    assert (prompts.cache_hits, prompts.cache_misses) == (4, 4)


@torch.no_grad()
def test_prompt_encoder_computes_in_encoder_dtype(spm_dir: Path) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=16)
    encoder = _tiny_encoder()
    reference = PromptEncoder(tokenizer, encoder).encode(["a red fox runs"])
    half = PromptEncoder(tokenizer, encoder.to(torch.bfloat16)).encode(["a red fox runs"])
    assert half.dtype == torch.bfloat16
    assert torch.allclose(half.float(), reference, atol=0.1, rtol=0.05)
    length = int(tokenizer(["a red fox runs"])[1].sum())
    assert torch.all(half[0, length:] == 0) and torch.all(half[0, :length].abs().sum(dim=-1) > 0)


def test_prompt_encoder_rejects_mismatches(spm_dir: Path) -> None:
    tokenizer = PromptTokenizer(spm_dir, text_len=16)
    with pytest.raises(UserError, match="text_len"):
        PromptEncoder(tokenizer, _tiny_encoder(text_len=32))
    with pytest.raises(UserError, match="64 tokens"):
        PromptEncoder(tokenizer, _tiny_encoder(vocab_size=32))
    with pytest.raises(UserError, match="cache_size"):
        PromptEncoder(tokenizer, _tiny_encoder(), cache_size=0)
    prompts = PromptEncoder(tokenizer, _tiny_encoder())
    with pytest.raises(UserError, match="no prompts"):
        prompts.encode([])
    with pytest.raises(TypeError, match="single string"):
        prompts.encode("a red fox")  # type: ignore[arg-type]
