"""A fleet cycle on three real vLLM CPU servers against the slowest single-server cycle
in the same run (goal: at most 1.3x).

Three servers are started once. Each round, every server alone runs a verified update
v1 -> v2 under its own controller (the single-server cycles; the slowest counts), then
the three run one fleet update v1 -> v2 (every member in parallel, one publish). Rounds
alternate which comes first. Reported: the medians over rounds and their ratio, the
fleet cycle split into its slowest member's cycle and the fleet's own overhead.

Run: ``.venv/bin/python benchmarks/bench_fleet_vllm.py [--rounds 3] [--json]`` (a
server start of about a minute, then about 10 s per round).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.fleet_scenarios import POLICY, FleetRig
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.runner import LifecycleRunner
from rolloutcore.spec.triggers import Trigger


def single_cycles(rig: FleetRig) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, engine in rig.engines.items():
        engine.restore()
        runner = LifecycleRunner(Controller(), engine.adapter, POLICY)
        if runner.bootstrap(engine.initial_target()).trigger != Trigger.BOOTSTRAP_OK:
            raise SystemExit(f"{name}: bootstrap failed")
        rep = runner.update(engine.target(2, "v2"))
        if not rep.published:
            raise SystemExit(f"{name}: single update not published")
        out[name] = rep.total_s
    return out


def fleet_cycle(rig: FleetRig, n: int) -> dict[str, Any]:
    rig.restore()
    fleet = rig.open(f"bench-{n}", min_serving=len(rig.names))
    try:
        boot = fleet.bootstrap(rig.targets(1))
        if any(o.trigger != Trigger.BOOTSTRAP_OK for o in boot.values()):
            raise SystemExit("fleet bootstrap failed")
        rep = fleet.update(rig.targets(2))
        if not rep.published:
            raise SystemExit("fleet update not published")
        slowest = max(r.total_s for r in rep.members.values())
        return {"fleet_s": rep.total_s, "slowest_member_s": slowest}
    finally:
        fleet.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    with tempfile.TemporaryDirectory(prefix="bench-fleet-vllm-") as tmp:
        t0 = time.perf_counter()
        rig = FleetRig.vllm(build_models(DEFAULT_OUT), Path(tmp), 3)
        start_s = time.perf_counter() - t0
        rounds: list[dict[str, Any]] = []
        try:
            for r in range(args.rounds):
                if r % 2 == 0:
                    singles = single_cycles(rig)
                    fleet = fleet_cycle(rig, r)
                else:
                    fleet = fleet_cycle(rig, r)
                    singles = single_cycles(rig)
                rounds.append({"singles_s": singles, "slowest_single_s": max(singles.values()),
                               **fleet})
        finally:
            rig.close()
    med = {k: statistics.median(x[k] for x in rounds)
           for k in ("slowest_single_s", "fleet_s", "slowest_member_s")}
    ratio = med["fleet_s"] / med["slowest_single_s"]
    out = {"servers": 3, "server_start_s": round(start_s, 1), "rounds": rounds,
           "median_ms": {k: round(v * 1000, 1) for k, v in med.items()},
           "fleet_over_slowest_single": round(ratio, 3), "goal": 1.3,
           "fleet_overhead_ms": round((med["fleet_s"] - med["slowest_member_s"]) * 1000, 1)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"3 servers up in {out['server_start_s']} s; {args.rounds} rounds (medians):")
    print(f"  slowest single-server cycle   {out['median_ms']['slowest_single_s']:8.1f} ms")
    print(f"  fleet cycle (3 servers)       {out['median_ms']['fleet_s']:8.1f} ms "
          f"(slowest member inside it {out['median_ms']['slowest_member_s']:.1f} ms, "
          f"fleet overhead {out['fleet_overhead_ms']:.1f} ms)")
    print(f"  ratio fleet / slowest single  {ratio:8.3f}   (goal <= 1.3: "
          f"{'met' if ratio <= 1.3 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
