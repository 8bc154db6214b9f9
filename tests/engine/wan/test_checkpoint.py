"""Checkpoint loading: every DiT layout round-trips the golden weights; meta-device loading; errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from engine.checkpoint import _parameters_on_meta, load_into, parse_dtype, read_state_dict, seeded_state_dict
from engine.families.wan.autoencoders import load_vae
from engine.families.wan.checkpoint import load_dit
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.vae import WanVAE
from inferix.errors import CheckpointError, UserError
from inferix.spec.architectures import WanDiTConfig, WanVAEConfig

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
CASE = GOLDEN / "selfforcing_tiny_global"
# The README promises ~1e-5 agreement with the reference in fp32.
TOLERANCE = 1e-5

# TRANSFORMER_KEYS_RENAME_DICT of diffusers' scripts/convert_wan_to_diffusers.py (T2V entries), applied
# the way that script applies it, so the diffusers layout below is produced independently of our inverse.
DIFFUSERS_RENAMES = {
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.modulation": "scale_shift_table",
    "head.head": "proj_out",
    "modulation": "scale_shift_table",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
    "norm2": "norm__placeholder",
    "norm3": "norm2",
    "norm__placeholder": "norm3",
    "self_attn.q": "attn1.to_q",
    "self_attn.k": "attn1.to_k",
    "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0",
    "self_attn.norm_q": "attn1.norm_q",
    "self_attn.norm_k": "attn1.norm_k",
    "cross_attn.q": "attn2.to_q",
    "cross_attn.k": "attn2.to_k",
    "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0",
    "cross_attn.norm_q": "attn2.norm_q",
    "cross_attn.norm_k": "attn2.norm_k",
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Deterministic kernels for bitwise comparisons; also keeps shared CI cores free."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def golden_config(case: Path = CASE) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((case / "config.json").read_text())
    return config


def dit_config(case: Path = CASE) -> WanDiTConfig:
    return WanDiTConfig.from_dict(golden_config(case)["dit"])


def golden_state(case: Path = CASE) -> dict[str, Tensor]:
    return load_file(str(case / "dit.safetensors"))


@torch.no_grad()
def flow(dit: CausalWanDiT, case: Path = CASE) -> Tensor:
    """The golden stand-alone DiT call 0 (fresh cache: the block attends only to itself)."""
    data = load_file(str(case / "dit_forward.safetensors"))
    prompt = dit.encode_prompt(load_file(str(case / "inputs.safetensors"))["prompt_embeds"])
    return dit(data["dit_fwd_in0"], data["dit_fwd_t0"], prompt)


def assert_golden_weights(dit: CausalWanDiT, case: Path = CASE) -> None:
    ours, golden = dit.state_dict(), golden_state(case)
    assert ours.keys() == golden.keys()
    assert all(torch.equal(ours[k], golden[k]) for k in golden)


def to_diffusers(name: str) -> str:
    for old, new in DIFFUSERS_RENAMES.items():
        name = name.replace(old, new)
    return name


def write_shards(folder: Path, state: dict[str, Tensor], file_stem: str) -> None:
    """Two safetensors shards and the HF index that maps every tensor to its shard."""
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"{file_stem}-{i + 1:05d}-of-00002.safetensors"
        save_file({n: state[n].contiguous() for n in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / f"{file_stem}.safetensors.index.json").write_text(json.dumps(index))


# ---------------------------------------------------------------- layouts


def write_layout(layout: str, tmp_path: Path) -> Path:
    """The golden tiny DiT weights in one checkpoint layout; returns what to pass to load_dit."""
    state = golden_state()
    dit = golden_config()["dit"]
    if layout == "self-forcing":  # {'generator_ema': {'model.'+k}, 'generator': ...}, as released
        return CASE / "dit_checkpoint.pt"
    if layout == "causvid":  # {'generator': {'model.'+k}}, as CausVid's <folder>/model.pt
        return GOLDEN / "causvid_tiny" / "dit_checkpoint.pt"
    if layout == "flat-safetensors":
        return CASE / "dit.safetensors"
    if layout in ("flat.pt", "flat.bin", "flat.pth"):
        path = tmp_path / f"dit{layout.removeprefix('flat')}"
        torch.save(state, path)
        return path
    if layout == "legacy-torch-format":  # not memory-mappable: read into memory instead
        path = tmp_path / "legacy.pt"
        torch.save(
            {"generator": {f"model.{k}": v for k, v in state.items()}}, path, _use_new_zipfile_serialization=False
        )
        return path
    folder = tmp_path / "transformer"
    folder.mkdir()
    if layout == "wan-folder":  # Wan-AI release: our names, original config.json keys
        keys = ("dim", "ffn_dim", "freq_dim", "in_dim", "out_dim", "num_heads", "num_layers", "eps", "text_len")
        config = {"_class_name": "WanModel", "model_type": "t2v", "text_dim": dit["text_dim"]}
        config.update({k: dit[k] for k in keys})
        save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    elif layout == "wan-folder-sharded":
        config = {k: dit[k] for k in ("dim", "ffn_dim", "freq_dim", "num_heads", "num_layers", "text_dim", "text_len")}
        write_shards(folder, state, "diffusion_pytorch_model")
    elif layout == "diffusers-folder":  # HF diffusers WanTransformer3DModel names and config
        config = {
            "_class_name": "WanTransformer3DModel",
            "num_attention_heads": dit["num_heads"],
            "attention_head_dim": dit["dim"] // dit["num_heads"],
            "in_channels": dit["in_dim"],
            "out_channels": dit["out_dim"],
            "text_dim": dit["text_dim"],
            "freq_dim": dit["freq_dim"],
            "ffn_dim": dit["ffn_dim"],
            "num_layers": dit["num_layers"],
            "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads",
            "eps": 1e-6,
            "patch_size": [1, 2, 2],
            "image_dim": None,
            "added_kv_proj_dim": None,
            "rope_max_seq_len": 1024,
        }
        write_shards(folder, {to_diffusers(k): v for k, v in state.items()}, "diffusion_pytorch_model")
    else:
        raise AssertionError(layout)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


LAYOUTS = [
    "self-forcing",
    "causvid",
    "flat-safetensors",
    "flat.pt",
    "flat.bin",
    "flat.pth",
    "legacy-torch-format",
    "wan-folder",
    "wan-folder-sharded",
    "diffusers-folder",
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_round_trips_the_golden_weights(layout: str, tmp_path: Path) -> None:
    case = GOLDEN / "causvid_tiny" if layout == "causvid" else CASE
    reference = flow(load_dit(case / "dit.safetensors", dit_config(case)), case)
    golden = load_file(str(case / "dit_forward.safetensors"))["dit_fwd_flow0"]
    assert (reference - golden).abs().max().item() <= TOLERANCE
    # For folders the architecture comes from config.json: start from the 1.3B defaults to prove it.
    base = WanDiTConfig(text_len=16) if "folder" in layout else dit_config(case)
    dit = load_dit(write_layout(layout, tmp_path), base, attention_backend="sdpa")
    assert dit.config == dit_config(case)
    assert_golden_weights(dit, case)
    assert torch.equal(flow(dit, case), reference)  # bit-identical outputs
    assert not dit.training and not any(p.requires_grad for p in dit.parameters())


def test_diffusers_names_are_the_ones_diffusers_uses() -> None:
    names = {to_diffusers(k) for k in golden_state()}
    for expected in (
        "condition_embedder.time_embedder.linear_1.weight",
        "condition_embedder.time_proj.weight",
        "blocks.0.attn1.to_q.weight",
        "blocks.0.attn2.to_out.0.weight",
        "blocks.0.attn1.norm_k.weight",
        "blocks.0.norm2.weight",  # our norm3: the affine cross-attention norm
        "blocks.0.ffn.net.0.proj.weight",
        "blocks.1.scale_shift_table",
        "scale_shift_table",
        "proj_out.weight",
    ):
        assert expected in names


def test_ema_is_the_default_and_generator_can_be_chosen(tmp_path: Path) -> None:
    state = golden_state()
    other = {k: v + 1 for k, v in state.items()}
    path = tmp_path / "self_forcing_dmd.pt"
    torch.save(
        {
            "generator_ema": {f"model.{k}": v for k, v in state.items()},
            "generator": {f"model.{k}": v for k, v in other.items()},
        },
        path,
    )
    assert_golden_weights(load_dit(path, dit_config()))
    raw = load_dit(path, dit_config(), weights="generator").state_dict()
    assert all(torch.equal(raw[k], other[k]) for k in state)

    only_ema = tmp_path / "ema_only.pt"
    torch.save({"generator_ema": {f"model.{k}": v for k, v in state.items()}}, only_ema)
    with pytest.raises(CheckpointError, match="no 'generator' weights") as info:
        load_dit(only_ema, dit_config(), weights="generator")
    assert str(only_ema) in str(info.value)


# ---------------------------------------------------------------- load_into


def test_load_into_assigns_the_checkpoint_tensors_without_copies() -> None:
    state = golden_state()
    sources = dict(state)
    dit = load_into(lambda: CausalWanDiT(dit_config()), state, "golden")
    assert state == {}  # consumed, so converted sources can be freed early
    for name, tensor in dit.state_dict().items():
        assert tensor.data_ptr() == sources[name].data_ptr()  # the very same storage: no second copy
    assert not any(p.is_meta for p in dit.parameters())
    assert not dit.rope.time.is_meta  # tensors that are not parameters are built for real


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_load_into_converts_floating_tensors(dtype: torch.dtype) -> None:
    golden = golden_state()
    dit = load_dit(CASE / "dit.safetensors", dit_config(), dtype=dtype)
    for name, tensor in dit.state_dict().items():
        assert tensor.dtype == dtype
        assert torch.equal(tensor, golden[name].to(dtype))


def test_meta_parameters_only_in_this_thread_and_block() -> None:
    built_elsewhere: list[nn.Linear] = []
    with _parameters_on_meta():
        inside = nn.Linear(4, 4)
        worker = threading.Thread(target=lambda: built_elsewhere.append(nn.Linear(4, 4)))
        worker.start()
        worker.join()
    after = nn.Linear(4, 4)
    assert inside.weight.is_meta
    assert not built_elsewhere[0].weight.is_meta
    assert not after.weight.is_meta


def test_seeded_weights_are_deterministic() -> None:
    def factory() -> CausalWanDiT:
        return CausalWanDiT(dit_config())

    first, again, other = seeded_state_dict(factory, 0), seeded_state_dict(factory, 0), seeded_state_dict(factory, 1)
    assert first.keys() == golden_state().keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["blocks.0.self_attn.q.weight"], other["blocks.0.self_attn.q.weight"])
    assert torch.equal(first["blocks.0.norm3.weight"], torch.ones(64))
    assert torch.equal(first["blocks.0.self_attn.q.bias"], torch.zeros(64))


def test_parse_dtype() -> None:
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype("FP16") is torch.float16
    assert parse_dtype(torch.float32) is torch.float32
    with pytest.raises(UserError, match="fp8"):
        parse_dtype("fp8")
    with pytest.raises(UserError, match="unsupported"):
        parse_dtype(torch.int8)


# ---------------------------------------------------------------- VAE


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_load_vae_matches_the_reference_weights(suffix: str, tmp_path: Path) -> None:
    golden = load_file(str(CASE / "vae.safetensors"))
    path = CASE / "vae.safetensors"
    if suffix == ".pth":  # Wan2.1_VAE.pth is a torch.save'd flat state dict
        path = tmp_path / "Wan2.1_VAE.pth"
        torch.save(golden, path)
    vae = load_vae(path, WanVAEConfig.from_dict(golden_config()["vae"]))
    assert isinstance(vae, WanVAE) and not vae.training
    ours = vae.state_dict()
    assert ours.keys() == golden.keys() and all(torch.equal(ours[k], golden[k]) for k in golden)


def test_load_vae_config_mismatch_names_the_file() -> None:
    path = CASE / "vae.safetensors"
    with pytest.raises(CheckpointError, match="vae section") as info:
        load_vae(path, WanVAEConfig(dim=8, num_res_blocks=1))
    assert str(path) in str(info.value) and "!=" in str(info.value)


# ---------------------------------------------------------------- errors


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as info:
        read_state_dict(tmp_path / "absent.pt")
    assert str(tmp_path / "absent.pt") in str(info.value)
    with pytest.raises(CheckpointError, match="is a directory") as info:
        read_state_dict(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(CheckpointError, match="unsupported file type '.ckpt'"):
        (tmp_path / "model.ckpt").write_bytes(b"x")
        read_state_dict(tmp_path / "model.ckpt")


@pytest.mark.parametrize("name", ["dit.pt", "dit.safetensors"])
def test_truncated_file(name: str, tmp_path: Path) -> None:
    whole = tmp_path / f"whole{Path(name).suffix}"
    if name.endswith(".pt"):
        torch.save(golden_state(), whole)
    else:
        save_file(golden_state(), str(whole))
    data = whole.read_bytes()
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated, corrupt") as info:
        load_dit(path, dit_config())
    assert str(path) in str(info.value)


def test_not_a_dict_of_tensors(tmp_path: Path) -> None:
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listed)
    with pytest.raises(CheckpointError, match="holds a list") as info:
        read_state_dict(listed)
    assert str(listed) in str(info.value)

    mixed = tmp_path / "mixed.pt"
    torch.save({"weight": torch.zeros(1), "step": 3}, mixed)
    with pytest.raises(CheckpointError, match=r"not a flat state dict of tensors.*'step' \(int\)"):
        read_state_dict(mixed)

    pickled = tmp_path / "pickled.pt"
    torch.save({"weight": threading.Lock}, pickled)  # arbitrary Python objects: weights_only refuses
    with pytest.raises(CheckpointError, match="cannot read") as info:
        read_state_dict(pickled)
    assert str(pickled) in str(info.value)


def _save(tmp_path: Path, state: dict[str, Tensor]) -> Path:
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path))
    return path


def test_missing_key(tmp_path: Path) -> None:
    state = golden_state()
    del state["blocks.1.ffn.2.bias"]
    path = _save(tmp_path, state)
    with pytest.raises(CheckpointError, match=r"missing keys \['blocks.1.ffn.2.bias'\], unexpected keys \[\]") as info:
        load_dit(path, dit_config())
    assert str(path) in str(info.value) and "check the DiT section" in str(info.value)


def test_unexpected_key(tmp_path: Path) -> None:
    state = golden_state()
    state["blocks.2.ffn.0.weight"] = torch.zeros(2)
    path = _save(tmp_path, state)
    with pytest.raises(CheckpointError, match=r"unexpected keys \['blocks.2.ffn.0.weight'\]") as info:
        load_dit(path, dit_config())
    assert str(path) in str(info.value)


def test_shape_mismatch() -> None:
    path = CASE / "dit.safetensors"
    wider = WanDiTConfig.from_dict({**golden_config()["dit"], "ffn_dim": 256})
    with pytest.raises(CheckpointError, match=r"blocks.0.ffn.0.weight \(128, 64\) != \(256, 64\)") as info:
        load_dit(path, wider)
    assert str(path) in str(info.value) and "shapes" in str(info.value)


def test_long_key_lists_are_cut_and_prefix_mismatches_explained(tmp_path: Path) -> None:
    deeper = WanDiTConfig.from_dict({**golden_config()["dit"], "num_layers": 6})
    with pytest.raises(CheckpointError, match=r"and \d+ more"):
        load_dit(CASE / "dit.safetensors", deeper)
    path = _save(tmp_path, {f"net.{k}": v for k, v in golden_state().items()})
    with pytest.raises(CheckpointError, match="no name matches at all.*'net.blocks"):
        load_dit(path, dit_config())


def test_wan_folder_errors(tmp_path: Path) -> None:
    folder = tmp_path / "transformer"
    folder.mkdir()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_dit(folder, dit_config())
    (folder / "config.json").write_text(json.dumps({"model_type": "i2v"}))
    with pytest.raises(CheckpointError, match="neither diffusion_pytorch_model.safetensors"):
        load_dit(folder, dit_config())
    save_file(golden_state(), str(folder / "diffusion_pytorch_model.safetensors"))
    with pytest.raises(CheckpointError, match="'i2v' Wan model"):
        load_dit(folder, dit_config())
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    write_shards(sharded, golden_state(), "diffusion_pytorch_model")
    (sharded / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="does not exist.*listed in") as info:
        load_dit(sharded, dit_config())
    assert "diffusion_pytorch_model-00002-of-00002.safetensors" in str(info.value)
