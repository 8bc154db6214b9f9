"""DiT quantization (`--quant`): every mode runs within measured error bounds, int8 runs a real
integer kernel, rows are batch-invariant, `inferix quantize` folders load to the same bits as
quantize-on-load, the public scaled_fp8 layout reads, and bad input gets a one-line error."""

from __future__ import annotations

import copy
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.golden import WanCase
from engine.families.wan.loader import TOYWORLD_WEIGHTS, load_wan_model
from engine.families.wan.pipeline import WanPipeline
from engine.families.wan.quantized_folder import quantized_dit_name, write_quantized_folder
from engine.quant import (
    QUANT_MODES,
    QuantLinear,
    check_quant_device,
    int8_path,
    parse_quant,
    quantize_linears,
    quantized_skeleton,
)
from engine.quant.kernels import (
    int8_activation_levels,
    int8_matmul,
    pack_int8_weight,
    quantize_tokens,
    quantize_weight,
)
from inferix.errors import CheckpointError, UserError
from inferix.spec.presets import load_preset
from tests.conftest import GOLDEN_DIR

MODES = [name for name, mode in QUANT_MODES.items() if mode.enabled]
# Relative L2 error of the two golden DiT calls against the unquantized DiT, measured on
# causvid_tiny and selfforcing_tiny_{global,rolling}: int8 (7-bit activations on this AVX2 CPU)
# <= 1.0e-2, int8-wo <= 4.4e-3, fp8 / fp8-tensor <= 2.6e-2. int8 keeps ~7-8 bits per value, fp8
# e4m3 only 3 mantissa bits (~2-3% of a value); the errors of a row average out in the sums.
# The bounds leave about 2x margin (a machine with VNNI quantizes activations to 8 bits: less).
REL_ERROR_BOUND = {"int8": 2e-2, "int8-wo": 1e-2, "fp8": 5e-2, "fp8-tensor": 5e-2}
WAN_CASES = ["causvid_tiny", "selfforcing_tiny_global", "selfforcing_tiny_rolling"]


def golden_forward(case: WanCase, dit: CausalWanDiT) -> list[Tensor]:
    """The flows of the case's two DiT calls (the second attends to the first)."""
    config = case.pipeline_config()
    data = case.tensors("dit_forward")
    prompt = dit.encode_prompt(case.tensors("inputs")["prompt_embeds"])
    _, frames, _, h, w = data["dit_fwd_in0"].shape
    cache = WanPipeline(dit, config).open_cache(None, "q", h, w, frames=2 * frames)
    with torch.no_grad():
        return [
            dit(data[f"dit_fwd_in{i}"], data[f"dit_fwd_t{i}"], prompt, cache, start_frame=i * frames) for i in (0, 1)
        ]


@pytest.mark.parametrize("case_name", WAN_CASES)
def test_every_mode_runs_within_its_measured_error_on_the_golden_models(case_name: str) -> None:
    case = WanCase(GOLDEN_DIR / case_name)
    dit = case.build_dit()
    reference = golden_forward(case, dit)
    for name in MODES:
        quantized = quantize_linears(copy.deepcopy(dit), parse_quant(name))
        layers = [m for m in quantized.modules() if isinstance(m, QuantLinear)]
        assert len(layers) == 10 * len(quantized.blocks)  # q, k, v, o twice, two FFN layers; nothing else
        for out, ref in zip(golden_forward(case, quantized), reference, strict=True):
            error = ((out - ref).norm() / ref.norm()).item()
            assert 0 < error < REL_ERROR_BOUND[name], (case_name, name, error)


def test_kept_layers_stay_in_high_precision() -> None:
    dit = quantize_linears(load_wan_model("tiny").dit, parse_quant("int8"))
    for name in ("text_embedding.0", "time_embedding.0", "time_projection.1", "head.head"):
        assert isinstance(dit.get_submodule(name), nn.Linear), name
    assert dit.patch_embedding.weight.dtype == torch.float32


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="oneDNN's int8 GEMM is the x86 path")
def test_int8_runs_onednns_integer_gemm_with_exact_sums() -> None:
    assert int8_path("cpu") == "onednn"
    levels = int8_activation_levels("cpu")
    torch.manual_seed(0)
    x = torch.randn(37, 320) * 3
    weight, scale = quantize_weight(torch.randn(96, 320), torch.int8, per_row=True)
    bias = torch.randn(96)
    out = int8_matmul(x, weight, scale, pack_int8_weight(weight), bias)
    q, x_scale = quantize_tokens(x, levels)
    assert q.abs().max() == levels and torch.equal(q, q.round())  # whole numbers, the full range used
    # The same operands summed exactly in float64: equal up to the final fp32 scalings.
    exact = (q.double() @ weight.double().t()) * scale.double() * x_scale.double() + bias.double()
    assert torch.allclose(out.double(), exact, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", MODES)
def test_a_rows_result_does_not_depend_on_the_batch(name: str) -> None:
    torch.manual_seed(1)
    layer = QuantLinear.from_linear(nn.Linear(64, 48), parse_quant(name))
    rows = torch.randn(2, 70, 64)
    batched = layer(rows)
    assert batched.shape == (2, 70, 48)
    assert torch.equal(layer(rows[1, 5:9]), batched[1, 5:9])
    copied = copy.deepcopy(layer)
    del layer  # the copy does not lean on the original's packed weight
    assert torch.equal(copied(rows), batched)


def test_a_dtype_conversion_keeps_the_8bit_weights_and_fp32_scales() -> None:
    layer = QuantLinear.from_linear(nn.Linear(32, 16), parse_quant("fp8"))
    weight = layer.weight.clone()
    converted = layer.to(torch.bfloat16)
    assert converted.weight.dtype == torch.float8_e4m3fn and torch.equal(converted.weight.float(), weight.float())
    assert converted.weight_scale.dtype == torch.float32
    assert converted.bias is not None and converted.bias.dtype == torch.bfloat16
    assert converted(torch.randn(3, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_weights_of_the_real_wan_1_3b_take_at_most_055x_of_bf16() -> None:
    config = load_preset("self-forcing-dmd").dit
    with torch.device("meta"):
        full = CausalWanDiT(config).state_dict()
        quantized = quantized_skeleton(lambda: CausalWanDiT(config), parse_quant("int8"))().state_dict()
    bf16 = sum(t.numel() * 2 for t in full.values())
    # 8-bit weights, fp32 scales, everything else in bf16.
    eight = sum(
        t.numel() * (t.element_size() if t.dtype != torch.float32 or "scale" in n else 2) for n, t in quantized.items()
    )
    assert bf16 > 2.5e9  # 1.3B parameters
    assert eight / bf16 <= 0.55, eight / bf16


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_quantize_save_load_equals_quantize_on_load(name: str, tmp_path: Path) -> None:
    mode = parse_quant(name)
    written = write_quantized_folder(None, mode, tmp_path / "q")
    assert written.quantized_bytes < 0.62 * written.source_bytes  # toyworld is tiny: its kept layers weigh more
    from_folder = load_wan_model(tmp_path / "q").dit
    on_load = load_wan_model(None, quant=name).dit
    saved, fresh = from_folder.state_dict(), on_load.state_dict()
    assert saved.keys() == fresh.keys()
    for key in saved:
        assert saved[key].dtype == fresh[key].dtype and torch.equal(saved[key].float(), fresh[key].float()), key
    x = torch.randn(1, 20, from_folder.blocks[0].ffn[0].in_features)
    assert torch.equal(from_folder.blocks[0].ffn[0](x), on_load.blocks[0].ffn[0](x))
    # The folder's model.yaml names its mode; int8 weights also run weight-only.
    assert isinstance(
        load_wan_model(tmp_path / "q", quant=f"{name}-wo" if name == "int8" else name).dit.blocks[0].ffn[0], QuantLinear
    )


def test_the_public_scaled_fp8_layout_loads_like_fp8_tensor(tmp_path: Path) -> None:
    folder = tmp_path / "comfy"
    write_quantized_folder(None, parse_quant("fp8-tensor"), folder)
    yaml_path = folder / "model.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("quant: fp8-tensor", ""))  # detected from the file
    state = load_file(TOYWORLD_WEIGHTS / "toyworld_dit.safetensors")
    public: dict[str, Tensor] = {"scaled_fp8": torch.zeros(0, dtype=torch.float8_e4m3fn)}
    for key, tensor in state.items():
        if key.endswith(".weight") and tensor.dim() == 2 and key.startswith("blocks."):
            weight, scale = quantize_weight(tensor, torch.float8_e4m3fn, per_row=False)
            public[key], public[key.removesuffix("weight") + "scale_weight"] = weight, scale.reshape(())
        else:
            public[key] = tensor
    save_file(public, str(folder / quantized_dit_name(parse_quant("fp8-tensor"))))
    loaded = load_wan_model(folder).dit
    reference = load_wan_model(None, quant="fp8-tensor").dit
    for key, tensor in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[key].float(), tensor.float()), key


def _written(tmp_path: Path, name: str = "int8") -> tuple[Path, dict[str, Tensor]]:
    folder = tmp_path / name
    write_quantized_folder(None, parse_quant(name), folder)
    dit = folder / quantized_dit_name(parse_quant(name))
    return dit, load_file(dit)


def test_a_missing_scale_is_refused_naming_the_file(tmp_path: Path) -> None:
    dit, state = _written(tmp_path)
    del state["blocks.0.ffn.2.weight_scale"]
    save_file(state, str(dit))
    with pytest.raises(CheckpointError, match=rf"{dit}.*mixes quantized and unquantized.*blocks.0.ffn.2"):
        load_wan_model(dit.parent)


def test_a_mismatched_scale_is_refused_naming_the_file(tmp_path: Path) -> None:
    dit, state = _written(tmp_path)
    state["blocks.1.self_attn.q.weight_scale"] = state["blocks.1.self_attn.q.weight_scale"][:3]
    save_file(state, str(dit))
    with pytest.raises(CheckpointError, match=rf"{dit}.*blocks.1.self_attn.q.weight_scale"):
        load_wan_model(dit.parent)


def test_8bit_weights_without_scales_are_an_unknown_layout(tmp_path: Path) -> None:
    dit, state = _written(tmp_path)
    state = {k: v for k, v in state.items() if not k.endswith("weight_scale")}
    save_file(state, str(dit))
    with pytest.raises(CheckpointError, match=rf"{dit}: tensor .* quantized layout Inferix does not read"):
        load_wan_model(dit.parent)


def test_a_quantized_folder_refuses_another_mode(tmp_path: Path) -> None:
    dit, _ = _written(tmp_path)
    for other in ("fp8", "none"):
        with pytest.raises(CheckpointError, match=rf"{dit} holds int8-quantized weights.*--quant {other}"):
            load_wan_model(dit.parent, quant=other)


def test_bad_quant_values_get_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="--quant 'int4' is not a quantization mode; choose one of none, int8"):
        parse_quant("int4")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferix_cli",
            "generate",
            "--prompt",
            "a",
            "--quant",
            "int4",
            "--out",
            str(tmp_path / "v.mp4"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--quant 'int4' is not a quantization mode" in result.stderr
    # An Ampere GPU has no fp8 tensor cores (torch's device query answers as such a GPU would).
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(UserError, match=r"fp8 tensor cores.*A100-SXM4-80GB \(sm_80\); use --quant int8"):
        check_quant_device(True, "cuda:0")
    check_quant_device(False, "cuda:0")  # int8 runs there


def test_quantize_cli_writes_a_folder_and_refuses_a_used_path(tmp_path: Path) -> None:
    out = tmp_path / "toyworld-int8"
    command = [sys.executable, "-m", "inferix_cli", "quantize", "--quant", "int8", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "DiT" in done.stderr and f"--model {out}" in done.stderr
    assert sorted(p.name for p in out.iterdir())[:2] == ["dit-int8.safetensors", "model.yaml"]
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 2 and "already exists" in again.stderr
    tiny = subprocess.run(
        [*command[:-1], str(tmp_path / "t"), "--model", "tiny"], capture_output=True, text=True, check=False
    )
    assert tiny.returncode == 2 and "quantize it on load" in tiny.stderr
    assert not (tmp_path / "t").exists() and not list(tmp_path.glob(".t.*"))


def test_a_model_yaml_can_ask_for_a_mode(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for item in TOYWORLD_WEIGHTS.iterdir():
        (folder / item.name).symlink_to(item)
    (folder / "model.yaml").unlink()
    (folder / "model.yaml").write_text((TOYWORLD_WEIGHTS / "model.yaml").read_text() + "quant: int8-wo\n")
    assert load_wan_model(folder).dit.blocks[0].ffn[0].mode.name == "int8-wo"
    (folder / "model.yaml").write_text((TOYWORLD_WEIGHTS / "model.yaml").read_text() + "quant: int3\n")
    with pytest.raises(UserError, match=r"model.yaml: 'quant: int3' is not a mode"):
        load_wan_model(folder)


def test_a_sharded_folder_mixing_quantized_and_unquantized_shards_names_them(tmp_path: Path) -> None:
    _, quantized = _written(tmp_path)
    full = load_file(TOYWORLD_WEIGHTS / "toyworld_dit.safetensors")
    dit = tmp_path / "dit"
    dit.mkdir()
    (dit / "config.json").write_text("{}")
    first = {k: v for k, v in quantized.items() if k.startswith("blocks.0.")}  # block 0 quantized
    second = {k: v for k, v in full.items() if not k.startswith("blocks.0.")}  # the rest not
    save_file(first, str(dit / "part-1.safetensors"))
    save_file(second, str(dit / "part-2.safetensors"))
    weight_map = {**dict.fromkeys(first, "part-1.safetensors"), **dict.fromkeys(second, "part-2.safetensors")}
    (dit / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    folder = tmp_path / "int8"
    yaml_path = folder / "model.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("dit: dit-int8.safetensors", f"dit: {dit}"))
    with pytest.raises(CheckpointError, match=r"mixes quantized and unquantized.*\(in part-1.*\(in part-2"):
        load_wan_model(folder)


def test_quantize_cli_refuses_a_family_that_runs_unquantized(tmp_path: Path) -> None:
    out = tmp_path / "mg-int8"
    command = [sys.executable, "-m", "inferix_cli", "quantize", "--model", "matrixgame2-tiny", "--quant", "int8"]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--quant int8: Matrix-Game 2.0 runs unquantized" in done.stderr
    assert not out.exists()
