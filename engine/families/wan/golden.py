"""Golden checks of the Wan family (Self Forcing, CausVid, LongLive): schedule, DiT calls, the block
loop with its KV cache, prompt switches, text encoder, VAE and the whole chain, against a case folder
in the Self Forcing layout (tests/golden/README.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import Tensor

from engine.families.wan.autoencoders import load_vae
from engine.families.wan.dit import CausalWanDiT, DiTCall
from engine.families.wan.pipeline import BlockOutput, DiTJob, Early, WanPipeline
from engine.families.wan.text_encoder import UMT5Encoder
from engine.families.wan.vae import WanVAE, to_unit_range
from engine.flow_match import FlowMatchSchedule
from engine.golden import Comparison, GoldenCase, _diff, run_checks
from engine.kv.session_cache import PagedSessionCache
from engine.noise import RecordedNoise
from inferix.spec.architectures import UMT5Config, WanDiTConfig, WanVAEConfig
from inferix.spec.parity import GOLDEN_TOLERANCE
from inferix.spec.sampling import BlockConfig, FlowMatchConfig, PipelineConfig, PromptSwitchConfig, SamplingConfig

_RENOISE_KEY = re.compile(r"renoise_b(\d+)_s(\d+)$")
_PROMPT_KEY = re.compile(r"(.*)prompt_embeds_seg(\d+)$")


class WanCase(GoldenCase):
    """A case in the Self Forcing layout: its DiT and block-loop configuration."""

    @classmethod
    def of(cls, case: GoldenCase) -> WanCase:
        return cls(case.folder, case.device, case.dtype)

    def dit_config(self) -> WanDiTConfig:
        return WanDiTConfig.from_dict(self.config["dit"])

    def pipeline_config(self) -> PipelineConfig:
        p = self.config["pipeline"]
        s = self.config["scheduler"]
        warp = bool(p["warp_denoising_step"])
        steps = p["denoising_step_list_config"] if warp else p["denoising_step_list_used"]
        dtype: Literal["float32", "int64"] = "int64" if "int64" in p["denoising_step_list_used_dtype"] else "float32"
        sampling = SamplingConfig(
            denoising_steps=tuple(steps),
            warp=warp,
            timestep_dtype=dtype,
            context_noise=float(p["context_noise"]),
            schedule=FlowMatchConfig(
                num_train_timesteps=int(s.get("num_train_timesteps", 1000)),
                shift=float(s["shift"]),
                sigma_min=float(s.get("sigma_min", 0.0)),
                sigma_max=float(s.get("sigma_max", 1.0)),
            ),
        )
        block = BlockConfig(
            num_frame_per_block=int(p["num_frame_per_block"]),
            local_attn_size=int(p["local_attn_size"]),
            sink_size=int(p["sink_size"]),
        )
        return PipelineConfig(block=block, sampling=sampling)

    def build_dit(self) -> CausalWanDiT:
        dit = CausalWanDiT(self.dit_config(), attention_backend="sdpa")
        dit.load_state_dict(self.tensors("dit"), strict=True)
        return dit.to(device=self.device, dtype=self.dtype).eval()


# ---- checks -------------------------------------------------------------------------------
def check_schedule(case: WanCase, tol: float) -> Iterator[Comparison]:
    pipeline = case.pipeline_config()
    schedule = FlowMatchSchedule(pipeline.sampling.schedule)
    golden = case.tensors("scheduler")
    yield Comparison(case.name, "scheduler.sigmas", _diff(schedule.sigmas, golden["sigmas"]), tol)
    yield Comparison(case.name, "scheduler.timesteps", _diff(schedule.timesteps, golden["timesteps"]), 0.0)
    used = torch.tensor(case.config["pipeline"]["denoising_step_list_used"], dtype=torch.float64)
    ours = schedule.denoising_timesteps(pipeline.sampling).double()
    yield Comparison(case.name, "pipeline.denoising_timesteps", _diff(ours, used), 0.0)


# (a layer's K or V as this process caches it, frames cached) -> the session's whole cache
KVView = Callable[[Tensor, int], Tensor]


def check_dit_forward(case: WanCase, tol: float, dit: CausalWanDiT | None = None) -> Iterator[Comparison]:
    """Two stand-alone DiT calls on a fresh cache; the second attends to the first.

    `dit` (default: the case's) may be sequence-parallel: its cache then holds this rank's shard.
    """
    if not case.has("dit_forward"):
        return
    dit = dit or case.build_dit()
    pipeline_cfg = case.pipeline_config()
    schedule = FlowMatchSchedule(pipeline_cfg.sampling.schedule)
    data = case.tensors("dit_forward")
    prompt = dit.encode_prompt(case.tensors("inputs")["prompt_embeds"])
    _, frames, _, h, w = data["dit_fwd_in0"].shape
    cache = WanPipeline(dit, pipeline_cfg).open_cache(None, "dit_forward", h, w, frames=2 * frames)
    with torch.no_grad():
        for call in (0, 1):
            x, t = data[f"dit_fwd_in{call}"], data[f"dit_fwd_t{call}"]
            flow = dit(x, t, prompt, cache, start_frame=call * frames)
            x0 = schedule.x0_from_flow(x, flow, t)
            yield Comparison(case.name, f"dit_forward.flow{call}", _diff(flow, data[f"dit_fwd_flow{call}"]), tol)
            yield Comparison(case.name, f"dit_forward.x0_{call}", _diff(x0, data[f"dit_fwd_x0_{call}"]), tol)


def _finish_job(dit: CausalWanDiT, job: DiTJob[BlockOutput], call: DiTCall) -> BlockOutput:
    """Run a block job alone from its pending `call` on (`run_solo` after its first calls)."""
    try:
        while True:
            call = _dit_call(job.send(dit.forward_batch([call])[0]))
    except StopIteration as done:
        return cast(BlockOutput, done.value)


def _dit_call(call: DiTCall | Early) -> DiTCall:
    """A loop's block job asked for no `Early` output yields DiT calls only."""
    assert isinstance(call, DiTCall), call
    return call


def _recorded_noise(inputs: dict[str, Tensor]) -> RecordedNoise:
    renoise = {
        (int(m.group(1)), int(m.group(2))): t for key, t in inputs.items() if (m := _RENOISE_KEY.match(key)) is not None
    }
    return RecordedNoise(inputs["initial_noise"], renoise)


def check_pipeline(
    case: WanCase, tol: float, dit: CausalWanDiT | None = None, kv_view: KVView | None = None
) -> Iterator[Comparison]:
    """The full block loop with the recorded noise: x0 of every step, latents, final KV cache.

    With a sequence-parallel `dit`, `kv_view` gathers the ranks' cache shards for the comparison.
    """
    if not case.has("outputs"):
        return
    dit = dit or case.build_dit()
    inputs = case.tensors("inputs")
    outputs = case.tensors("outputs")
    noise = _recorded_noise(inputs)
    pipeline = WanPipeline(dit, case.pipeline_config())
    _, frames, _, h, w = inputs["initial_noise"].shape
    num_blocks = frames // pipeline.config.block.num_frame_per_block
    session = pipeline.open_session(
        inputs["prompt_embeds"], h, w, noise=noise, num_blocks=num_blocks, record_steps=True
    )
    blocks = list(session)
    for block in blocks:
        for step, x0 in enumerate(block.step_x0):
            key = f"x0_b{block.index}_s{step}"
            yield Comparison(case.name, f"pipeline.{key}", _diff(x0, outputs[key]), tol)
    latents = torch.cat([b.latents for b in blocks], dim=1)
    yield Comparison(case.name, "pipeline.latents", _diff(latents, outputs["latents"]), tol)
    yield from _compare_kv(case, "kv_cache", session.cache, outputs, "kv", tol, kv_view)
    session.close()


def _compare_kv(
    case: WanCase,
    name: str,
    cache: PagedSessionCache,
    golden: dict[str, Tensor],
    key: str,
    tol: float,
    kv_view: KVView | None = None,
) -> Iterator[Comparison]:
    """The cache's saved layers against `{key}_l{layer}_{k,v}` [1, cache tokens, H, D], up to the
    reference's local end index (its cache in frame order, as `layer_kv` returns ours)."""
    cached_frames = len(cache.frames)
    for layer in case.config.get("kv_cache", {}).get("layers_saved", []):
        end_key = f"{key}_l{layer}_local_end_index"
        for kind, local in zip("kv", cache.layer_kv(layer), strict=True):
            ours = local if kv_view is None else kv_view(local, cached_frames)
            used = int(golden[end_key][0]) if end_key in golden else ours.shape[0]
            reference = golden[f"{key}_l{layer}_{kind}"][0, :used]
            yield Comparison(case.name, f"{name}.layer{layer}.{kind}", _diff(ours, reference), tol)


def check_prompt_switches(case: WanCase, tol: float) -> Iterator[Comparison]:
    """LongLive's prompt switches with KV re-cache (`config.json:switch_case`, `switch.safetensors`):
    for each variant (a key prefix and its `global_sink`), the block loop with its recorded noise,
    switching prompt before the first block whose start frame reaches the next switch index, as the
    reference's rule does. Compared: every step's x0, the latents, the cache right after each
    re-cache and at the end, the segments' prompt embeddings and the video."""
    spec = case.config.get("switch_case")
    if spec is None:
        return
    data = case.tensors(Path(spec.get("file", "switch.safetensors")).stem)
    dit = case.build_dit()
    # The segments' prompts, shared by the variants: `<p>prompt_embeds_seg{i}` from `<p>text_ids_seg{i}`.
    prompt_keys = {int(m.group(2)): m.group(1) for k in data if (m := _PROMPT_KEY.match(k)) is not None}
    embeds = [data[f"{prompt_keys[i]}prompt_embeds_seg{i}"] for i in range(len(prompt_keys))]
    if case.has("text"):
        encoder = _text_encoder(case)
        for i, stem in prompt_keys.items():
            ids, mask = data[f"{stem}text_ids_seg{i}"], data[f"{stem}text_mask_seg{i}"]
            with torch.no_grad():
                ours = encoder.prompt_embeds(ids, mask)
            yield Comparison(case.name, f"switch.prompt_embeds_seg{i}", _diff(ours, embeds[i]), tol)
    vae = _vae(case) if case.has("vae") else None
    variants: dict[str, dict[str, Any]] = spec["variants"]
    for prefix, variant in variants.items():
        name = prefix.rstrip("_")
        # This variant's keys, not those of a variant whose prefix extends it ("switch_nosink_" of "switch_").
        longer = [p for p in variants if p != prefix and p.startswith(prefix)]
        own = {k[len(prefix) :]: t for k, t in data.items() if k.startswith(prefix) and not k.startswith(tuple(longer))}
        switches = PromptSwitchConfig(recache=True, global_sink=bool(variant["global_sink"]))
        config = dataclasses.replace(case.pipeline_config(), prompt_switch=switches)
        pipeline = WanPipeline(dit, config)
        noise = _recorded_noise(own)
        _, frames, _, h, w = noise.initial_noise.shape
        nf = config.block.num_frame_per_block
        at = list(spec["switch_frame_indices"])
        session = pipeline.open_session(embeds[0], h, w, noise=noise, num_blocks=frames // nf, record_steps=True)
        blocks, segment, recaches = [], 0, 0
        with torch.no_grad():
            for index in range(frames // nf):
                if segment < len(at) and index * nf >= at[segment]:
                    segment += 1
                    session.set_prompt(embeds[segment], recache=True)
                job = session.block_job()
                call = _dit_call(next(job))
                if call.kind == "context_pass":  # the re-cache pass opens a block after a switch
                    call = _dit_call(job.send(dit.forward_batch([call])[0]))
                    key = f"recache{recaches}_kv"
                    yield from _compare_kv(case, f"{name}.recache{recaches}", session.cache, own, key, tol)
                    recaches += 1
                blocks.append(_finish_job(dit, job, call))
        for block in blocks:
            for step, x0 in enumerate(block.step_x0):
                key = f"x0_b{block.index}_s{step}"
                yield Comparison(case.name, f"{name}.{key}", _diff(x0, own[key]), tol)
        latents = torch.cat([b.latents for b in blocks], dim=1)
        yield Comparison(case.name, f"{name}.latents", _diff(latents, own["latents"]), tol)
        yield from _compare_kv(case, f"{name}.kv_cache", session.cache, own, "kv", tol)
        session.close()
        if vae is not None:
            state = vae.new_decode_state()
            video = torch.cat([vae.decode_block(b.latents, state) for b in blocks], dim=1)
            yield from _compare_video(case, f"{name}.video", video, tol, own)


def _vae(case: WanCase) -> WanVAE:
    config = WanVAEConfig.from_dict(case.config["vae"])
    return load_vae(case.folder / "vae.safetensors", config, dtype=case.dtype, device=case.device)


def _text_encoder(case: WanCase) -> UMT5Encoder:
    config = UMT5Config.from_dict(case.config["text_encoder"])
    return UMT5Encoder.from_checkpoint(case.folder / "text.safetensors", config, dtype=case.dtype, device=case.device)


def _compare_video(
    case: WanCase,
    prefix: str,
    video: Tensor,
    tol: float,
    golden: dict[str, Tensor] | None = None,
    key: str = "video_",
) -> Iterator[Comparison]:
    """`video` [1, T, 3, H, W] in [-1, 1] against the stored slices of a pipeline video ([0, 1]):
    `{key}first_block`, `{key}last_latent_frame`, `{key}frame_channel_sum` (default: the outputs')."""
    unit = to_unit_range(video)
    outputs = case.tensors("outputs") if golden is None else golden
    first = outputs[f"{key}first_block"]
    yield Comparison(case.name, f"{prefix}.first_block", _diff(unit[:, : first.shape[1]], first), tol)
    last = outputs[f"{key}last_latent_frame"]
    yield Comparison(case.name, f"{prefix}.last_latent_frame", _diff(unit[:, -last.shape[1] :], last), tol)
    # Per-frame, per-channel means (the stored fp64 sums over H x W, divided by H * W).
    pixels = unit.shape[-1] * unit.shape[-2]
    means = unit[0].double().sum(dim=(2, 3)) / pixels
    golden_means = outputs[f"{key}frame_channel_sum"] / pixels
    yield Comparison(case.name, f"{prefix}.frame_channel_mean", _diff(means, golden_means), tol)


def check_text_encoder(case: WanCase, tol: float) -> Iterator[Comparison]:
    """umt5 encoder: token ids -> embeddings (padding rows zeroed, and raw)."""
    if not case.has("text") or not case.has("text_case"):
        return
    encoder = _text_encoder(case)
    data = case.tensors("text_case")
    with torch.no_grad():
        raw = encoder(data["text_ids"], data["text_mask"])
        zeroed = encoder.prompt_embeds(data["text_ids"], data["text_mask"])
        inputs = case.tensors("inputs")
        prompt = encoder.prompt_embeds(inputs["text_ids"], inputs["text_mask"])
    yield Comparison(case.name, "text_encoder.embeds_unzeroed", _diff(raw, data["text_embeds_unzeroed"]), tol)
    yield Comparison(case.name, "text_encoder.embeds", _diff(zeroed, data["text_embeds"]), tol)
    yield Comparison(case.name, "text_encoder.prompt_embeds", _diff(prompt, inputs["prompt_embeds"]), tol)


def check_vae(case: WanCase, tol: float) -> Iterator[Comparison]:
    """VAE decode of the golden latents, one-shot and block by block (which must agree bitwise)."""
    if not case.has("vae"):
        return
    vae = _vae(case)
    latents = case.tensors("outputs")["latents"]
    nf = int(case.config["pipeline"]["num_frame_per_block"])
    oneshot = vae.decode(latents)
    state = vae.new_decode_state()
    streamed = torch.cat([vae.decode_block(latents[:, i : i + nf], state) for i in range(0, latents.shape[1], nf)], 1)
    yield from _compare_video(case, "vae.oneshot", oneshot, tol)
    yield from _compare_video(case, "vae.streaming", streamed, tol)
    yield Comparison(case.name, "vae.streaming_vs_oneshot", _diff(streamed, oneshot), 0.0)


def check_full_chain(case: WanCase, tol: float) -> Iterator[Comparison]:
    """Token ids -> text encoder -> block loop (recorded noise) -> streaming VAE decode -> video."""
    if not (case.has("text") and case.has("vae")):
        return
    inputs = case.tensors("inputs")
    with torch.no_grad():
        prompt = _text_encoder(case).prompt_embeds(inputs["text_ids"], inputs["text_mask"])
    pipeline = WanPipeline(case.build_dit(), case.pipeline_config())
    _, frames, _, h, w = inputs["initial_noise"].shape
    nf = pipeline.config.block.num_frame_per_block
    vae = _vae(case)
    state = vae.new_decode_state()
    with pipeline.open_session(prompt, h, w, noise=_recorded_noise(inputs), num_blocks=frames // nf) as session:
        blocks = list(session)
        video = torch.cat([vae.decode_block(b.latents, state) for b in blocks], dim=1)
    latents = torch.cat([b.latents for b in blocks], dim=1)
    yield Comparison(case.name, "chain.latents", _diff(latents, case.tensors("outputs")["latents"]), tol)
    yield from _compare_video(case, "chain.video", video, tol)


CHECKS: list[Callable[[WanCase, float], Iterator[Comparison]]] = [
    check_schedule,
    check_dit_forward,
    check_pipeline,
    check_text_encoder,
    check_vae,
    check_full_chain,
    check_prompt_switches,
]


def verify_case(case: WanCase, tolerance: float = GOLDEN_TOLERANCE) -> list[Comparison]:
    torch.manual_seed(0)
    return run_checks(case.name, ((check.__name__, partial(check, case, tolerance)) for check in CHECKS))
