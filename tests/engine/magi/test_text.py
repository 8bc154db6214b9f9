"""MAGI-1 text path against the golden vectors: T5 encoder, caption rows, prompt cleaning, loading, tokenizer."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sentencepiece
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from engine.families.magi.captions import (
    CAPTION_ROWS,
    NULL_CAPTION_VALID_ROWS,
    caption_rows,
    load_special_tokens,
    null_rows,
    valid_rows,
)
from engine.families.magi.clean_caption import clean_caption, clean_prompt
from engine.families.magi.t5 import MagiTokenizer, T5Config, T5Encoder, load_t5
from inferix.errors import UserError

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASES = ["magi1_tiny_distill", "magi1_tiny_cfg"]
# Measured max abs diff of last_hidden_state vs. the golden: 0 (distill, d_model 32) and 1.2e-6 (cfg,
# d_model 40: MKL sums odd-sized matmuls in an ISA-dependent order). Values are O(1).
T5_TOLERANCE = 1e-5


def _config(case: str) -> dict[str, Any]:
    return json.loads((GOLDEN / case / "config.json").read_text())


def _hf_folder(case: str, folder: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """An HF-style T5 folder (config.json + model.safetensors) holding the golden T5, or ``state``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_config(case)["t5_config"]))
    save_file(state if state is not None else load_file(GOLDEN / case / "t5.safetensors"), folder / "model.safetensors")
    return folder


def _encode_golden(encoder: T5Encoder, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    text = load_file(GOLDEN / case / "text_case.safetensors")
    with torch.no_grad():
        out = encoder(text["text_ids"], text["text_mask"])
    return out, text["caption_embs"][0]


# ---- T5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_t5_matches_golden(case: str, tmp_path: Path) -> None:
    encoder = load_t5(_hf_folder(case, tmp_path / "t5"), torch.float32, "cpu")
    out, expected = _encode_golden(encoder, case)
    assert out.shape == expected.shape == (1, CAPTION_ROWS, encoder.config.d_model)
    # Every row, padding included: the reference does not zero padding rows.
    torch.testing.assert_close(out, expected, atol=T5_TOLERANCE, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_t5_load_state_dict_takes_hf_names(case: str) -> None:
    state = load_file(GOLDEN / case / "t5.safetensors")
    encoder = T5Encoder(T5Config.from_hf(_config(case)["t5_config"]))
    assert set(encoder.state_dict()) == set(state)
    # An HF T5EncoderModel state dict also lists the tied embedding under encoder.embed_tokens.
    encoder.load_state_dict({**state, "encoder.embed_tokens.weight": state["shared.weight"]})
    out, expected = _encode_golden(encoder.eval(), case)
    torch.testing.assert_close(out, expected, atol=T5_TOLERANCE, rtol=0)


def test_load_t5_layouts(tmp_path: Path) -> None:
    """Sharded safetensors, pytorch_model.bin, only the tied embedding name, and a full seq2seq checkpoint."""
    case = CASES[0]
    state = load_file(GOLDEN / case / "t5.safetensors")
    expected = _encode_golden(load_t5(_hf_folder(case, tmp_path / "single")), case)[0]

    sharded = tmp_path / "sharded"
    _hf_folder(case, sharded)
    (sharded / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, sharded / file)
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    torch_bin = tmp_path / "bin"
    _hf_folder(case, torch_bin)
    (torch_bin / "model.safetensors").unlink()
    renamed = {("encoder.embed_tokens.weight" if k == "shared.weight" else k): v for k, v in state.items()}
    torch.save({**renamed, "decoder.final_layer_norm.weight": torch.ones(4), "lm_head.weight": torch.ones(2, 2)},
               torch_bin / "pytorch_model.bin")  # fmt: skip

    for folder in (sharded, torch_bin):
        torch.testing.assert_close(_encode_golden(load_t5(folder), case)[0], expected, atol=0, rtol=0)


def test_load_t5_dtype_and_device(tmp_path: Path) -> None:
    encoder = load_t5(_hf_folder(CASES[0], tmp_path / "t5"), torch.bfloat16, "cpu")
    assert {p.dtype for p in encoder.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in encoder.parameters()) and not encoder.training
    out, expected = _encode_golden(encoder, CASES[0])
    assert out.dtype == torch.bfloat16
    assert (out.float() - expected).abs().max().item() < 0.2  # bf16 smoke check only


def test_load_t5_missing_key_is_named(tmp_path: Path) -> None:
    state = load_file(GOLDEN / CASES[0] / "t5.safetensors")
    del state["encoder.block.1.layer.1.DenseReluDense.wo.weight"]
    state["encoder.block.9.extra.weight"] = torch.zeros(2)
    folder = _hf_folder(CASES[0], tmp_path / "t5", state)
    with pytest.raises(UserError) as info:
        load_t5(folder)
    message = str(info.value)
    assert "encoder.block.1.layer.1.DenseReluDense.wo.weight" in message
    assert "encoder.block.9.extra.weight" in message
    assert str(folder / "model.safetensors") in message


def test_load_t5_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_t5(tmp_path / "absent")
    folder = tmp_path / "t5"
    folder.mkdir()
    with pytest.raises(UserError, match="config.json"):
        load_t5(folder)
    (folder / "config.json").write_text(json.dumps(_config(CASES[0])["t5_config"]))
    with pytest.raises(UserError, match="model.safetensors.index.json.*pytorch_model.bin"):
        load_t5(folder)
    (folder / "config.json").write_text(json.dumps({**_config(CASES[0])["t5_config"], "feed_forward_proj": "relu"}))
    with pytest.raises(UserError, match="feed_forward_proj 'relu'"):
        load_t5(folder)


def test_t5_config_from_hf() -> None:
    hf = _config(CASES[1])["t5_config"]
    config = T5Config.from_hf(hf)
    assert (config.d_model, config.d_kv, config.num_heads, config.inner_dim) == (40, 10, 4, 40)
    assert config.relative_attention_max_distance == 128 and config.layer_norm_epsilon == 1e-6
    with pytest.raises(UserError, match="num_heads"):
        T5Config.from_hf({k: v for k, v in hf.items() if k != "num_heads"})
    with pytest.raises(UserError, match="feed_forward_proj"):
        T5Config.from_hf({k: v for k, v in hf.items() if k != "feed_forward_proj"})  # HF's default is relu
    with pytest.raises(UserError, match="d_ff=0"):
        T5Config.from_hf({**hf, "d_ff": 0})


# ---- caption rows -------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_caption_rows_match_golden(case: str) -> None:
    folder = GOLDEN / case
    text = load_file(folder / "text_case.safetensors")
    inputs = load_file(folder / "inputs.safetensors")
    null = load_file(folder / "dit.safetensors")["y_embedder.null_caption_embedding"]
    special = load_special_tokens(folder / "special_tokens.npz")
    chunk_num = inputs["y_masks"].shape[1]
    stored = inputs["y_first_rows"].shape[2]  # only the first 64 rows are stored
    for chunk in range(chunk_num):
        rows, mask = caption_rows(text["caption_embs"][0, 0], text["emb_masks"][0], chunk, chunk_num, special)
        assert rows.shape == (CAPTION_ROWS, special.dim) and mask.shape == (CAPTION_ROWS,)
        # Measured max abs diff 0: the rows are copies.
        assert torch.equal(rows[:stored], inputs["y_first_rows"][0, chunk])
        assert torch.equal(mask, inputs["y_masks"][0, chunk])
        rows, mask = null_rows(null)
        assert torch.equal(rows[:stored], inputs["y_first_rows"][1, chunk])
        assert torch.equal(mask, inputs["y_masks"][1, chunk])


@pytest.mark.parametrize("case", CASES)
def test_special_tokens_are_fp16_rounded(case: str) -> None:
    path = GOLDEN / case / "special_tokens.npz"
    other = np.load(path)["other_tokens"]
    special = load_special_tokens(path)
    assert special.hq.dtype == torch.float32
    assert torch.equal(special.hq, torch.from_numpy(other[1].astype(np.float16)).float())
    assert not torch.equal(special.hq, torch.from_numpy(other[1]).float())  # the rounding matters
    for k in range(8):
        assert torch.equal(special.duration(k), torch.from_numpy(other[7 + k].astype(np.float16)).float())
    assert torch.equal(special.duration(20), special.duration(7))


def test_caption_rows_layout_and_valid_rows() -> None:
    case = CASES[0]
    text = load_file(GOLDEN / case / "text_case.safetensors")
    embs, mask = text["caption_embs"][0, 0], text["emb_masks"][0]
    special = load_special_tokens(GOLDEN / case / "special_tokens.npz")
    rows, row_mask = caption_rows(embs, mask, 1, 12, special)
    assert torch.equal(rows[0], special.duration(7)) and torch.equal(rows[1], special.hq)  # 10 chunks after -> 7
    assert torch.equal(rows[2:], embs[:-2]) and torch.equal(row_mask[2:], mask[:-2].float())
    valid = valid_rows(rows, row_mask)
    assert torch.equal(valid, torch.cat([rows[:2], embs[: int(mask.sum())]]))
    null, null_mask = null_rows(torch.randn(CAPTION_ROWS, special.dim))
    assert torch.equal(valid_rows(null, null_mask), null[:NULL_CAPTION_VALID_ROWS])
    with pytest.raises(UserError, match="800"):
        caption_rows(embs[:120], mask[:120], 0, 1, special)
    with pytest.raises(ValueError, match="chunk 3"):
        caption_rows(embs, mask, 3, 3, special)


def test_load_special_tokens_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        load_special_tokens(tmp_path / "absent.npz")
    np.savez(tmp_path / "wrong.npz", caption_token=np.zeros((1, 4)))
    with pytest.raises(UserError, match="other_tokens"):
        load_special_tokens(tmp_path / "wrong.npz")
    np.savez(tmp_path / "short.npz", other_tokens=np.zeros((10, 4)))
    with pytest.raises(UserError, match=r"\(10, 4\)"):
        load_special_tokens(tmp_path / "short.npz")


# ---- prompt cleaning ----------------------------------------------------------------------------
def _clean_cases() -> list[tuple[str, str]]:
    pairs = {(c["raw"], c["cleaned"]) for case in CASES for c in _config(case)["clean_caption_cases"]}
    pairs |= {(_config(case)["prompt"], _config(case)["cleaned_prompt"]) for case in CASES}
    return sorted(pairs)


@pytest.mark.parametrize(("raw", "cleaned"), _clean_cases())
def test_clean_prompt_matches_reference(raw: str, cleaned: str) -> None:
    assert clean_prompt(raw) == cleaned


@pytest.mark.parametrize("case", CASES)
def test_cleaned_prompt_gives_golden_ids(case: str) -> None:
    """The golden text_ids come from the cleaned prompt through the config's toy tokenizer."""
    config = _config(case)
    vocab = config["t5_config"]["vocab_size"]
    words = clean_prompt(config["prompt"]).split()
    ids = [3 + zlib.crc32(word.encode("utf-8")) % (vocab - 3) for word in words] + [1]
    text = load_file(GOLDEN / case / "text_case.safetensors")
    assert text["text_ids"][0, : len(ids)].tolist() == ids
    assert int(text["text_mask"].sum()) == len(ids)


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ("<p>Tom &amp; Jerry&nbsp;chase</p><script>evil()</script>", "tom jerry chase"),  # tags, entities
        ("A%20cat+sits", "a cat sits"),  # URL-decoded first
        ("<person> waves", "person waves"),
        ("a &foo; b &#65;", "a foo b a"),  # unknown entity keeps its name, numeric refs decode
        ("中文 dog", "dog"),
        ("x - y", "x - y"),  # up to three dashes are kept
    ],
)
def test_clean_caption_html_and_special_cases(raw: str, cleaned: str) -> None:
    assert clean_prompt(raw) == cleaned


def test_clean_caption_one_pass_differs_from_two() -> None:
    # The first pass strips one leading quote, which uncovers a second one for the second pass.
    raw = "':x"
    assert clean_caption(raw) == ":x" and clean_prompt(raw) == "x"


# ---- tokenizer ----------------------------------------------------------------------------------
WORDS = ["red", "fox", "jumps", "over", "the", "lazy", "dog"]


def _tokenizer_json(folder: Path) -> Path:
    """A word-level tokenizer.json with T5's special ids and a post-processor that appends </s>."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2} | {word: 3 + i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer.enable_truncation(max_length=2)  # settings stored in the file must not apply
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_tokenizer_json_eos_pad_truncation(tmp_path: Path) -> None:
    tokenizer = MagiTokenizer(_tokenizer_json(tmp_path / "tok"), max_length=6)
    ids, mask = tokenizer.encode("red fox jumps")
    assert ids.dtype == mask.dtype == torch.int64 and ids.shape == mask.shape == (1, 6)
    assert ids.tolist() == [[3, 4, 5, 1, 0, 0]] and mask.tolist() == [[1, 1, 1, 1, 0, 0]]
    ids, mask = tokenizer.encode("red fox jumps over the lazy dog")  # 7 tokens: cut to 5 + EOS
    assert ids.tolist() == [[3, 4, 5, 6, 7, 1]] and mask.tolist() == [[1] * 6]
    ids, mask = tokenizer.encode("red fox jumps over the")  # exactly max_length - 1 tokens
    assert ids.tolist() == [[3, 4, 5, 6, 7, 1]]
    ids, mask = tokenizer.encode("")
    assert ids.tolist() == [[1, 0, 0, 0, 0, 0]] and mask.tolist() == [[1, 0, 0, 0, 0, 0]]
    ids, _ = tokenizer.encode("red cat")
    assert ids.tolist() == [[3, 2, 1, 0, 0, 0]]  # unknown word -> <unk>
    assert MagiTokenizer(tmp_path / "tok").encode("dog")[0].shape == (1, 800)  # default max_length


def test_tokenizer_sentencepiece(tmp_path: Path) -> None:
    folder = tmp_path / "spm"
    folder.mkdir()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(WORDS)] * 8 + ["a quick brown fox", "the dog sleeps"] * 4),
        model_writer=model,
        vocab_size=30,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    (folder / "spiece.model").write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    pieces = processor.encode("red fox", out_type=int)
    ids, mask = MagiTokenizer(folder, max_length=len(pieces) + 4).encode("red fox")
    assert ids.tolist() == [[*pieces, 1, 0, 0, 0]] and mask.tolist() == [[1] * (len(pieces) + 1) + [0] * 3]
    ids, mask = MagiTokenizer(folder, max_length=4).encode("red fox")
    assert ids.tolist() == [[*pieces[:3], 1]] and mask.all()


def test_tokenizer_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"tokenizer\.json.*spiece\.model"):
        MagiTokenizer(tmp_path)
    with pytest.raises(UserError, match="max_length"):
        MagiTokenizer(_tokenizer_json(tmp_path / "tok"), max_length=0)
