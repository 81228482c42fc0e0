"""Fleet control-plane cost per update cycle against the number of engines, and time from
a frozen member to its quarantine against the deadline, on simulated engines.

1. Cycles: fleets of 1, 8, 64, 512 and 4,096 simulated engines (zero-latency operations,
   a fast policy with no sleeps, the fleet journal on disk without fsync unless
   ``--fsync``); ``--cycles`` published fleet updates per size (at most 12,000 engine
   cycles: 3 at 4,096) after two warm-up cycles. Reported: the median per cycle and per
   engine (wall, and the CPU of every thread), the least-squares slope and intercept of the median
   against the engine count, and how well a line fits (R^2). Goal: linear, under 0.5 ms
   per engine. For scale: the fleet trace checker's cost per record on the 8-engine run's
   journal.
2. Freeze: in fleets of 8 and 64 engines, one member frozen in its mutation (the
   simulated collective never returns) or in the resume after it (the call is held to its
   step deadline): the time from the frozen call's start to the member's TAINTED verdict
   and to its confirmed fence, and from the start of the step in progress (where its
   deadline starts) to TAINTED, against that deadline. Each try
   freezes another member, then re-admits it (verified re-admission plus catch-up).

Usage: .venv/bin/python benchmarks/bench_fleet.py [--cycles N] [--freezes N]
       [--deadline S] [--fsync] [--json]"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import MutationEvidence, ResumeEvidence, WeightTarget
from rolloutcore.adapters.sim import FaultPlan, SimAdapter, SimEngine, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.engine.controller import Controller, TraceBuffer, TraceSink
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.fleet import Fleet
from rolloutcore.journal import Journal
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.triggers import Trigger

SIZES = (1, 8, 64, 512, 4096)
#: Timed cycles per size are capped at this many engine-cycles (4,096 engines: 3 cycles).
ENGINE_CYCLES = 12_000
FREEZE_SIZES = (8, 64)
CHECKED_SIZE = 8  # the fleet whose journal the trace checker reads, for scale
GOAL_MS_PER_ENGINE = 0.5  # fleet control-plane CPU per engine per cycle (issue 23)
#: No sleeps anywhere: generous deadlines (nothing is slow), no retry backoff.
FAST = RunnerPolicy(step_timeout_s=30.0, pause_timeout_s=30.0, retry_backoff_s=0.0,
                    mutation_base_s=30.0)


def target(generation: int) -> WeightTarget:
    return sim_target(generation, f"ckpt-{generation}")


class StampedAdapter(SimAdapter):
    """A simulated adapter that notes when each mutate and resume call starts (the moment
    an injected freeze begins)."""

    def __init__(self, engine: SimEngine) -> None:
        super().__init__(engine, hang_seconds=3600.0)
        self.entered: dict[str, float] = {}

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        self.entered["mutate"] = time.perf_counter()
        return super().mutate(target, deadline)

    def resume(self, deadline: float) -> ResumeEvidence:
        self.entered["resume"] = time.perf_counter()
        return super().resume(deadline)


def make_fleet(tmp: Path, n: int, policy: RunnerPolicy, fsync: bool
               ) -> tuple[Fleet, dict[str, StampedAdapter]]:
    adapters = {f"e{i:02d}": StampedAdapter(SimEngine("ckpt-1", label="rc-1"))
                for i in range(n)}
    fleet = Fleet([(name, a, None) for name, a in adapters.items()], journal=tmp / "f.jsonl",
                  min_serving=max(1, n // 2), policy=policy, fsync=fsync)
    out = fleet.bootstrap(target(1))
    if {o.trigger for o in out.values()} != {Trigger.BOOTSTRAP_OK}:
        raise SystemExit(f"bootstrap failed: {out}")
    return fleet, adapters


def single(count: int, journal: Path | None, fsync: bool) -> float:
    """Median seconds of one engine's update cycle with a bare runner (no fleet), its
    trace in memory (``journal`` None) or in a journal file: the floor a fleet member's
    cycle is compared with."""
    sink: TraceSink = TraceBuffer() if journal is None else Journal(journal, fsync=fsync)
    runner = LifecycleRunner(Controller(trace=sink), SimAdapter(SimEngine("ckpt-1",
                                                                          label="rc-1")), FAST)
    runner.bootstrap(target(1))
    times = []
    try:
        for g in range(2, count + 4):
            t0 = time.perf_counter()
            if not runner.update(target(g)).published:
                raise SystemExit(f"single-engine cycle to {g} did not publish")
            if g >= 4:
                times.append(time.perf_counter() - t0)
    finally:
        if isinstance(sink, Journal):
            sink.close()
    return statistics.median(times)


def cycles(n: int, count: int, fsync: bool) -> dict[str, Any]:
    """Seconds per published fleet cycle of ``n`` engines (after two warm-up cycles)."""
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        fleet, _adapters = make_fleet(Path(d), n, FAST, fsync)
        times, cpu = [], []
        try:
            for i in range(count + 2):
                g = fleet.committed + 1
                t0, c0 = time.perf_counter(), time.process_time()
                report = fleet.update(target(g))
                dt = time.perf_counter() - t0
                if not (report.published and len(report.committed_on) == n):
                    raise SystemExit(f"cycle to {g} on {n} engines did not publish everywhere")
                if i >= 2:
                    times.append(dt)
                    cpu.append(time.process_time() - c0)  # every thread of this process
        finally:
            fleet.close()
        check: dict[str, Any] = {}
        if n == CHECKED_SIZE:
            t0 = time.perf_counter()
            verdict = check_fleet_file(Path(d) / "f.jsonl")
            dt = time.perf_counter() - t0
            if not verdict.accepted:
                raise SystemExit(f"the fleet journal fails its checker: {verdict.message}")
            check = {"records": verdict.records, "check_s": dt,
                     "check_us_per_record": dt / verdict.records * 1e6}
    med = statistics.median(times)
    return {"engines": n, "cycles": count, "median_ms": med * 1e3,
            "per_engine_ms": med / n * 1e3,
            "cpu_per_engine_ms": statistics.median(cpu) / n * 1e3, "min_ms": min(times) * 1e3,
            "max_ms": max(times) * 1e3, **check}


def freezes(n: int, op: str, tries: int, deadline_s: float) -> dict[str, Any]:
    """Freeze one member's ``op`` (mutate: the collective never returns; resume: held to
    its step deadline) in a fleet of ``n``; time to TAINTED and to the confirmed fence."""
    policy = RunnerPolicy(step_timeout_s=deadline_s, pause_timeout_s=deadline_s,
                          fence_timeout_s=deadline_s, retries=2, retry_backoff_s=0.0,
                          mutation_base_s=deadline_s, mutation_floor_bytes_per_s=1e12)
    fenced_at: dict[str, float] = {}
    step_start: dict[str, float] = {}

    def on_step(member: str, step: str, outcome: str, seconds: float) -> None:
        now = time.perf_counter()
        if step == "fence" and outcome == Trigger.FENCE_OK:
            fenced_at[member] = now
        if step == op:
            step_start[member] = now - seconds

    to_taint, to_fence, step_to_taint = [], [], []
    deadline = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        fleet, adapters = make_fleet(Path(d), n, policy, fsync=False)
        fleet.on_step = on_step
        names = sorted(adapters)
        try:
            for i in range(tries):
                frozen = names[i % n]
                g = fleet.committed + 1
                tgt = target(g)
                deadline = (policy.mutation_deadline(tgt) if op == "mutate"
                            else policy.step_timeout_s)
                adapters[frozen].faults = FaultPlan({op: ["hang"]})
                report = fleet.update(tgt)
                r = report.members[frozen]
                if r.tainted_after_s is None or not r.fenced or not report.published:
                    raise SystemExit(f"{op} freeze on {frozen}: not quarantined and fenced "
                                     f"with the others published: {report.as_json()}")
                start, tainted = adapters[frozen].entered[op], r.started + r.tainted_after_s
                to_taint.append(tainted - start)
                to_fence.append(fenced_at[frozen] - start)
                step_to_taint.append(tainted - step_start[frozen])
                out = fleet.readmit(frozen, who="bench")
                if out.trigger != Trigger.READMIT_OK or fleet.phase != FleetPhase.READY:
                    raise SystemExit(f"readmission of {frozen} failed: {out}")
        finally:
            for a in adapters.values():
                a.release_hangs()
            fleet.close()
    return {"engines": n, "frozen_op": op, "tries": tries, "deadline_ms": deadline * 1e3,
            "to_tainted_median_ms": statistics.median(to_taint) * 1e3,
            "to_tainted_max_ms": max(to_taint) * 1e3,
            "to_fenced_max_ms": max(to_fence) * 1e3,
            "step_start_to_tainted_max_ms": max(step_to_taint) * 1e3,
            "over_deadline_max_ms": (max(step_to_taint) - deadline) * 1e3,
            "to_tainted_over_deadline_ratio": max(step_to_taint) / deadline}


def fit(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """Least-squares slope, intercept and R^2 of (engines, ms)."""
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    mean = statistics.fmean(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, intercept, 1.0 - ss_res / ss_tot if ss_tot else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cycles", type=int, default=30, help="timed cycles per fleet size")
    ap.add_argument("--freezes", type=int, default=5, help="frozen members per case")
    ap.add_argument("--deadline", type=float, default=0.2,
                    help="the freeze cases' step and mutation deadline (s)")
    ap.add_argument("--fsync", action="store_true", help="fsync the fleet journal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cycles < 1 or args.freezes < 0:
        ap.error("--cycles must be at least 1 and --freezes at least 0 (0 skips the freezes)")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        floor_mem = single(args.cycles, None, args.fsync)
        floor_journal = single(args.cycles, Path(d) / "single.jsonl", args.fsync)
    rows = [cycles(n, max(1, min(args.cycles, ENGINE_CYCLES // n)), args.fsync)
            for n in SIZES]
    for r in rows:
        r["vs_n_single_journalled_cycles"] = r["median_ms"] / (r["engines"] * floor_journal
                                                               * 1e3)
    slope, intercept, r2 = fit([(r["engines"], r["median_ms"]) for r in rows])
    worst = max(r["per_engine_ms"] for r in rows)
    frozen = [freezes(n, op, args.freezes, args.deadline)
              for op in ("mutate", "resume") for n in FREEZE_SIZES] if args.freezes else []
    out: dict[str, Any] = {
        "fsync": args.fsync, "single_engine_cycle_in_memory_ms": floor_mem * 1e3,
        "single_engine_cycle_journalled_ms": floor_journal * 1e3,
        "journal_share_of_single_cycle": 1 - floor_mem / floor_journal, "cycles": rows,
        "slope_ms_per_engine": slope,
        "intercept_ms": intercept, "linear_r2": r2,
        "per_engine_ratio_largest_vs_smallest": rows[-1]["per_engine_ms"]
        / rows[0]["per_engine_ms"],
        "goal_ms_per_engine": GOAL_MS_PER_ENGINE, "worst_per_engine_ms": worst,
        "goal_met": worst < GOAL_MS_PER_ENGINE and slope < GOAL_MS_PER_ENGINE,
        "freeze": frozen}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"fleet update cycles (up to {args.cycles} per size after 2 warm-up; journal "
          f"{'fsynced' if args.fsync else 'without fsync'}; medians)")
    print(f"  floor: one engine, bare runner: {floor_mem * 1e3:.3f} ms per cycle with the "
          f"trace in memory, {floor_journal * 1e3:.3f} ms journalled (the journal: "
          f"{out['journal_share_of_single_cycle']:.0%})")
    for r in rows:
        print(f"  {r['engines']:4d} engines ({r['cycles']} cycles): {r['median_ms']:8.2f} ms per "
              f"cycle, {r['per_engine_ms']:6.3f} ms per engine (CPU "
              f"{r['cpu_per_engine_ms']:.3f}) "
              f"({r['per_engine_ms'] / GOAL_MS_PER_ENGINE:.1f}x the goal; min "
              f"{r['min_ms']:.2f}, max {r['max_ms']:.2f} ms); "
              f"{r['vs_n_single_journalled_cycles']:.2f}x "
              f"{r['engines']} journalled single-engine cycles")
    print(f"  slope {slope:.3f} ms per engine, intercept {intercept:.2f} ms, R^2 {r2:.4f}; "
          f"per engine at {SIZES[-1]} vs {SIZES[0]}: "
          f"{out['per_engine_ratio_largest_vs_smallest']:.2f}x; goal < "
          f"{GOAL_MS_PER_ENGINE} ms per engine: {'met' if out['goal_met'] else 'NOT met'}")
    big = next(r for r in rows if r["engines"] == CHECKED_SIZE)
    print(f"  fleet trace check of the {big['engines']}-engine journal: {big['records']} "
          f"records in {big['check_s']:.2f} s ({big['check_us_per_record']:.0f} us per record)")
    if not frozen:
        return 0
    print(f"frozen member -> quarantine ({args.freezes} tries each, deadline "
          f"{args.deadline * 1e3:.0f} ms)")
    print("  (from the frozen call's start; the deadline runs from its step's start, which can "
          "be earlier when the step waited for the shared journal)")
    for f in frozen:
        print(f"  {f['frozen_op']:6s} frozen, {f['engines']:2d} engines: TAINTED after "
              f"{f['to_tainted_median_ms']:.1f} ms median, {f['to_tainted_max_ms']:.1f} ms max; "
              f"fenced by {f['to_fenced_max_ms']:.1f} ms; step start to TAINTED at most "
              f"{f['step_start_to_tainted_max_ms']:.1f} ms "
              f"({f['to_tainted_over_deadline_ratio']:.3f}x the deadline, "
              f"{f['over_deadline_max_ms']:+.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
