"""gpu-check's results.md: one table per stage from results.json."""

from __future__ import annotations

from typing import Any

from gpucheck.harness import GOAL_FPS, GOAL_TTFF_S, TARGETS
from gpucheck.stages_pods import POD_STRATEGIES


# ---- results.md ---------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}e}" if value and abs(value) < 10**-digits else f"{value:.{digits}f}"
    return str(value)


def _row(*cells: Any) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], align: str) -> list[str]:
    """A markdown table head; `align` has one letter per column: l(eft) or r(ight)."""
    return [_row(*header), _row(*("---:" if a == "r" else "---" for a in align))]


def _stage(results: dict[str, Any], name: str) -> dict[str, Any]:
    return next((s for s in results["stages"] if s["name"] == name), {})


def _metrics(results: dict[str, Any], name: str) -> dict[str, Any]:
    metrics: dict[str, Any] = _stage(results, name).get("metrics", {})
    return metrics


def _why(entry: dict[str, Any]) -> str:
    """What a table cell says for a figure that is not there."""
    return f"{entry.get('status', 'n/a')}: {entry['reason']}" if entry.get("reason") else entry.get("status", "n/a")


def render_markdown(results: dict[str, Any]) -> str:
    setup = _metrics(results, "setup")
    lines = ["# GPU check results", ""]
    if results["dry_run"]:
        lines += [
            "**Dry run on the CPU at toy sizes**: it proves every stage runs; its figures say nothing of a GPU.",
            "",
        ]
    packages = ", ".join(f"{k} {v}" for k, v in setup.get("attention_packages", {}).items())
    lines += [
        f"`{results['command']}`, {results['started']}: {results.get('total_s', 0)} s of a {results['budget_s']:.0f} s "
        "budget.",
        "",
        f"- GPU: {setup.get('gpu') or 'none'} x {setup.get('device_count', 0)}, "
        f"{setup.get('gpu_memory_gib', 'n/a')} GiB, "
        f"compute capability {setup.get('compute_capability', 'n/a')}, driver {setup.get('driver', 'n/a')}",
        f"- torch {setup.get('torch', 'n/a')}, CUDA runtime {setup.get('cuda_runtime', 'n/a')}, "
        f"cuDNN {setup.get('cudnn', 'n/a')}, Python {setup.get('python', 'n/a')}",
        f"- attention: the engine's `auto` backend is {setup.get('engine_attention_backend', 'n/a')}; {packages}",
        "",
        *_table(["stage", "status", "s", "reason"], "llrl"),
    ]
    lines += [_row(s["name"], s["status"], s.get("seconds", ""), s.get("reason", "")) for s in results["stages"]]
    lines += _correctness_md(results) + _speed_md(results) + _pods_md(results)
    lines += ["", "## Commands", ""]
    lines += [f"- {s['name']}: `{command}`" for s in results["stages"] for command in s.get("commands", [])]
    return "\n".join(lines) + "\n"


def _correctness_md(results: dict[str, Any]) -> list[str]:
    fp32, bf16 = _metrics(results, "golden-fp32"), _metrics(results, "golden-bf16")
    lines = ["", "## Correctness"]
    if fp32 or bf16:
        lines += [
            "",
            f"### Golden vectors on {results['device']}: max abs diff from the reference (fp32, CPU)",
            "",
            f"fp32 with TF32 off: {fp32.get('above_tolerance', 'n/a')} of {fp32.get('comparisons', 'n/a')} comparisons "
            f"above {fp32.get('tolerance', 'n/a')} (asserted). bf16: measured, not asserted.",
            "",
            *_table(["case", "tensors", "fp32", "bf16"], "llrr"),
        ]
        for case, families in (fp32.get("by_case") or bf16.get("by_case") or {}).items():
            for family in families:
                a = fp32.get("by_case", {}).get(case, {}).get(family)
                b = bf16.get("by_case", {}).get(case, {}).get(family)
                lines.append(_row(case, family, _fmt(a, 2), _fmt(b, 2)))
    toy = _metrics(results, "toyworld")
    runs = {k.removesuffix("_vs_cpu_fp32"): v for k, v in toy.items() if k.endswith("_vs_cpu_fp32")}
    if runs:
        lines += ["", "### toyworld: frames vs the CPU in fp32", ""]
        lines += _table(["run", "PSNR dB", "worst frame dB", "identical frames", "max pixel diff"], "lrrrr")
        for name, r in runs.items():
            psnr = "identical" if r["psnr_db"] is None else r["psnr_db"]
            worst = "identical" if r["min_frame_psnr_db"] is None else r["min_frame_psnr_db"]
            lines.append(_row(name, psnr, worst, f"{r['identical_frames']} / {r['frames']}", r["max_abs_pixel_diff"]))
    cli = toy.get("cli")
    if cli:
        lines += [
            "",
            f"`inferix generate` on {results['device']}: time to first block {cli['time_to_first_block_s']} s, "
            f"{cli['frames_per_s']} frames/s, real-time factor {cli['real_time_factor']}, "
            f"MP4 of {cli['mp4_bytes']} bytes.",
        ]
    return lines


def _speed_md(results: dict[str, Any]) -> list[str]:
    lines = ["", f"## Speed (random weights, {results['sizes']} shapes)"]
    e2e = _metrics(results, "e2e")
    shape = e2e.get("shape")
    if shape:
        lines += [
            "",
            f"DiT {shape['dit']} (dim {shape['dim']}, {shape['layers']} layers) at {shape['pixels']} "
            f"(latent {shape['latent']}, {shape['tokens_per_frame']} tokens/frame), {shape['dtype']}, "
            f"{shape['frames_per_block']} latent frames per block, {shape['denoising_steps']} steps + context pass, "
            f"attention window {shape['attention_window']} (-1: every earlier frame), {shape['blocks']} blocks; "
            f"the Wan VAE ({shape['preset']} config) decoding block by block; random prompt embeddings instead of "
            "the text encoder. "
            "Measured through `WanEngine`, as `inferix generate` runs.",
            "",
            *_table(
                ["attention", "DiT ms/block", "last block ms", "VAE ms/block", "FPS", "first frame s", "GiB"], "lrrrrrr"
            ),
        ]
        for backend in ("sdpa", "flash"):
            r = e2e.get(backend, {})
            if r.get("status") == "ok":
                figures = [r["dit_ms_per_block"], r["dit_ms_last_block"], r["vae_ms_per_block"], r["fps"]]
                cells = [_fmt(v) for v in figures] + [
                    _fmt(r["time_to_first_frame_s"], 3),
                    _fmt(r.get("peak_memory_gib")),
                ]
                lines.append(_row(backend, *cells))
            elif r:
                lines.append(_row(backend, _why(r), "", "", "", "", ""))
        lines += _targets_md(e2e, results["dry_run"])
    attention = _metrics(results, "attention")
    if attention.get("shape"):
        a = attention["shape"]
        lines += [
            "",
            f"### Attention: {a['q_tokens']} queries x {a['kv_tokens']} keys, {a['heads']} heads of {a['head_dim']}",
        ]
        lines += ["", *_table(["kernel", "ms", "TFLOP/s"], "lrr")]
        for name, r in attention.items():
            if isinstance(r, dict) and "status" in r:
                ok = r["status"] == "ok"
                lines.append(_row(name, _fmt(r["ms"], 3) if ok else _why(r), _fmt(r.get("tflops"))))
        lines += [f"- {note}" for note in _stage(results, "attention").get("notes", [])]
    lines += _kv_md(_metrics(results, "kv-offload"))
    bench = _metrics(results, "bench-engine")
    if bench.get("output"):
        lines += [
            "",
            "### bench/engine_speed.py: paged KV pool vs the contiguous cache",
            "",
            "```",
            bench["output"],
            "```",
        ]
    lines += _batching_md(_metrics(results, "batching"))
    lines += _engine_speed_md(_metrics(results, "engine-speed"))
    lines += _quant_md(_metrics(results, "quant"))
    magi = _metrics(results, "magi")
    if magi.get("output"):
        lines += ["", "### bench/magi.py: MAGI-1 seconds per chunk", "", "```", magi["output"], "```"]
    extras = _metrics(results, "extras")
    if extras:
        lines += ["", "### If present", "", *_table(["feature", "status"], "ll")]
        for name, r in extras.items():
            lines.append(_row(name, f"{r['fps']:.0f} frames/s at {r['size']}" if r.get("fps") else _why(r)))
    return lines


def _quant_md(quant: dict[str, Any]) -> list[str]:
    rows = [(label, quant[label]) for label in quant if isinstance(quant[label], dict)]
    if not rows:
        return []
    lines = ["", f"### Quantization (int8 kernel: {quant.get('int8_kernel', '?')})", ""]
    lines += _table(["variant", "DiT ms/block", "fps", "rel L2 vs none", "DiT GiB"], "lrrrr")
    for label, r in rows:
        if r.get("status") != "ok":
            lines.append(_row(label, r.get("status", "?"), r.get("reason", ""), "", ""))
            continue
        figures = (_fmt(r["dit_ms_per_block"], 1), _fmt(r["fps"], 2), f"{r['rel_l2_vs_none']:.2e}")
        lines.append(_row(label, *figures, _fmt(r["dit_weight_gib"], 2)))
    return lines


def _engine_speed_md(speed: dict[str, Any]) -> list[str]:
    modes = [m for m in ("eager", "compiled", "cuda_graphs") if m in speed]
    if not modes:
        return []
    lines = ["", "### DiT step modes: eager, --compile, --cuda-graphs (window of 4 blocks, the first the sink)", ""]
    lines += _table(["mode", "setup s", "fill ms/block", "rolling ms/block", "max abs diff vs eager"], "lrrrr")
    for mode in modes:
        r = speed[mode]
        figures = (_fmt(r["setup_s"], 1), _fmt(r["fill_ms_per_block"], 1), _fmt(r["rolling_ms_per_block"], 1))
        lines.append(_row(mode, *figures, f"{r['max_abs_diff_vs_eager']:.2e}"))
    return lines


def _batching_md(batching: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for label in ("native", "half"):
        r = batching.get(label)
        if not r:
            continue
        lines += ["", f"### Continuous batching at {r['pixels']}: {r['streams_at_realtime']} streams at real time", ""]
        lines += _table(["N", "1-at-a-time fps", "batched fps", "ratio", "fps per stream", "max abs diff"], "rrrrrr")
        for row in r["rows"]:
            figures = (row["one_at_a_time_fps"], row["batched_fps"], row["ratio"], row["fps_per_stream"])
            lines.append(_row(row["sessions"], *(_fmt(v, 2) for v in figures), f"{row['max_abs_diff']:.2e}"))
    return lines


def _targets_md(e2e: dict[str, Any], dry_run: bool) -> list[str]:
    if dry_run:  # toy figures next to H100 ones would compare nothing
        lines = ["", "Public targets (one H100), compared on a GPU run only:", ""]
        return lines + [f"- {who}: {figure}" for who, figure, _ in TARGETS]
    best = "flash" if e2e.get("flash", {}).get("status") == "ok" else "sdpa"
    ours: dict[str, Any] = e2e.get(best, {})
    if ours.get("status") != "ok":
        return []
    fps, ttff = ours["fps"], ours["time_to_first_frame_s"]
    mine = {
        "fps": f"{fps:.1f} FPS",
        "dit_ms": f"{ours['dit_ms_per_block']:.0f} ms per block (last block {ours['dit_ms_last_block']:.0f} ms)",
        "goal": f"{fps:.1f} FPS ({'met' if fps >= GOAL_FPS else 'not met'}), "
        f"{ttff:.2f} s ({'met' if ttff <= GOAL_TTFF_S else 'not met'})",
    }
    lines = ["", f"Public targets, for comparison (theirs on one H100; ours above, with {best}):", ""]
    lines += _table(["who", "their figure", "ours"], "lll")
    return lines + [_row(who, figure, mine[key]) for who, figure, key in TARGETS]


def _kv_md(kv: dict[str, Any]) -> list[str]:
    if "offload_gb_per_s" not in kv:
        return []
    raw = kv.get("raw_pinned", {})
    link = (
        f"Raw pinned copies of the same size: device to host {raw['d2h_gb_per_s']:.2f} GB/s, "
        f"host to device {raw['h2d_gb_per_s']:.2f} GB/s."
        if raw.get("status") == "ok"
        else f"Raw pinned copies: {_why(raw)}."
    )
    return [
        "",
        f"### KV host offload: {kv['frames']} latent frames ({_fmt(kv['session_bytes'] / 2**20, 2)} MiB), "
        "KVPool offload / prefetch",
        "",
        f"offload {kv['offload_gb_per_s']:.2f} GB/s (the first {kv['offload_gb_per_s_first']:.2f}: it allocates the "
        f"host buffers), restore {kv['restore_gb_per_s']:.2f} GB/s (the first {kv['restore_gb_per_s_first']:.2f}); "
        f"bit-exact: {kv['bit_exact']}. {link}",
    ]


def _pods_md(results: dict[str, Any]) -> list[str]:
    stage = _stage(results, "pods")
    pods = stage.get("metrics", {})
    lines = ["", "## Pods: 2 ranks vs one device", ""]
    if "single" not in pods:
        return [*lines, f"{stage.get('status', 'not run')}: {stage.get('reason', '')}"]
    lines += [f"Backend {pods.get('backend')}; one device: {pods['single']['ms_per_block']:.1f} ms per block.", ""]
    lines += _table(["strategy", "plan", "ms/block", "speed-up", "max abs diff vs one device"], "llrrr")
    for strategy in POD_STRATEGIES:
        r = pods.get(strategy)
        if r:
            speedup = f"{r['speedup_vs_single']:.2f}x"
            lines.append(
                _row(strategy, r["plan"], _fmt(r["ms_per_block"]), speedup, _fmt(r["max_abs_diff_vs_single"], 2))
            )
    return lines
