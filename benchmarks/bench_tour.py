"""The spec-generated tour: how many schedules and steps cover every edge class, and what
replaying them costs on the simulator and (with ``--vllm``) on a real vLLM CPU server.

Printed per engine: edge classes in the spec (tour bounds), realised, not realisable;
schedules and steps; wall time of the cover and per step; then ``--walks`` random walks
(steps and wall time). The real server's start-up is reported apart (not part of the
tour). Every schedule must pass: a failure aborts the run (exit 1).

Run: ``.venv/bin/python benchmarks/bench_tour.py [--vllm] [--walks 20] [--json]``
(simulator about 10 s; with --vllm add a server start and about a minute).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.engines import HarnessEngine, SimHarnessEngine
from rolloutcore.conformance.tour import TourGraph, run_walks, tour


def measure(engine: HarnessEngine, graph: TourGraph, walks: int, work: Path) -> dict[str, Any]:
    report = tour(engine, work / engine.kind, graph=graph)
    if not report.passed:
        bad = next(r for r in report.schedules if not r.passed)
        raise SystemExit(f"{engine.kind}: a schedule failed: {bad.message}")
    steps = sum(len(r.schedule.edges) for r in report.schedules)
    t0 = time.perf_counter()
    failure = run_walks(engine, graph, work / f"{engine.kind}-walks", count=walks, seed=0)
    walk_s = time.perf_counter() - t0
    if failure is not None:
        raise SystemExit(f"{engine.kind}: a walk failed: {failure.command}")
    return {"engine": engine.kind, "classes": len(report.classes),
            "realised": len(report.realised), "unrealisable": len(report.unrealisable),
            "schedules": len(report.schedules), "steps": steps,
            "tour_s": round(report.seconds, 2),
            "per_step_ms": round(1000 * report.seconds / steps, 2),
            "walks": walks, "walks_s": round(walk_s, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", action="store_true", help="also on a real vLLM server")
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    graph = TourGraph()
    out: dict[str, Any] = {"graph_states": graph.states,
                           "graph_s": round(time.perf_counter() - t0, 2), "engines": []}
    with tempfile.TemporaryDirectory(prefix="bench-tour-") as tmp:
        work = Path(tmp)
        out["engines"].append(measure(SimHarnessEngine(), graph, args.walks, work))
        if args.vllm:
            from rolloutcore.conformance.engines import VllmHarnessEngine
            from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

            t1 = time.perf_counter()
            engine = VllmHarnessEngine.start(build_models(DEFAULT_OUT), work / "server")
            out["vllm_server_start_s"] = round(time.perf_counter() - t1, 1)
            try:
                out["engines"].append(measure(engine, graph, args.walks, work))
            finally:
                engine.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"tour graph: {out['graph_states']} states ({out['graph_s']} s to explore)")
    print(f"{'engine':<6} {'classes':>7} {'realised':>8} {'not real.':>9} {'schedules':>9} "
          f"{'steps':>6} {'tour s':>7} {'ms/step':>8} {'walks':>6} {'walks s':>8}")
    for e in out["engines"]:
        print(f"{e['engine']:<6} {e['classes']:>7} {e['realised']:>8} {e['unrealisable']:>9} "
              f"{e['schedules']:>9} {e['steps']:>6} {e['tour_s']:>7} {e['per_step_ms']:>8} "
              f"{e['walks']:>6} {e['walks_s']:>8}")
    if "vllm_server_start_s" in out:
        print(f"(vLLM server start, not counted: {out['vllm_server_start_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
