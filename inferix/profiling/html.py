"""The HTML report: one self-contained page with the summary, plots and region table.

Plots are drawn with matplotlib (Agg, no display needed) and embedded as base64 PNG `<img>`
elements with stable ids, so the page can be mailed or attached to an issue as one file. A small
script marks each plot `data-decoded="yes"` once the browser decoded it, and shows a visible
message under any plot that did not decode.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from html import escape
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from inferix.profiling.report import ProfileReport
from inferix.profiling.text import format_report

_MAX_STAGES = 15
_MAX_OTHER_SERIES = 12
_MIB = 1024.0 * 1024.0

_SCRIPT = """
window.addEventListener("load", () => {
  for (const img of document.querySelectorAll("img.plot")) {
    const decoded = img.complete && img.naturalWidth > 0;
    img.dataset.decoded = decoded ? "yes" : "no";
    if (!decoded) {
      const note = document.createElement("p");
      note.className = "plot-error";
      note.textContent = "This plot could not be displayed: " + img.alt;
      img.after(note);
    }
  }
});
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px; }
pre { background: #f5f5f5; padding: 1em; overflow-x: auto; font-size: 13px; }
img.plot { display: block; max-width: 100%; margin: 1em 0 2em; border: 1px solid #ddd; }
.plot-error { color: #b00; font-weight: bold; }
"""


def write_html(report: ProfileReport, path: str | Path) -> Path:
    """Write the HTML report with its plots (creating its folder); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_html(report), encoding="utf-8")
    return target


def render_html(report: ProfileReport) -> str:
    """The whole page as text."""
    figures = "\n".join(
        f'<h2>{escape(title)}</h2>\n<img class="plot" id="{plot_id}" alt="{escape(title)}" '
        f'src="data:image/png;base64,{_png(draw, report)}">'
        for plot_id, title, draw in _PLOTS
    )
    title = "Inferix profile" + (f": {report.label}" if report.label else "")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<style>{_STYLE}</style>
<script>{_SCRIPT}</script>
</head>
<body>
<h1>{escape(title)}</h1>
<h2>Summary</h2>
<pre id="summary">{escape(format_report(report, max_regions=50))}</pre>
{figures}
</body>
</html>
"""


def _png(draw: Callable[[Figure, ProfileReport], None], report: ProfileReport) -> str:
    figure = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    draw(figure, report)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _no_data(axes: Axes, what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=axes.transAxes, color="#777")
    axes.set_xticks([])
    axes.set_yticks([])


def _from_zero(axes: Axes, highest: float) -> None:
    # A y axis from 0 shows proportions honestly; the headroom keeps a flat line off the frame.
    axes.set_ylim(0, highest * 1.15 if highest > 0 else 1.0)


def _block_latency(figure: Figure, report: ProfileReport) -> None:
    axes = figure.add_subplot()
    if not report.blocks:
        _no_data(axes, "blocks")
        return
    for rank in sorted({b.rank for b in report.blocks}):
        blocks = sorted((b for b in report.blocks if b.rank == rank), key=lambda b: b.done_s)
        axes.plot(
            [b.done_s for b in blocks],
            [b.latency_s * 1e3 for b in blocks],
            marker="o",
            markersize=3,
            label=f"rank {rank}",
        )
    stats = report.summary.block_latency
    if stats is not None:
        axes.axhline(
            stats.p90_s * 1e3,
            color="#999",
            linestyle="--",
            linewidth=1,
            label="p90 (merged)" if report.merged else "p90",
        )
    axes.set_xlabel("block done at (s since session start)")
    axes.set_ylabel("latency (ms)")
    _from_zero(axes, max(b.latency_s for b in report.blocks) * 1e3)
    axes.legend(loc="best")
    axes.grid(alpha=0.3)


def _series_plot(figure: Figure, report: ProfileReport, suffix: str, scale: float, unit: str, what: str) -> None:
    axes = figure.add_subplot()
    highest: float | None = None
    for timeline in report.timelines:
        for name, values in sorted(timeline.series.items()):
            if not name.endswith(suffix):
                continue
            points = [(t, v / scale) for t, v in zip(timeline.t_s, values, strict=True) if v is not None]
            label = name if len(report.timelines) == 1 else f"rank {timeline.rank} {name}"
            axes.plot([t for t, _ in points], [v for _, v in points], label=label)
            highest = max([highest or 0.0, *(v for _, v in points)])
    if highest is None:
        _no_data(axes, what)
        return
    axes.set_xlabel("time (s since session start)")
    axes.set_ylabel(unit)
    _from_zero(axes, highest)
    axes.legend(loc="best", fontsize="small")
    axes.grid(alpha=0.3)


def _memory(figure: Figure, report: ProfileReport) -> None:
    _series_plot(figure, report, "_bytes", _MIB, "MiB", "memory samples")


def _utilization(figure: Figure, report: ProfileReport) -> None:
    _series_plot(figure, report, "_percent", 1.0, "%", "utilisation samples")


def _stages(figure: Figure, report: ProfileReport) -> None:
    axes = figure.add_subplot()
    stages = sorted(report.region_stats, key=lambda s: s.self_s, reverse=True)[:_MAX_STAGES]
    if not stages:
        _no_data(axes, "regions")
        return
    names = [s.name for s in reversed(stages)]
    axes.barh(names, [s.self_s for s in reversed(stages)], color="#4c78a8")
    axes.set_xlabel("self time, all occurrences (s)")
    axes.grid(axis="x", alpha=0.3)


def _other_series(figure: Figure, report: ProfileReport) -> None:
    names = sorted({name for t in report.timelines for name in t.series if not name.endswith(("_bytes", "_percent"))})[
        :_MAX_OTHER_SERIES
    ]
    if not names:
        _no_data(figure.add_subplot(), "gauges, power or clock samples")
        return
    columns = min(3, len(names))
    rows = -(-len(names) // columns)
    figure.set_size_inches(10, 2.2 * rows + 0.5)
    for position, name in enumerate(names, start=1):
        axes = figure.add_subplot(rows, columns, position)
        for timeline in report.timelines:
            values = timeline.series.get(name)
            if values is None:
                continue
            points = [(t, v) for t, v in zip(timeline.t_s, values, strict=True) if v is not None]
            axes.plot([t for t, _ in points], [v for _, v in points], label=f"rank {timeline.rank}")
        axes.set_title(name, fontsize="small")
        axes.tick_params(labelsize="small")
        axes.grid(alpha=0.3)


_PLOTS: list[tuple[str, str, Callable[[Figure, ProfileReport], None]]] = [
    ("plot-block-latency", "Per-block latency over time", _block_latency),
    ("plot-memory", "Memory over time", _memory),
    ("plot-utilization", "CPU and GPU utilisation over time", _utilization),
    ("plot-stages", "Stage breakdown: self time per region name", _stages),
    ("plot-series", "Power, clocks and gauges over time", _other_series),
]

PLOT_IDS = tuple(plot_id for plot_id, _, _ in _PLOTS)
"""Ids of the plot images, in page order (every report has all of them)."""
