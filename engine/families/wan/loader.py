"""Model folders (``--model PATH``) and `load_wan_model`: from a folder, or nothing, to runnable models.

Layout of a model folder (paths relative to it; every name can be changed in ``model.yaml``)::

    PATH/model.yaml                          optional: ``preset: <name>`` + overrides of its sections
    PATH/self_forcing_dmd.pt                 the DiT checkpoint (Self Forcing; or checkpoints/...),
    PATH/model.pt                            or CausVid's (or autoregressive_checkpoint/model.pt),
                                             or any file / Wan folder named by files.dit in model.yaml
    PATH/Wan2.1_VAE.pth                      Wan2.1 VAE
    PATH/models_t5_umt5-xxl-enc-bf16.pth     umt5-xxl text encoder
    PATH/google/umt5-xxl/                    its tokenizer (tokenizer.json or spiece.model)

Without ``model.yaml`` the preset is detected from the DiT checkpoint's file name; a Wan model
folder (``config.json`` + ``diffusion_pytorch_model.safetensors``) is never auto-detected as the
DiT, because the Wan2.1 release folder itself is one (the bidirectional base model, not a causal
few-step model): name it in ``files.dit`` explicitly.

Without a folder, `load_wan_model` loads the built-in ``toyworld`` model: a tiny causal Wan model of
the toyworld simulator, whose weights ship in the package as a model folder of this layout
(``models/toyworld/weights``, written by `make train-toyworld`). ``tiny`` names the other built-in
model: deterministic random weights made in-process, for smoke tests. Neither needs a download.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from engine.checkpoint import load_into, parse_dtype, seeded_state_dict
from engine.decoders.select import load_decoder
from engine.decoders.taehv import TAEHVDecoder
from engine.families.wan.autoencoders import load_vae
from engine.families.wan.checkpoint import load_dit
from engine.families.wan.dit import CausalWanDiT
from engine.families.wan.lora import LoraAdapter
from engine.families.wan.patch_vae import PatchVAE
from engine.families.wan.text_encoder import PromptEncoder, UMT5Encoder
from engine.families.wan.tokenizer import EOS_TOKEN, PAD_TOKEN, TOKENIZER_JSON, PromptTokenizer
from engine.families.wan.vae import WanVAE
from engine.precision import warn_if_emulated
from engine.quant import QuantMode, check_quant_device, parse_quant, quantize_linears
from inferix.errors import UserError
from inferix.spec.architectures import PatchVAEConfig
from inferix.spec.decoders import DecoderChoice, parse_decoder
from inferix.spec.presets import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    ModelFiles,
    ModelPreset,
    available_presets,
    load_preset,
    read_yaml,
)
from inferix.spec.sampling import PipelineConfig
from inferix.spec.served import AnyPreset

__all__ = [
    "MODEL_YAML",
    "LoadedModel",
    "ModelDirectory",
    "TOYWORLD_WEIGHTS",
    "builtin_model_name",
    "byte_level_tokenizer",
    "load_wan_model",
    "resolve_model_dir",
    "write_byte_level_tokenizer",
]

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)

MODEL_YAML = "model.yaml"
TOYWORLD_WEIGHTS = Path(__file__).resolve().parent / "weights" / "toyworld"
TOYWORLD_PLAY_WEIGHTS = Path(__file__).resolve().parent / "weights" / "toyworld_play"
# Built-in trained models: their weights folder and the command that writes it. A variant preset of a
# trained model (toyworld-play-1f) runs that model's weights under its own preset.
TRAINED_BUILTINS = {
    "toyworld": (TOYWORLD_WEIGHTS, "make train-toyworld"),
    "toyworld-play": (TOYWORLD_PLAY_WEIGHTS, "make train-toyworld-play"),
    "toyworld-play-1f": (TOYWORLD_PLAY_WEIGHTS, "make train-toyworld-play"),
}
UNK_TOKEN = "<unk>"
# Ids of the byte-level tokenizer: T5's special ids first (pad 0, eos 1, unk 2), then one per byte.
BYTE_TOKENIZER_SPECIALS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)


@dataclass(frozen=True)
class ModelDirectory:
    """A model folder resolved against its preset: every file checked to exist."""

    root: Path
    preset: ModelPreset
    files: ModelFiles  # the preset's files section
    dit: Path
    vae: Path
    text_encoder: Path
    tokenizer: Path
    adapter: LoraAdapter | None = None  # merged into the DiT at load (files.lora)


class PresetDefaults:
    """A loaded model's name, frame rate and native size, read from its preset (any family)."""

    preset: AnyPreset

    @property
    def name(self) -> str:
        return self.preset.name

    @property
    def fps(self) -> int:
        return self.preset.video.fps

    @property
    def height(self) -> int:
        return self.preset.video.height

    @property
    def width(self) -> int:
        return self.preset.video.width


@dataclass
class LoadedModel(PresetDefaults):
    """Everything a generation needs, loaded in one dtype on one device."""

    preset: ModelPreset
    dit: CausalWanDiT
    vae: WanVAE | PatchVAE
    prompt_encoder: PromptEncoder
    source: Path | None  # the model folder; None for built-in random weights
    # What its sessions decode with (preset / model.yaml `decoder:`, or `--decoder`): the VAE, or TAEHV.
    decoder_choice: DecoderChoice = dataclasses.field(default_factory=DecoderChoice)
    taehv: TAEHVDecoder | None = None

    @property
    def pipeline_config(self) -> PipelineConfig:
        return self.preset.pipeline

    @property
    def decoder(self) -> WanVAE | PatchVAE | TAEHVDecoder:
        """The streaming decoder of every session, its restore and its re-decode (so all decode alike)."""
        return self.vae if self.taehv is None else self.taehv

    def with_decoder(self, choice: DecoderChoice) -> LoadedModel:
        """The model with `choice` as its decoder (TAEHV loaded in the VAE's dtype, on its device)."""
        weight = next(self.vae.parameters())
        taehv = load_decoder(choice, self.vae, weight.dtype, weight.device)
        return dataclasses.replace(self, decoder_choice=choice, taehv=taehv)


def _file_presets() -> list[ModelPreset]:
    return [p for p in map(load_preset, available_presets()) if p.files is not None]


def _detect_preset(root: Path) -> ModelPreset:
    """The preset whose DiT checkpoint file name is in ``root`` (exactly one must match)."""
    candidates = _file_presets()
    found = [p for p in candidates if p.files is not None and any((root / f).is_file() for f in p.files.dit)]
    if len(found) == 1:
        return found[0]
    expected = "; ".join(f"{p.name}: {' or '.join(p.files.dit)}" for p in candidates if p.files is not None)
    if not found:
        raise UserError(
            f"model folder {root} has no {MODEL_YAML} and no known DiT checkpoint (looked for {expected}); "
            f"add the checkpoint, or write {root / MODEL_YAML} with 'preset: <name>' and 'files: {{dit: ...}}'"
        )
    raise UserError(
        f"model folder {root} holds DiT checkpoints of several presets ({', '.join(p.name for p in found)}); "
        f"write {root / MODEL_YAML} with 'preset: <name>' to choose"
    )


def _read_model_yaml(path: Path, preset_name: str | None) -> ModelPreset:
    data = read_yaml(path, "model config")
    preset = data.pop("preset", None)
    if not isinstance(preset, str):
        raise UserError(
            f"{path} must name a preset, e.g. 'preset: self-forcing-dmd' (available: {', '.join(available_presets())})"
        )
    return load_preset(preset_name or preset, data, str(path))


def _required(root: Path, relative: str, what: str, how: str) -> Path:
    path = root / relative
    if not path.exists():
        raise UserError(f"model folder {root}: missing {what} {path}; {how}")
    return path


def resolve_model_dir(path: str | Path, preset_name: str | None = None) -> ModelDirectory:
    """Find the preset of a model folder (``model.yaml`` or detection) and check that its files exist.

    ``preset_name`` replaces the preset ``model.yaml`` names (its overrides still apply): a built-in
    variant preset over the weights of the model it varies. Each error names the expected path and
    how to get the file.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise UserError(
            f"model folder {root} does not exist or is not a directory; see the model folder layout in the "
            "README, or omit --model to run the built-in toyworld model"
        )
    yaml_path = root / MODEL_YAML
    preset = _read_model_yaml(yaml_path, preset_name) if yaml_path.is_file() else _detect_preset(root)
    files = preset.files
    if files is None:
        raise UserError(
            f"{yaml_path}: preset {preset.name!r} has built-in random weights and reads no files; "
            f"run it with --model {preset.name}"
        )
    base_how = _how(files.base_source, root, "the Wan2.1-T2V-1.3B release files")
    dit = next((root / f for f in files.dit if (root / f).exists()), None)
    if dit is None:
        raise UserError(
            f"model folder {root}: missing the DiT checkpoint {' or '.join(str(root / f) for f in files.dit)}; "
            f"{_how(files.dit_source, root, 'the checkpoint of ' + preset.name)}"
        )
    adapter = None
    if files.lora:
        lora = next((root / f for f in files.lora if (root / f).is_file()), None)
        if lora is None:
            raise UserError(
                f"model folder {root}: missing the LoRA adapter {' or '.join(str(root / f) for f in files.lora)} "
                f"that preset {preset.name!r} merges into its DiT; "
                f"{_how(files.lora_source, root, 'the adapter of ' + preset.name)}"
            )
        adapter = LoraAdapter(lora, files.lora_rank, files.lora_alpha)
    return ModelDirectory(
        root=root,
        preset=preset,
        files=files,
        dit=dit,
        vae=_required(root, files.vae, "the VAE weights", base_how),
        text_encoder=_required(root, files.text_encoder, "the text encoder weights", base_how),
        tokenizer=_required(root, files.tokenizer, "the tokenizer folder", base_how),
        adapter=adapter,
    )


def _preset_quant(preset: ModelPreset, root: Path) -> QuantMode | None:
    """The quantization the model folder asks for (None: whatever its checkpoint holds)."""
    if preset.quant == "none":
        return None
    try:
        return parse_quant(preset.quant)
    except UserError as exc:
        raise UserError(f"{root / MODEL_YAML}: 'quant: {preset.quant}' is not a mode ({exc})") from None


def _how(source: str, root: Path, what: str) -> str:
    get = f"get it with: {source.replace('{folder}', str(root))}" if source else f"copy {what} there"
    return f"{get} (or set its path under 'files:' in {root / MODEL_YAML})"


def write_byte_level_tokenizer(folder: Path) -> Path:
    """Write the byte-level tokenizer's ``tokenizer.json`` into ``folder`` (made if missing); returns its path.

    One token per UTF-8 byte plus pad / EOS / unk: a byte-level BPE without merges in the HF
    ``tokenizers`` format, which `PromptTokenizer` reads the same way as umt5's. Built from code, so
    the models that use it (tiny, toyworld) need no download.
    """
    vocab = {token: i for i, token in enumerate(BYTE_TOKENIZER_SPECIALS)}
    for char in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TOKENIZER_JSON
    tokenizer.save(str(path))
    return path


def byte_level_tokenizer(text_len: int) -> PromptTokenizer:
    """The byte-level tokenizer (see `write_byte_level_tokenizer`), for the built-in tiny model."""
    with tempfile.TemporaryDirectory(prefix="inferix-byte-tokenizer-") as folder:
        write_byte_level_tokenizer(Path(folder))
        return PromptTokenizer(folder, text_len=text_len)


def _load_random(
    preset: ModelPreset, dtype: torch.dtype, device: torch.device | str, backend: str, quant: QuantMode
) -> LoadedModel:
    seed = preset.random_weights_seed
    if seed is None:
        raise UserError(f"preset {preset.name!r} reads its weights from a model folder; pass its path")
    source = f"built-in random weights of preset {preset.name!r} (seed {seed})"

    def build(factory: Callable[[], ModuleT], as_dtype: torch.dtype | None = dtype) -> ModuleT:
        return load_into(factory, seeded_state_dict(factory, seed), source, dtype=as_dtype, device=device)

    # A quantized DiT is quantized from the fp32 values, as a checkpoint of them would be.
    dit = build(lambda: CausalWanDiT(preset.dit, attention_backend=backend), None if quant.enabled else dtype)
    if quant.enabled:
        check_quant_device(quant.is_fp8, device)
        dit = quantize_linears(dit, quant).to(dtype)
    vae_config = preset.vae
    vae: WanVAE | PatchVAE = (
        build(lambda: PatchVAE(vae_config))
        if isinstance(vae_config, PatchVAEConfig)
        else build(lambda: WanVAE(vae_config))
    )
    encoder = build(lambda: UMT5Encoder(preset.text_encoder))
    tokenizer = byte_level_tokenizer(preset.text_encoder.text_len)
    return LoadedModel(preset, dit, vae, PromptEncoder(tokenizer, encoder), source=None)


def builtin_model_name(path: str | Path) -> str | None:
    """The built-in model ``path`` names (`BUILTIN_MODELS`), unless a folder of that name exists."""
    name = str(path)
    return name if name in BUILTIN_MODELS and not Path(name).exists() else None


def load_wan_model(
    path: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: str = "auto",
    quant: str | QuantMode | None = None,
    decoder: str | None = None,
) -> LoadedModel:
    """Load the model of a model folder, or a built-in model: ``toyworld`` (the default when ``path``
    is None; trained weights shipped in the package), ``toyworld-play`` (toyworld with a player the
    arrow keys steer; also trained and shipped), ``toyworld-play-1f`` (its weights with one-frame
    blocks, for interactive play) or ``tiny`` (random weights, for smoke tests).

    All three networks get ``dtype`` (fp32 / bf16 / fp16) and ``device``. ``quant`` (`--quant`;
    None: the preset's / model.yaml's) quantizes the DiT's block linears (`engine.quant`).
    ``decoder`` (`--decoder`, "vae" or "taehv:PATH"; None: the preset's / model.yaml's) picks what
    decodes the latents (`inferix.spec.decoders`).
    """
    return _with_decoder(_load_model(path, dtype, device, attention_backend, quant), decoder)


def _with_decoder(model: LoadedModel, decoder: str | None) -> LoadedModel:
    if decoder is not None:
        return model.with_decoder(parse_decoder(decoder, "--decoder"))
    where = f"{model.source / MODEL_YAML}: decoder" if model.source is not None else f"preset {model.name}: decoder"
    return model.with_decoder(parse_decoder(model.preset.decoder, where, relative_to=model.source))


def _load_model(
    path: str | Path | None,
    dtype: torch.dtype | str,
    device: torch.device | str,
    attention_backend: str,
    quant: str | QuantMode | None,
) -> LoadedModel:
    weight_dtype = parse_dtype(dtype)
    warn_if_emulated(weight_dtype, device)
    requested = None if quant is None else parse_quant(quant)
    source = DEFAULT_MODEL if path is None else path
    builtin = builtin_model_name(source)
    if builtin == "tiny":
        preset = load_preset("tiny")
        mode = requested or parse_quant(preset.quant)
        return _load_random(preset, weight_dtype, device, attention_backend, mode)
    if builtin in TRAINED_BUILTINS:
        weights, command = TRAINED_BUILTINS[builtin]
        if not (weights / MODEL_YAML).is_file():
            raise UserError(
                f"the {builtin} weights are missing from {weights}; "
                f"train them with `{command}`, or pass --model tiny / a model folder"
            )
        source = weights
    folder = resolve_model_dir(source, preset_name=builtin if builtin in TRAINED_BUILTINS else None)
    preset = folder.preset
    dit = load_dit(
        folder.dit,
        preset.dit,
        dtype=weight_dtype,
        device=device,
        weights=folder.files.dit_weights,
        attention_backend=attention_backend,
        quant=requested or _preset_quant(preset, folder.root),
        adapter=folder.adapter,
    )
    if dit.config != preset.dit:  # a Wan model folder's config.json defines the DiT
        try:
            preset = dataclasses.replace(preset, dit=dit.config)
        except ValueError as exc:
            raise UserError(f"{folder.dit / 'config.json'} does not fit preset {preset.name!r}: {exc}") from exc
    vae = load_vae(folder.vae, preset.vae, dtype=weight_dtype, device=device)
    encoder = UMT5Encoder.from_checkpoint(folder.text_encoder, preset.text_encoder, device=device, dtype=weight_dtype)
    tokenizer = PromptTokenizer(folder.tokenizer, text_len=preset.text_encoder.text_len)
    return LoadedModel(preset, dit, vae, PromptEncoder(tokenizer, encoder), source=folder.root)
