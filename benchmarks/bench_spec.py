"""Exploration cost: states, edges and wall time at several bounds, Python vs TLC in the
same run. Usage: .venv/bin/python benchmarks/bench_spec.py [--json]"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rolloutcore.proof import modelcheck
from rolloutcore.proof.explore import explore
from rolloutcore.spec.lifecycle import SPEC, Bounds

BOUNDS = [SPEC.bounds, Bounds(3, 3, 2), Bounds(3, 4, 3)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    tlc_ok = modelcheck.tlc_available() is None
    rows: list[dict[str, Any]] = []
    if not args.json:
        print(f"{'bounds (R,G,F)':16s} {'states':>8s} {'edges':>8s} {'python s':>9s} "
              f"{'TLC s':>7s} {'TLC/python':>10s} equal")
    for b in BOUNDS:
        spec = SPEC.with_bounds(b)
        t0 = time.perf_counter()
        ex = explore(spec)
        py = time.perf_counter() - t0
        row: dict[str, Any] = {"bounds": [b.rollouts, b.generations, b.faults],
                               "states": ex.states, "edges": ex.edges, "python_s": py}
        if tlc_ok:
            run = modelcheck.run_tlc(spec, exploration=ex)
            tlc_s = run.result.seconds
            row.update(tlc_s=tlc_s, tlc_over_python=tlc_s / py, graphs_equal=run.graphs_equal)
            line = f"{tlc_s:7.2f} {tlc_s / py:10.1f} {run.graphs_equal}"
        else:
            line = "  (TLC unavailable)"
        rows.append(row)
        if not args.json:
            print(f"{b.rollouts},{b.generations},{b.faults:<12} {ex.states:8d} {ex.edges:8d} "
                  f"{py:9.2f} {line}", flush=True)
    if args.json:
        print(json.dumps({"tlc_available": tlc_ok, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
