"""Matrix-Game 2.0 golden cases (`tests/golden/matrixgame2_*`, MATRIXGAME2_README.md): the
stage-by-stage checks that `inferix verify-golden` runs on them.

Stages: the scheduler and warped steps; the action RoPE table; conditioning (CLIP pixels and
tokens, the VAE-encoded first frame, cond_concat); the stand-alone DiT calls with their per-layer
taps (fresh caches, a continuation, the keyboard-only path); the whole pipeline (every step's
x_t / flow / x0, the context passes, the latents, every cache and its indices after the run); the
VAE decode of the golden fp16-rounded latents.

Golden tensors use the reference layout [B, C, F, h, w]; the engine's is [B, F, C, h, w].
Tolerances: the DiT stages take the caller's (1e-5 by default; the reference and we both run fp32,
with other kernels: ~1e-6). The VAE stages are bounded apart: the encoder and the decoder sum in
other orders (channels-last oneDNN convolutions), ~1e-6 per value, and the per-frame channel sums
add 1536 such values.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from engine.families.matrixgame.action import ActionInputs, ActionRope
from engine.families.matrixgame.clip import CLIPVisionConfig, CLIPVisionEncoder
from engine.families.matrixgame.conditioning import WorldConditioning, cond_concat, image_latents
from engine.families.matrixgame.config import MatrixGameConfig
from engine.families.matrixgame.dit import ActionStep, MatrixGameDiT
from engine.families.matrixgame.loader import load_matrixgame_dit
from engine.families.matrixgame.pipeline import MatrixGameLoop, MatrixGamePipeline
from engine.families.wan.vae import WanVAE
from engine.flow_match import FlowMatchSchedule
from engine.golden import Comparison, GoldenCase, run_checks
from engine.golden import max_abs_diff as _diff
from engine.noise import RecordedNoise
from inferix.spec.architectures import WanVAEConfig
from inferix.spec.sampling import BlockConfig, FlowMatchConfig, PipelineConfig, SamplingConfig

__all__ = ["MatrixGameCase", "is_matrixgame_case", "verify_matrixgame_case"]


def is_matrixgame_case(case: GoldenCase) -> bool:
    """A Matrix-Game 2.0 golden case (MATRIXGAME2_README.md layout)."""
    return "action_config" in case.config.get("dit_config_json", {})


# Stage bounds apart from the caller's tolerance (see the module docstring); the measured
# differences are ~10x below them.
VAE_TOLERANCE = 2e-5
FRAME_SUM_TOLERANCE = 1e-3
# The pipeline's own video: latents within the DiT tolerance may round to a neighbouring fp16
# value before decoding (one fp16 step of a small latent moves pixels by ~1e-5..1e-4).
PIPELINE_VIDEO_TOLERANCE = 5e-4


def _engine(t: Tensor) -> Tensor:
    """[B, C, F, h, w] -> [B, F, C, h, w]."""
    return t.transpose(1, 2)


class MatrixGameCase(GoldenCase):
    """Lazy access to one Matrix-Game golden folder."""

    def dit(self) -> MatrixGameDiT:
        config = MatrixGameConfig.from_reference(self.config["dit_config_json"], int(self.config["dit"]["clip_dim"]))
        return load_matrixgame_dit(self.folder / "dit.safetensors", config, attention_backend="sdpa")

    def vae(self) -> WanVAE:
        vae = self.config["vae"]
        config = WanVAEConfig(
            dim=int(vae["dim"]),
            z_dim=int(vae["z_dim"]),
            dim_mult=tuple(vae["dim_mult"]),
            num_res_blocks=int(vae["num_res_blocks"]),
            attn_scales=tuple(vae["attn_scales"]),
            temperal_downsample=tuple(vae["temperal_downsample"]),
            latent_mean=tuple(vae["latent_mean"]),
            latent_std=tuple(vae["latent_std"]),
        )
        return WanVAE.from_checkpoint(self.folder / "vae.safetensors", config)

    def clip(self) -> CLIPVisionEncoder:
        config = CLIPVisionConfig.from_dict(self.config["clip"])
        return CLIPVisionEncoder.from_checkpoint(self.folder / "clip_visual.safetensors", config)

    def pipeline_config(self) -> PipelineConfig:
        p, s = self.config["pipeline"], self.config["scheduler"]
        sampling = SamplingConfig(
            denoising_steps=tuple(p["denoising_step_list_config"]),
            warp=bool(p["warp_denoising_step"]),
            context_noise=float(p["context_noise"]),
            schedule=FlowMatchConfig(int(s["num_train_timesteps"]), float(s["shift"]), float(s["sigma_min"]),
                                     float(s["sigma_max"])),
        )  # fmt: skip
        block = BlockConfig(int(p["num_frame_per_block"]), int(p["local_attn_size"]), int(p["sink_size"]))
        return PipelineConfig(block=block, sampling=sampling)

    def actions(self, rows: int | None = None, mouse: bool = True) -> ActionInputs:
        inputs = self.tensors("inputs")
        keyboard, moves = inputs["keyboard_cond"], inputs["mouse_cond"]
        return ActionInputs(keyboard[:, :rows], moves[:, :rows] if mouse else None)

    def conditioning(self) -> WorldConditioning:
        c = self.tensors("conditioning")
        return WorldConditioning(_engine(c["cond_concat"]), c["visual_context"])


def check_scheduler(case: MatrixGameCase, tol: float) -> list[Comparison]:
    config = case.pipeline_config()
    schedule = FlowMatchSchedule(config.sampling.schedule)
    golden = case.tensors("scheduler")
    steps = schedule.denoising_timesteps(config.sampling)
    used = torch.tensor(case.config["pipeline"]["denoising_step_list_used"], dtype=torch.float32)
    lookup = case.config["scheduler"]["sigma_lookup"]
    sigma = max(abs(float(schedule.sigma(torch.tensor([float(t)]))) - entry["sigma"]) for t, entry in lookup.items())
    return [
        Comparison(case.name, "scheduler/sigmas", _diff(schedule.sigmas, golden["sigmas"]), 0.0),
        Comparison(case.name, "scheduler/timesteps", _diff(schedule.timesteps, golden["timesteps"]), 0.0),
        Comparison(case.name, "scheduler/warped steps", _diff(steps, used), 0.0),
        Comparison(case.name, "scheduler/sigma lookup", sigma, 0.0),
    ]


def check_action_rope(case: MatrixGameCase, tol: float) -> list[Comparison]:
    config = MatrixGameConfig.from_reference(case.config["dit_config_json"]).action
    outputs = case.tensors("outputs")
    rows = outputs["action_rope_cos_first32"].shape[0]
    cos, sin = ActionRope(config).table(0, rows, torch.device("cpu"))
    return [
        Comparison(case.name, "action_rope/cos", _diff(cos, outputs["action_rope_cos_first32"]), tol),
        Comparison(case.name, "action_rope/sin", _diff(sin, outputs["action_rope_sin_first32"]), tol),
    ]


def check_conditioning(case: MatrixGameCase, tol: float) -> list[Comparison]:
    golden = case.tensors("conditioning")
    image = case.tensors("inputs")["image"][:, :, 0]
    clip = case.clip()
    frames = golden["img_cond"].shape[2]
    with torch.no_grad():
        pixels = clip.pixels(image)
        tokens = clip(golden["clip_pixels"])
        latents = image_latents(case.vae(), image, frames)
    return [
        Comparison(case.name, "conditioning/clip_pixels", _diff(pixels, golden["clip_pixels"]), tol),
        Comparison(case.name, "conditioning/visual_context", _diff(tokens, golden["visual_context"]), tol),
        Comparison(case.name, "conditioning/img_cond", _diff(latents, _engine(golden["img_cond"])), VAE_TOLERANCE),
        Comparison(
            case.name,
            "conditioning/cond_concat",
            _diff(cond_concat(_engine(golden["img_cond"])), _engine(golden["cond_concat"])),
            0.0,
        ),
    ]


def check_dit_forward(case: MatrixGameCase, tol: float) -> list[Comparison]:
    """The stand-alone calls: 0 on fresh caches, 1 continuing 0's caches, 2 fresh without mouse."""
    dit = case.dit()
    golden = case.tensors("dit_forward")
    cond = case.conditioning()
    pipeline = MatrixGamePipeline(dit, case.vae(), case.pipeline_config())
    schedule = pipeline.schedule
    results: list[Comparison] = []
    session: MatrixGameLoop | None = None
    for entry in case.config["dit_forward_cases"]:
        n = entry["call"]
        if entry["fresh_cache"] or session is None:
            session = pipeline.open_session(cond, case.actions(), RecordedNoise(torch.zeros(0), {}))
        first, last = entry["cond_concat_frames"]
        x, t = _engine(golden[f"dit_fwd_in{n}"]), golden[f"dit_fwd_t{n}"]
        capture: dict[str, Tensor] = {}
        action = ActionStep(case.actions(entry["action_frames"], entry["mouse"]), session.action_caches)
        with torch.no_grad():
            context = dit.encode_context(cond.visual_context, capture)
            inputs = torch.cat([x, cond.cond_concat[:, first:last]], dim=2)
            flow = dit(inputs, t, context, session.cache, entry["start_frame"], action, capture)
        x0 = schedule.x0_from_flow(x, flow, t)
        worst = max(_diff(value, golden[f"dit_fwd_{name}_{n}"]) for name, value in capture.items())
        missing = [tap for tap in entry["taps"] if tap not in capture]
        results += [
            Comparison(case.name, f"dit_forward/call{n} taps", worst if not missing else float("inf"), tol),
            Comparison(case.name, f"dit_forward/call{n} flow", _diff(flow, _engine(golden[f"dit_fwd_flow{n}"])), tol),
            Comparison(case.name, f"dit_forward/call{n} x0", _diff(x0, _engine(golden[f"dit_fwd_x0_{n}"])), tol),
        ]
    return results


def check_pipeline(case: MatrixGameCase, tol: float) -> list[Comparison]:
    """The whole run from the recorded noise: every call, the latents, the caches, the video."""
    inputs, golden = case.tensors("inputs"), case.tensors("outputs")
    renoise = {}
    for key, value in inputs.items():
        if key.startswith("renoise_b"):
            block_id, step_id = key.removeprefix("renoise_b").split("_s")
            renoise[(int(block_id), int(step_id))] = value
    noise = RecordedNoise(_engine(inputs["initial_noise"]), renoise)
    pipeline = MatrixGamePipeline(case.dit(), case.vae(), case.pipeline_config())
    session = pipeline.open_session(case.conditioning(), case.actions(), noise, record_steps=True)
    blocks = [session.generate_block() for _ in range(session.num_blocks)]
    worst = {"xin": 0.0, "flow": 0.0, "x0": 0.0, "flow ctx": 0.0}
    for block in blocks:
        b = block.index
        for s, record in enumerate(block.steps):
            worst["xin"] = max(worst["xin"], _diff(record.x, _engine(golden[f"xin_b{b}_s{s}"])))
            worst["flow"] = max(worst["flow"], _diff(record.flow, _engine(golden[f"flow_b{b}_s{s}"])))
            worst["x0"] = max(worst["x0"], _diff(record.x0, _engine(golden[f"x0_b{b}_s{s}"])))
        assert block.context_flow is not None
        worst["flow ctx"] = max(worst["flow ctx"], _diff(block.context_flow, _engine(golden[f"flow_b{b}_ctx"])))
    steps = sum(len(block.steps) for block in blocks) + len(blocks)
    results = [Comparison(case.name, f"pipeline/every {k}", v, tol) for k, v in worst.items()]
    results.append(Comparison(case.name, "pipeline/calls made", float(abs(steps - len(case.config["call_log"]))), 0.0))
    latents = torch.cat([block.latents for block in blocks], dim=1)
    results.append(Comparison(case.name, "pipeline/latents", _diff(latents, _engine(golden["latents"])), tol))
    results += _check_caches(case, session, golden, tol)
    video = torch.cat([block.video for block in blocks], dim=1)
    results.append(Comparison(case.name, "pipeline/video", _diff(video, golden["video"]), PIPELINE_VIDEO_TOLERANCE))
    session.close()
    return results


def check_vae(case: MatrixGameCase, tol: float) -> list[Comparison]:
    """The golden latents rounded to fp16, decoded block by block with one streaming state."""
    golden = case.tensors("outputs")
    vae = case.vae()
    latents = _engine(golden["latents"]).half().float()
    nf = case.pipeline_config().block.num_frame_per_block
    state = vae.new_decode_state()
    video = torch.cat([vae.decode_block(latents[:, i : i + nf], state) for i in range(0, latents.shape[1], nf)], 1)
    sums = video.double().sum(dim=(3, 4))[0]
    return [
        Comparison(case.name, "vae/video", _diff(video, golden["video"]), VAE_TOLERANCE),
        Comparison(case.name, "vae/frame channel sums", _diff(sums, golden["video_frame_channel_sum"]),
                   FRAME_SUM_TOLERANCE),
    ]  # fmt: skip


def _check_caches(
    case: MatrixGameCase, session: MatrixGameLoop, golden: dict[str, Tensor], tol: float
) -> list[Comparison]:
    """Every cache after the run (in the reference's slot order) and its end indices."""
    tokens = session.cache.tokens_per_frame
    frames = session.cache.frames
    indices_off = 0.0
    kv = xattn = action = 0.0
    for layer in range(session.dit.config.dit.num_layers):
        k, v = session.cache.layer_kv(layer)
        kv = max(
            kv,
            _diff(k.unsqueeze(0), golden[f"kv_l{layer}_k"]),
            _diff(v.unsqueeze(0), golden[f"kv_l{layer}_v"]),
        )
        ends = ((frames[-1] + 1) * tokens, len(frames) * tokens)
        indices_off = max(indices_off, _index_error(golden, f"kv_l{layer}", ends))
        xattn = max(
            xattn,
            _diff(session.context.keys[layer], golden[f"xattn_l{layer}_k"]),
            _diff(session.context.values[layer], golden[f"xattn_l{layer}_v"]),
        )
    for layer, caches in zip(session.dit.action_layers, session.action_caches, strict=True):
        for prefix, cache in ((f"kb_l{layer}", caches.keyboard), (f"ms_l{layer}", caches.mouse)):
            if f"{prefix}_k" not in golden:
                continue
            assert cache.k is not None and cache.v is not None
            action = max(action, _diff(cache.k, golden[f"{prefix}_k"]), _diff(cache.v, golden[f"{prefix}_v"]))
            indices_off = max(indices_off, _index_error(golden, prefix, (cache.global_end, cache.local_end)))
    return [
        Comparison(case.name, "cache/self-attn K/V", kv, tol),
        Comparison(case.name, "cache/cross-attn K/V", xattn, tol),
        Comparison(case.name, "cache/keyboard+mouse K/V", action, tol),
        Comparison(case.name, "cache/end indices", indices_off, 0.0),
    ]


def _index_error(golden: dict[str, Tensor], prefix: str, ends: tuple[int, int]) -> float:
    expected = (int(golden[f"{prefix}_global_end_index"]), int(golden[f"{prefix}_local_end_index"]))
    return float(max(abs(a - b) for a, b in zip(ends, expected, strict=True)))


def check_listed_stages(case: MatrixGameCase, tol: float) -> list[Comparison]:
    """The reference's own checks (checks.json and config `checks`) must report a pass."""
    results = []
    checks_file = case.folder / "checks.json"
    if checks_file.is_file():
        checks = json.loads(checks_file.read_text())
        results.append(Comparison(case.name, "reference/checks.json pass", 0.0 if checks.get("pass") else 1.0, 0.0))
    flags = [v for v in case.config.get("checks", {}).values() if isinstance(v, bool)]
    results.append(Comparison(case.name, "reference/config checks", float(flags.count(False)), 0.0))
    return results


CHECKS: tuple[Callable[[MatrixGameCase, float], list[Comparison]], ...] = (
    check_listed_stages,
    check_scheduler,
    check_action_rope,
    check_conditioning,
    check_dit_forward,
    check_pipeline,
    check_vae,
)


def verify_matrixgame_case(folder: Path, tolerance: float) -> list[Comparison]:
    case = MatrixGameCase(folder)
    with torch.no_grad():
        return run_checks(case.name, ((check.__name__, partial(check, case, tolerance)) for check in CHECKS))
