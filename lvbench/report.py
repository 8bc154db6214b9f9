"""The human-readable side of an evaluation: report.html with a summary table and PNG curves.

* `curves.png`: one panel per metric, every video's chunk scores relative to its first chunk
  (m_i / m_1), so drift reads the same way for every metric and many videos fit one figure;
* `plots/<video>.png`: one panel per metric with the raw chunk scores and the video's VDE;
* `report.html`: the summary table (means over the videos each metric scored), a table per
  video (VDE, VBench score, errors) and the figures. Weight-free backends are marked, since
  their numbers are not comparable with published ones.
"""

from __future__ import annotations

import html
from pathlib import Path

from matplotlib.figure import Figure

from lvbench.evaluate import Evaluation, MetricResult, VideoResult
from lvbench.metrics import METRIC_NAMES

REPORT = "report.html"
_MAX_LEGEND = 12  # more videos than this: the curves figure has no legend
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.err { color: #b00; text-align: left; }
.t { text-align: left; }
img { max-width: 100%; }
"""


def _fmt(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _metric_panels(count: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(3.2 * count, 3.0), layout="constrained")
    axes = fig.subplots(1, count, squeeze=False)[0]
    return fig, list(axes)


def _curves_figure(evaluation: Evaluation, path: Path) -> None:
    names = [n for n in METRIC_NAMES if n in evaluation.summary]
    fig, axes = _metric_panels(len(names))
    for ax, name in zip(axes, names, strict=True):
        for video in evaluation.videos:
            m = video.metrics.get(name)
            if m is not None and m.has_vde and m.chunk_scores[0]:
                first = m.chunk_scores[0]
                relative = [s / first for s in m.chunk_scores]
                ax.plot(range(1, len(relative) + 1), relative, marker=".", alpha=0.7, label=Path(video.video).stem)
        ax.set_title(f"{name} ({evaluation.summary[name]['backend']})", fontsize=9)
        ax.set_xlabel("chunk")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[0].set_ylabel("score / first chunk")
    if len(evaluation.videos) <= _MAX_LEGEND and axes[0].lines:
        axes[0].legend(fontsize=7)
    fig.savefig(path, dpi=100)


def _video_figure(video: VideoResult, path: Path) -> None:
    rows = [m for m in video.metrics.values() if m.has_vde]
    if not rows:
        return
    fig, axes = _metric_panels(len(rows))
    for ax, m in zip(axes, rows, strict=True):
        ax.plot(range(1, len(m.chunk_scores) + 1), m.chunk_scores, marker="o")
        ax.set_title(f"{m.metric} ({m.backend})\nVDE {_fmt(m.vde_linear)} / log {_fmt(m.vde_log)}", fontsize=9)
        ax.set_xlabel("chunk")
    fig.suptitle(video.video, fontsize=10)
    fig.savefig(path, dpi=80)


def _summary_table(evaluation: Evaluation) -> str:
    head = (
        "<tr><th>metric</th><th>backend</th><th>videos</th><th>failed</th><th>VDE linear</th>"
        "<th>normalised</th><th>VDE log</th><th>normalised</th><th>VBench dimension</th><th>score</th></tr>"
    )
    rows = []
    for name, s in evaluation.summary.items():
        backend = f"{_fmt(s['backend'])}{' (weight-free)' if s['weight_free'] else ''}"
        numbers = [s[k] for k in ("videos_scored", "videos_failed", "vde_linear", "vde_linear_normalized")]
        numbers += [s[k] for k in ("vde_log", "vde_log_normalized")]
        rows.append(
            f"<tr><td>{name}</td><td class='t'>{backend}</td>"
            + "".join(f"<td>{_fmt(c)}</td>" for c in numbers)
            + f"<td class='t'>{_fmt(s['vbench_dimension'])}</td><td>{_fmt(s['vbench_score'])}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _video_section(video: VideoResult, plot: Path | None) -> str:
    title = f"<h3>{html.escape(video.video)}</h3>"
    if video.error:
        return f"{title}<p class='err'>{html.escape(video.error)}</p>"
    info = f"<p>{video.frames} frames, {video.width}x{video.height} @ {video.fps:.3g} fps</p>"
    rows = []
    for m in video.metrics.values():
        rows.append(_metric_row(m))
    table = (
        "<table><tr><th>metric</th><th>VDE linear</th><th>normalised</th><th>VDE log</th><th>normalised</th>"
        "<th>VBench score</th><th>errors</th></tr>" + "".join(rows) + "</table>"
    )
    image = f"<img src='{html.escape(plot.as_posix())}' alt='chunk scores'>" if plot else ""
    return title + info + table + image


def _metric_row(m: MetricResult) -> str:
    cells = [m.vde_linear, m.vde_linear_normalized, m.vde_log, m.vde_log_normalized, m.vbench_score]
    errors = html.escape("; ".join(m.errors))
    return (
        f"<tr><td>{m.metric}</td>"
        + "".join(f"<td>{_fmt(c)}</td>" for c in cells)
        + f"<td class='err'>{errors}</td></tr>"
    )


def write_report(evaluation: Evaluation, out: Path) -> Path:
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    _curves_figure(evaluation, out / "curves.png")
    sections = []
    for index, video in enumerate(evaluation.videos):
        plot = plots / f"{index:04d}_{Path(video.video).stem}.png"
        _video_figure(video, plot)
        sections.append(_video_section(video, plot.relative_to(out) if plot.is_file() else None))
    weight_free = [n for n, s in evaluation.summary.items() if s["weight_free"]]
    note = (
        f"<p>Weight-free proxy backends ({', '.join(weight_free)}): not comparable with published LV-Bench or "
        "VBench numbers.</p>"
        if weight_free
        else ""
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>LV-Bench report</title><style>{_STYLE}</style>"
        f"</head><body><h1>LV-Bench report</h1><p>{len(evaluation.videos)} videos, {evaluation.num_chunks} chunks "
        f"per video; VDE = &Sigma; w<sub>i</sub> |m<sub>i</sub> - m<sub>1</sub>| / |m<sub>1</sub>|, normalised = "
        f"divided by &Sigma; w<sub>i</sub>.</p>{note}<h2>Summary</h2>{_summary_table(evaluation)}"
        "<h2>Drift curves</h2><img src='curves.png' alt='relative chunk scores'>"
        f"<h2>Videos</h2>{''.join(sections)}</body></html>"
    )
    path = out / REPORT
    path.write_text(page, encoding="utf-8")
    return path
