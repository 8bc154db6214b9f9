"""How torch's OpenMP threads wait between parallel regions: set before torch loads its runtime.

libgomp (the runtime of torch's CPU wheels) reads its wait settings once, when it loads. Its default
spins about 300,000 times before a waiting thread sleeps: fastest on an idle machine, and fragile on a
shared one, where a spinning thread burns the time slice that the thread it waits for needs. Sleeping
at once (`OMP_WAIT_POLICY=PASSIVE`) pays a wake-up per parallel region, and a small model's forward is
hundreds of short regions: on an idle machine toyworld at 2 threads ran 2.0-2.8x slower than with a
short bounded spin (`GOMP_SPINCOUNT=10000`, some microseconds), which keeps 0.75-0.98x the default's
speed. Beside busy processes the three settings trade places from run to run; one torch thread is the
robust choice there (`python -P bench/openmp_wait.py`, bench/RESULTS.md). The bits computed do not
change with the wait.
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
