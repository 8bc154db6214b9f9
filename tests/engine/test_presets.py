"""Model presets, model folders and load_wan_model: the yaml data, the tiny built-in model, golden folders."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.families.wan.golden import WanCase
from engine.families.wan.loader import MODEL_YAML, LoadedModel, byte_level_tokenizer, load_wan_model, resolve_model_dir
from engine.families.wan.pipeline import WanPipeline
from engine.families.wan.vae import to_unit_range
from engine.flow_match import FlowMatchSchedule
from engine.noise import RecordedNoise
from inferix.errors import UserError
from inferix.spec.architectures import WanDiTConfig
from inferix.spec.presets import _preset_data, available_presets, load_preset
from inferix.spec.served import load_any_preset, load_served_preset, model_settings

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TOLERANCE = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """The golden was produced single-threaded; one thread also keeps shared CI cores free."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ---------------------------------------------------------------- preset data


def test_shipped_presets() -> None:
    assert {"self-forcing-dmd", "causvid", "tiny"} <= set(available_presets())


@pytest.mark.parametrize(
    ("preset", "case", "steps", "dtype"),
    [
        ("self-forcing-dmd", "selfforcing_tiny_global", [1000.0, 937.5, 833.3333129882812, 625.0], torch.float32),
        ("causvid", "causvid_tiny", [1000, 757, 522], torch.int64),
    ],
)
def test_reference_presets_sample_like_the_reference(
    preset: str, case: str, steps: list[float], dtype: torch.dtype
) -> None:
    p = load_preset(preset)
    # Wan2.1-T2V-1.3B, 3 latent frames per block, 16 fps, 480x832, global attention.
    assert (p.dit.dim, p.dit.num_layers, p.dit.num_heads, p.dit.ffn_dim) == (1536, 30, 12, 8960)
    assert p.pipeline.block.num_frame_per_block == 3 and p.pipeline.block.is_global
    assert (p.fps, p.video.height, p.video.width) == (16, 480, 832)
    assert p.files is not None and p.files.vae == "Wan2.1_VAE.pth"
    # Same sampling as the reference code that produced the golden vectors.
    assert p.pipeline.sampling == WanCase(GOLDEN / case).pipeline_config().sampling
    timesteps = FlowMatchSchedule(p.pipeline.sampling.schedule).denoising_timesteps(p.pipeline.sampling)
    assert timesteps.dtype == dtype and timesteps.tolist() == steps


def test_overrides_merge_key_by_key() -> None:
    preset = load_preset("self-forcing-dmd", {"pipeline": {"block": {"local_attn_size": 12, "sink_size": 3}}})
    assert preset.pipeline.block.num_frame_per_block == 3  # untouched keys keep the preset's values
    assert (preset.pipeline.block.local_attn_size, preset.pipeline.block.sink_size) == (12, 3)
    assert preset.pipeline.sampling.schedule.shift == 5.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dit": {"dims": 8}}, r"dit: unknown key\(s\) \['dims'\]"),
        ({"pipeline": {"sampling": {"schedule": {"shfit": 3}}}}, r"schedule: unknown key\(s\) \['shfit'\]"),
        ({"pipeline": {"block": {"num_frame_per_block": 0}}}, "num_frame_per_block must be >= 1"),
        ({"text_encoder": {"dim": 32}}, r"text_dim \(4096\) must equal text_encoder.dim \(32\)"),
        ({"video": {"height": 500}}, "must be a multiple of 16x16"),
        ({"files": {"dit_weights": "best"}}, "dit_weights must be one of"),
        ({"random_weights": {"seed": 1}}, "exactly one of 'files' and 'random_weights'"),
        ({"vea": {}}, r"unknown key\(s\) \['vea'\]"),
    ],
)
def test_bad_overrides_are_user_errors_naming_the_place(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message) as info:
        load_preset("self-forcing-dmd", overrides, "my/model.yaml")
    assert "my/model.yaml" in str(info.value)


def test_a_variant_preset_is_its_base_with_what_it_changes() -> None:
    base, variant = load_preset("toyworld-play"), load_preset("toyworld-play-1f")
    assert variant.name == "toyworld-play-1f" and variant.description != base.description
    assert variant.pipeline.block.num_frame_per_block == 1 and base.pipeline.block.num_frame_per_block == 3
    assert variant.pipeline.sampling.denoising_steps == (1000, 700, 350, 50)
    assert variant.pipeline.block.local_attn_size == base.pipeline.block.local_attn_size  # merged key by key
    assert (variant.dit, variant.vae, variant.files, variant.actions) == (base.dit, base.vae, base.files, base.actions)
    assert replace(variant.pipeline.sampling, denoising_steps=base.pipeline.sampling.denoising_steps) == (
        base.pipeline.sampling
    )


@pytest.mark.parametrize(
    ("presets", "message"),
    [
        ({"a": {"base": "nowhere", "name": "a"}}, "preset 'a': base 'nowhere' is an unknown model preset"),
        ({"a": {"base": "b", "name": "a"}, "b": {"base": "a", "name": "b"}}, "a -> b -> a: a preset cannot be its own"),
        ({"a": {"base": 3, "name": "a"}}, "base must be a preset name, got 3"),
    ],
)
def test_bad_preset_bases_are_user_errors(presets: dict[str, dict[str, Any]], message: str, tmp_path: Path) -> None:
    files = {}
    for name, data in presets.items():
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(data))
    with pytest.raises(UserError, match=message):
        _preset_data("a", files, ())


def test_a_workers_model_settings_rebuild_the_preset_it_runs(tmp_path: Path) -> None:
    """What a worker registers (`model_settings`) gives the scheduler the preset its model folder
    really runs, overrides included; a model by name registers nothing."""
    folder = tmp_path / "small-toyworld"
    folder.mkdir()
    (folder / MODEL_YAML).write_text(
        "preset: toyworld\nvideo: {height: 96, width: 128, fps: 12}\npipeline: {block: {num_frame_per_block: 1}}\n"
        "files: {dit: weights.safetensors, vae: vae.safetensors, text_encoder: t5.safetensors, tokenizer: tok.json}\n"
    )
    for name in ("weights.safetensors", "vae.safetensors", "t5.safetensors", "tok.json"):
        (folder / name).touch()
    settings = model_settings(folder)
    rebuilt = load_served_preset("toyworld", settings)
    assert rebuilt == resolve_model_dir(folder).preset != load_any_preset("toyworld")
    assert (rebuilt.video.height, rebuilt.video.width, rebuilt.fps) == (96, 128, 12)
    assert model_settings(folder) == settings  # canonical: the same folder registers the same text
    for by_name in ("toyworld", "toyworld-play-1f", "tiny"):
        assert model_settings(by_name) == ""
    assert load_served_preset("toyworld", "") == load_any_preset("toyworld")
    (folder / MODEL_YAML).write_text("preset: matrixgame2-universal\n")  # nothing a session is sized by
    assert model_settings(folder) == ""
    with pytest.raises(UserError, match="not the JSON a worker registers"):
        load_served_preset("toyworld", "{video")
    with pytest.raises(UserError, match="names no preset"):
        load_served_preset("toyworld", '{"video": {"fps": 8}}')


def test_unknown_preset_lists_the_available_ones() -> None:
    with pytest.raises(UserError, match="available presets: causvid, longlive, longlive-tiny, self-forcing-dmd, tiny"):
        load_preset("self-forcing")


# ---------------------------------------------------------------- the tiny built-in model


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_wan_model("tiny")


def test_byte_level_tokenizer() -> None:
    tokenizer = byte_level_tokenizer(text_len=8)
    ids, mask = tokenizer(["ab é"])
    assert tokenizer.vocab_size == 259
    assert ids.shape == (1, 8) and mask[0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]  # 5 bytes + EOS
    assert ids[0, 5] == 1 and ids[0, 6:].tolist() == [0, 0]  # EOS, then padding
    assert len(set(ids[0, :5].tolist())) == 5 and ids[0, :5].min() >= 3


def test_tiny_model_generates_a_block(tiny: LoadedModel) -> None:
    assert (tiny.name, tiny.fps, tiny.height, tiny.width, tiny.source) == ("tiny", 16, 128, 128, None)
    embeds = tiny.prompt_encoder.encode(["a red fox runs through the snow"])
    assert embeds.shape == (1, 128, 32)
    pipeline = WanPipeline(tiny.dit, tiny.pipeline_config)
    session = pipeline.open_session(embeds, tiny.height // 8, tiny.width // 8, seed=3, num_blocks=1)
    block = session.generate_block()
    assert block.latents.shape == (1, 3, 16, 16, 16) and torch.isfinite(block.latents).all()
    video = tiny.vae.decode_block(block.latents, tiny.vae.new_decode_state())
    assert video.shape == (1, 9, 3, 128, 128) and torch.isfinite(video).all()
    assert video.std() > 0.01  # random weights still make a non-constant video


def test_tiny_model_is_deterministic(tiny: LoadedModel) -> None:
    again = load_wan_model("tiny", dtype="bf16")
    ours, theirs = tiny.dit.state_dict(), again.dit.state_dict()
    assert all(theirs[k].dtype == torch.bfloat16 and torch.equal(theirs[k], v.bfloat16()) for k, v in ours.items())


# ---------------------------------------------------------------- model folders


def _golden_overrides(case: str, folder: Path) -> dict[str, Any]:
    """model.yaml content that fits a preset to a golden tiny case and points at its files."""
    config = json.loads((GOLDEN / case / "config.json").read_text())
    dit_fields = {f.name for f in fields(WanDiTConfig)}
    text = {k: v for k, v in config["text_encoder"].items() if k not in ("class", "note", "pad_id", "eos_id")}
    return {
        "preset": "causvid" if case.startswith("causvid") else "self-forcing-dmd",
        "dit": {k: v for k, v in config["dit"].items() if k in dit_fields},
        "vae": {"dim": config["vae"]["dim"], "num_res_blocks": config["vae"]["num_res_blocks"]},
        "text_encoder": text,
        "video": {"height": config["vae"]["pixel_h"], "width": config["vae"]["pixel_w"]},
        "files": {
            "dit": str(GOLDEN / case / "dit_checkpoint.pt"),
            "vae": str(GOLDEN / case / "vae.safetensors"),
            "text_encoder": str(GOLDEN / case / "text.safetensors"),
            "tokenizer": "tokenizer",
        },
    }


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def _golden_folder(case: str, tmp_path: Path) -> Path:
    folder = tmp_path / case
    _write_tokenizer(folder / "tokenizer", 256)
    (folder / MODEL_YAML).write_text(yaml.safe_dump(_golden_overrides(case, folder)))
    return folder


@pytest.mark.parametrize("case", ["selfforcing_tiny_global", "causvid_tiny"])
def test_model_folder_reproduces_the_golden_first_block(case: str, tmp_path: Path) -> None:
    model = load_wan_model(_golden_folder(case, tmp_path))
    assert model.source == tmp_path / case and model.fps == 16
    inputs = load_file(str(GOLDEN / case / "inputs.safetensors"))
    outputs = load_file(str(GOLDEN / case / "outputs.safetensors"))
    text = load_file(str(GOLDEN / case / "text_case.safetensors"))
    embeds = model.prompt_encoder.encoder.prompt_embeds(text["text_ids"], text["text_mask"])
    assert (embeds - text["text_embeds"]).abs().max().item() <= TOLERANCE
    assert model.prompt_encoder.encode(["w3 w4 w5"]).shape == (1, 16, 32)

    renoise = {}
    for key, tensor in inputs.items():
        if (match := re.fullmatch(r"renoise_b(\d+)_s(\d+)", key)) is not None:
            renoise[(int(match.group(1)), int(match.group(2)))] = tensor
    noise = RecordedNoise(inputs["initial_noise"], renoise)
    pipeline = WanPipeline(model.dit, model.pipeline_config)
    _, _, _, h, w = inputs["initial_noise"].shape
    session = pipeline.open_session(inputs["prompt_embeds"], h, w, noise=noise, num_blocks=1)
    latents = session.generate_block().latents
    assert (latents - outputs["latents"][:, :3]).abs().max().item() <= TOLERANCE
    if case == "selfforcing_tiny_global":  # the VAE from the folder decodes like the reference
        video = to_unit_range(model.vae.decode_block(outputs["latents"][:, :3], model.vae.new_decode_state()))
        assert (video - outputs["video_first_block"]).abs().max().item() <= TOLERANCE


def test_model_folder_with_a_wan_dit_folder(tmp_path: Path) -> None:
    """files.dit may name a Wan model folder; its config.json then defines the DiT architecture."""
    case = "selfforcing_tiny_global"
    root = _golden_folder(case, tmp_path)
    overrides = yaml.safe_load((root / MODEL_YAML).read_text())
    dit = overrides["dit"]
    overrides["dit"] = {"text_dim": dit["text_dim"], "text_len": dit["text_len"]}  # the rest: 1.3B defaults
    overrides["files"]["dit"] = "transformer"
    (root / MODEL_YAML).write_text(yaml.safe_dump(overrides))
    (root / "transformer").mkdir()
    keys = ("dim", "ffn_dim", "freq_dim", "num_heads", "num_layers", "in_dim", "out_dim")
    config = {"_class_name": "WanModel", "model_type": "t2v", **{k: dit[k] for k in keys}}
    (root / "transformer" / "config.json").write_text(json.dumps(config))
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(
        (GOLDEN / case / "dit.safetensors").read_bytes()
    )
    model = load_wan_model(root)
    assert model.dit.config == WanDiTConfig.from_dict(dit)
    assert model.preset.dit == model.dit.config


def _release_folder(tmp_path: Path, dit_files: list[str]) -> Path:
    """Empty stand-ins for the files of a Wan2.1 release folder plus the given DiT checkpoints."""
    root = tmp_path / "model"
    for name in ["Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", *dit_files]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    (root / "google" / "umt5-xxl").mkdir(parents=True)
    return root


def test_preset_is_detected_from_the_checkpoint_name(tmp_path: Path) -> None:
    root = _release_folder(tmp_path, ["checkpoints/self_forcing_dmd.pt"])
    folder = resolve_model_dir(root)
    assert folder.preset.name == "self-forcing-dmd"
    assert folder.dit == root / "checkpoints" / "self_forcing_dmd.pt"
    assert folder.tokenizer == root / "google" / "umt5-xxl"
    assert (
        resolve_model_dir(_release_folder(tmp_path / "c", ["autoregressive_checkpoint/model.pt"])).preset.name
        == "causvid"
    )


def test_model_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist or is not a directory"):
        resolve_model_dir(tmp_path / "nowhere")

    root = _release_folder(tmp_path, [])
    with pytest.raises(UserError, match="no model.yaml and no known DiT checkpoint.*self_forcing_dmd.pt"):
        resolve_model_dir(root)

    (root / "model.pt").write_bytes(b"")
    (root / "self_forcing_dmd.pt").write_bytes(b"")
    with pytest.raises(UserError, match="several presets"):
        resolve_model_dir(root)

    (root / "model.pt").unlink()
    (root / "Wan2.1_VAE.pth").unlink()
    with pytest.raises(UserError) as info:
        resolve_model_dir(root)
    message = str(info.value)
    assert str(root / "Wan2.1_VAE.pth") in message
    assert f"huggingface-cli download Wan-AI/Wan2.1-T2V-1.3B --local-dir {root}" in message

    (root / MODEL_YAML).write_text("preset: causvid\n")
    with pytest.raises(UserError, match="missing the DiT checkpoint") as info:
        resolve_model_dir(root)
    assert "huggingface-cli download tianweiy/CausVid autoregressive_checkpoint/model.pt" in str(info.value)

    (root / MODEL_YAML).write_text("files: {dit: x.pt}\n")
    with pytest.raises(UserError, match="must name a preset"):
        resolve_model_dir(root)

    (root / MODEL_YAML).write_text("preset: tiny\n")
    with pytest.raises(UserError, match="built-in random weights"):
        resolve_model_dir(root)
