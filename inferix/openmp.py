"""How torch's OpenMP threads wait between parallel regions: set before torch loads its runtime.

libgomp (the runtime of torch's CPU wheels) reads its wait settings once, when it loads. Its default
spins about 300,000 times before a waiting thread sleeps: fastest on an idle machine, and a collapse on a
shared one, where a spinning thread burns the time slice that the thread it waits for needs (a
2-thread toyworld `inferix generate` beside two busy processes: 5.9 frames/s against 55.8 with one
thread). Sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) survives the load but pays a wake-up per
parallel region, and a small model's forward is hundreds of short regions: toyworld ran 2.3x slower
at 2 threads on an idle machine. A short bounded spin (`GOMP_SPINCOUNT=10000`, some microseconds)
keeps the idle speed and falls back to sleeping under load (`python bench/openmp_wait.py`,
bench/RESULTS.md). The bits computed do not change with the wait.
"""

from __future__ import annotations

from collections.abc import Mapping

SPIN_COUNT = 10_000
# Either one set by the user is their choice, and neither is touched.
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def openmp_wait(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` so that OpenMP threads spin at most SPIN_COUNT times before they
    sleep; none where it already says how to wait. Apply before torch is imported: the runtime reads them
    once, when it loads."""
    if any(name in environ for name in USER_SETTINGS):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
