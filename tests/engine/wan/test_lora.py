"""LoRA adapters merged at load (LongLive's released generator = base checkpoint + peft adapter)."""

from __future__ import annotations

import copy
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file

from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.golden import WanCase, check_prompt_switches
from engine.families.wan.loader import load_wan_model
from engine.families.wan.lora import LoraAdapter, merge_lora
from engine.kv import ContiguousKVCache
from inferix.errors import UserError
from tests.engine.tiny import LATENT_H, LATENT_W, TINY_DIT, prompt, tiny_dit
from tests.engine.wan.longlive_folder import GOLDEN_CASE, TARGETS, write_longlive_folder


def _peft_dit(rank: int, alpha: float) -> tuple[CausalWanDiT, peft.PeftModel]:
    """A tiny DiT and a copy wrapped by peft as LongLive wraps its generator, with random LoRA weights."""
    base = tiny_dit(seed=1)
    targets = [f"blocks.{i}.{t}" for i in range(TINY_DIT.num_layers) for t in TARGETS]
    wrapped = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets)
    )
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in wrapped.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return base, wrapped


def _forward(dit: torch.nn.Module, model: CausalWanDiT) -> torch.Tensor:
    cfg = model.config
    cache = ContiguousKVCache(cfg.num_layers, cfg.num_heads, cfg.head_dim, cfg.tokens_per_frame(LATENT_H, LATENT_W), 3)
    x = torch.randn(1, 3, cfg.in_dim, LATENT_H, LATENT_W, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return dit(x, torch.full((1, 3), 500.0), model.encode_prompt(prompt(0)), cache, start_frame=0)


@pytest.mark.parametrize("wrapped_in_generator_lora", [True, False])
def test_the_merge_equals_peft(tmp_path: Path, wrapped_in_generator_lora: bool) -> None:
    rank, alpha = 4, 8.0
    base, wrapped = _peft_dit(rank, alpha)
    saved = peft.get_peft_model_state_dict(wrapped)  # what LongLive's gather_lora_state_dict saves
    assert all(k.startswith("base_model.model.blocks.") for k in saved)
    path = tmp_path / "lora.pt"
    torch.save({"generator_lora": saved} if wrapped_in_generator_lora else saved, path)
    content = torch.load(path, weights_only=True)
    merged_state = merge_lora(base.state_dict(), content, LoraAdapter(path, rank, alpha))
    merged = CausalWanDiT(TINY_DIT, attention_backend="sdpa").eval()
    merged.load_state_dict(merged_state)
    unmerged_peft = _forward(wrapped.base_model.model, base)
    assert (unmerged_peft - _forward(base, base)).abs().max() > 1e-2  # the adapter matters
    assert (_forward(merged, base) - unmerged_peft).abs().max() < 1e-5
    peft_merged = wrapped.merge_and_unload().state_dict()
    assert max((merged_state[k] - peft_merged[k]).abs().max().item() for k in merged_state) < 1e-6


def test_an_adapter_that_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    base, wrapped = _peft_dit(4, 8.0)
    saved = peft.get_peft_model_state_dict(wrapped)
    path = tmp_path / "lora.pt"
    with pytest.raises(UserError, match=r"lora.pt: module 'blocks.0.cross_attn.k' has lora_A \[4, 32\].*not rank 8"):
        merge_lora(base.state_dict(), saved, LoraAdapter(path, 8, 8.0))
    other = {k.replace("blocks.1.", "blocks.7."): v for k, v in saved.items()}
    with pytest.raises(UserError, match="targets 'blocks.7.cross_attn.k', which the DiT has no weight of"):
        merge_lora(base.state_dict(), other, LoraAdapter(path, 4, 8.0))
    lonely = {k: v for k, v in saved.items() if "blocks.0.ffn.0.lora_B" not in k}
    with pytest.raises(UserError, match="module 'blocks.0.ffn.0' has lora_A only"):
        merge_lora(base.state_dict(), lonely, LoraAdapter(path, 4, 8.0))
    with pytest.raises(UserError, match="'step' is not a LoRA weight"):
        merge_lora(base.state_dict(), {"step": torch.zeros(1)}, LoraAdapter(path, 4, 8.0))


def test_a_longlive_folder_loads_base_plus_adapter_and_reproduces_the_switch_golden(tmp_path: Path) -> None:
    folder = write_longlive_folder(tmp_path / "longlive")
    model = load_wan_model(folder)
    assert model.name == "longlive-tiny"
    config = model.pipeline_config
    assert (config.prompt_switch.recache, config.prompt_switch.global_sink) == (True, True)
    golden = load_file(str(GOLDEN_CASE / "dit.safetensors"))
    state = model.dit.state_dict()
    assert max((state[k] - golden[k]).abs().max().item() for k in golden) < 1e-6
    # The merged DiT runs LongLive's prompt switches as the reference did.
    case = WanCase(GOLDEN_CASE)
    case.build_dit = lambda: model.dit  # type: ignore[method-assign]
    results = list(check_prompt_switches(case, 1e-5))
    assert len(results) > 90 and all(r.passed for r in results), [r for r in results if not r.passed][:3]


def test_a_longlive_folder_without_its_adapter_says_how_to_get_it(tmp_path: Path) -> None:
    folder = write_longlive_folder(tmp_path / "longlive")
    (folder / "models" / "lora.pt").unlink()
    with pytest.raises(UserError, match=r"missing the LoRA adapter .*lora.pt or .*models/lora.pt.*copy the adapter"):
        load_wan_model(folder)
    (folder / "models" / "lora.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot read LoRA adapter .*lora.pt: the file is truncated"):
        load_wan_model(folder)
