"""Exploration cost: states, edges and wall time at several bounds, Python vs TLC in the
same run. Usage: .venv/bin/python benchmarks/bench_spec.py"""

from __future__ import annotations

import time

from rolloutcore import modelcheck
from rolloutcore.explore import explore
from rolloutcore.spec.lifecycle import SPEC, Bounds

BOUNDS = [SPEC.bounds, Bounds(3, 3, 2), Bounds(3, 4, 3)]


def main() -> None:
    tlc_ok = modelcheck.tlc_available() is None
    print(f"{'bounds (R,G,F)':16s} {'states':>8s} {'edges':>8s} {'python s':>9s} "
          f"{'TLC s':>7s} {'TLC/python':>10s} equal")
    for b in BOUNDS:
        spec = SPEC.with_bounds(b)
        t0 = time.perf_counter()
        ex = explore(spec)
        py = time.perf_counter() - t0
        if tlc_ok:
            run = modelcheck.run_tlc(spec, exploration=ex)
            tlc_s = run.result.seconds
            print(f"{b.rollouts},{b.generations},{b.faults:<12} {ex.states:8d} {ex.edges:8d} "
                  f"{py:9.2f} {tlc_s:7.2f} {tlc_s / py:10.1f} {run.graphs_equal}")
        else:
            print(f"{b.rollouts},{b.generations},{b.faults:<12} {ex.states:8d} {ex.edges:8d} "
                  f"{py:9.2f}   (TLC unavailable)")


if __name__ == "__main__":
    main()
