"""The HTML report renders in a real browser: every plot is a PNG that headless Chromium decodes."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from inferix.profiling import Profiler, ProfileReport, merge_reports, profile
from inferix.profiling.html import PLOT_IDS, write_html

CHROMIUM_INSTALL = "apt-get update && apt-get install -y chromium  (or: make system-deps)"


def _chromium() -> str:
    for candidate in ("chromium", "chromium-browser", "/usr/bin/chromium"):
        found = shutil.which(candidate)
        if found:
            return found
    pytest.fail(
        f"headless Chromium is needed to check the HTML report and was not found; install it: {CHROMIUM_INSTALL}"
    )


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _profiled_rank(rank: int) -> ProfileReport:
    """A short real session (CPU clock, background sampling, a KV gauge) of one of two ranks."""
    pages = {"used_pages": 0, "total_pages": 64}
    profiler = Profiler(
        device="cpu", rank=rank, world_size=2, fps=16.0, label="html <check>", sample_interval_s=0.005, otel=False
    )
    profiler.add_gauge("kv_pool", lambda: pages)
    with profiler.session():
        for index in range(6):
            with profiler.block(index) as block:
                with profile("denoise_step", step=0):
                    _busy(0.004 + 0.001 * rank)
                with profile("vae_decode"):
                    _busy(0.002)
                pages["used_pages"] += 4
                block.pixel_frames = 9 if rank == 0 else 0
    return profiler.report()


def _plots(html: str) -> dict[str, tuple[str, bytes]]:
    images = re.findall(r'<img class="plot" id="([^"]+)" alt="([^"]+)" src="data:image/png;base64,([^"]+)">', html)
    return {plot_id: (alt, base64.b64decode(data)) for plot_id, alt, data in images}


def test_html_report_plots_decode_in_headless_chromium(tmp_path: Path) -> None:
    chromium = _chromium()
    report = merge_reports([_profiled_rank(0), _profiled_rank(1)])
    page = write_html(report, tmp_path / "report.html")
    html = page.read_text(encoding="utf-8")

    plots = _plots(html)
    assert tuple(plots) == PLOT_IDS
    for plot_id, (alt, png) in plots.items():
        image = Image.open(io.BytesIO(png))
        assert image.format == "PNG" and image.width >= 400 and image.height >= 200, plot_id
        image.load()  # decodes every pixel: a truncated or corrupt PNG fails here
        assert len(image.getcolors(maxcolors=1_000_000) or []) > 5, f"{plot_id} ({alt}) is blank"
    assert "html &lt;check&gt;" in html  # the label is escaped

    result = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    for plot_id in PLOT_IDS:
        tag = re.search(rf'<img[^>]*id="{plot_id}"[^>]*>', dom)
        assert tag is not None, f"{plot_id} missing from the rendered page"
        assert 'data-decoded="yes"' in tag.group(0), f"Chromium did not decode {plot_id}: {tag.group(0)[:200]}"
    assert 'class="plot-error"' not in dom
