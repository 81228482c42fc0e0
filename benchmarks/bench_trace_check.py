"""Trace checker scaling: does the cost per record stay flat as more rollouts are bound
at once, and does the time grow linearly with the journal?

For each K in ``--bound`` (default 10, 100, 1000) and each size in ``--records``
(default 10,000 and 100,000) a journal is built with the real :class:`Controller` and
:class:`Journal` (no fsync, fixed clock), outcomes journalled with the trace corpus's
evidence helpers: bootstrap, then segments of admit K, churn (release one at random,
admit one) so that K rollouts are bound for most of the segment, release all, and a full
update cycle (every third with failed attempts and retries). Segments are at least
``10 * 2K`` records long, so at K=1000 a 10,000-record journal has one update cycle.

Each journal is checked with ``rolloutcore.check.trace.check_file`` (hash chain + spec +
evidence, streaming) in a fresh interpreter, started from a small launcher so that its
peak RSS (``wait4``) is its own and not inherited from this process (Linux keeps the
peak of the pre-exec image). Time is measured inside that process around
``check_file`` alone; each journal is checked ``--repeat`` times (default 3, in rounds
over all journals; the fastest is kept, as a 2-core machine is noisy). Every journal
must be accepted: a rejection aborts the run.

Printed: one row per (K, records), the interpreter baseline (same imports, no file),
and ratios from this run: per-record cost at the largest K over the smallest (goal ~1.0:
the cost does not grow with bound rollouts) and time at the largest size over the
smallest (goal ~ the size ratio: linear). Goal of the issue: 1,000 rollouts bound and
100,000 records checked in under 10 s and 500 MB on this machine.

Run: ``.venv/bin/python benchmarks/bench_trace_check.py [--json]`` (about 80 s).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.make_traces import (
    FixedClock,
    bootstrap,
    drain_and_pause,
    full_cycle,
    invalidate,
    mutate,
    publish,
    validate_resume_probe,
)
from rolloutcore.engine.controller import Controller
from rolloutcore.journal import Journal
from rolloutcore.spec.fleet import FLEET

GOAL_K, GOAL_RECORDS, GOAL_S, GOAL_MB = 1000, 100_000, 10.0, 500.0
#: Run length: 10,000 update cycles (about a million records) in < 60 s and < 300 MB,
#: the single-engine checker and the fleet checker (8 members) alike.
GOAL_CYCLES, GOAL_CYCLES_S, GOAL_CYCLES_MB = 10_000, 60.0, 300.0

# The measured process: check_file alone is timed (not interpreter start-up or imports).
# Mode "chain" times the hash chain only (bench_journal splits chain from checks).
_CHILD = """
import json, sys, time
from rolloutcore.check.trace import check_file
from rolloutcore.journal import verify_chain
mode = sys.argv[1]
if mode == "baseline":
    print(json.dumps({"seconds": 0.0}))
elif mode == "chain":
    t0 = time.perf_counter()
    r = verify_chain(sys.argv[2])
    print(json.dumps({"seconds": time.perf_counter() - t0, "accepted": r.ok,
                      "records": r.records - 1, "message": r.reason}))
elif mode == "untimed":  # the same check with its timing check taken out: its cost
    from rolloutcore.check.trace import TraceChecker
    TraceChecker._timing = lambda self, r, line: None
    t0 = time.perf_counter()
    v = check_file(sys.argv[2])
    print(json.dumps({"seconds": time.perf_counter() - t0, **v.as_json()}))
elif mode == "fleet":
    from rolloutcore.check.fleet_trace import check_fleet_file
    t0 = time.perf_counter()
    v = check_fleet_file(sys.argv[2])
    print(json.dumps({"seconds": time.perf_counter() - t0, **v.as_json()}))
else:
    t0 = time.perf_counter()
    v = check_file(sys.argv[2])
    print(json.dumps({"seconds": time.perf_counter() - t0, **v.as_json()}))
"""

# Linux keeps a process's peak RSS across exec, so a child forked from this (large)
# process would report at least our peak: each check is started by a small launcher,
# whose RUSAGE_CHILDREN after its one child exits is that child's peak.
_LAUNCHER = """
import json, resource, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True, text=True)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr, "rss_kb": rss}))
"""


def _launch(mode: str, path: Path | None) -> dict[str, Any]:
    """Run the child in its own process: its JSON line plus ``peak_rss_mb``."""
    argv = [sys.executable, "-c", _CHILD, mode, *([str(path)] if path else [])]
    raw = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True,
                         text=True, check=True).stdout
    r = json.loads(raw)
    if r["rc"] != 0:
        raise RuntimeError(f"checker process exited {r['rc']}: {r['err'].strip()[-2000:]}")
    out: dict[str, Any] = json.loads(r["out"])
    out["peak_rss_mb"] = r["rss_kb"] / 1024  # kB on Linux
    return out


def measure(path: Path, mode: str = "check") -> dict[str, Any]:
    """``check_file`` (or the chain alone, ``mode="chain"``) on ``path`` in a fresh
    process: seconds, peak RSS (MB) and the verdict's fields."""
    return _launch(mode, path)


def baseline_rss_mb() -> float:
    """Peak RSS of the same interpreter with the same imports and no file."""
    return float(_launch("baseline", None)["peak_rss_mb"])


def build_journal(path: Path, k: int, records: int, *, seed: int = 0) -> dict[str, Any]:
    """A valid journal of about ``records`` records after the header, holding ``k``
    rollouts bound for most of it (see the module doc); returns what was built."""
    rng = random.Random(seed)
    segment = max(2_000, 20 * k)
    at_k = cycles = n = most = 0
    with Journal(path, fsync=False, clock=FixedClock()) as j:
        c = Controller(trace=j)
        bootstrap(c)
        bound: list[str] = []
        while j.last_seq < records:
            end = min(records, j.last_seq + segment)
            while len(bound) < k and j.last_seq < records:
                n += 1
                bound.append(f"r{n}")
                c.admit(bound[-1])
            most = max(most, len(bound))
            # Churn, leaving room for the drain (k releases) and the cycle (~40 records).
            while j.last_seq + k + 40 < end:
                i = rng.randrange(len(bound))
                bound[i], bound[-1] = bound[-1], bound[i]
                c.release(bound.pop(), {"tokens": 1 + rng.randrange(4096)})
                n += 1
                bound.append(f"r{n}")
                c.admit(bound[-1])
                at_k += 2
            if j.last_seq >= records:
                break
            while bound:
                c.release(bound.pop(), {"tokens": 1 + rng.randrange(4096)})
            full_cycle(c, retries=cycles % 3 == 2)
            cycles += 1
        written = j.last_seq
    assert most == k, f"at most {most} rollouts were bound at once, not {k}"
    return {"k": k, "records_target": records, "records": written, "update_cycles": cycles,
            "at_k_fraction": at_k / written, "mb": path.stat().st_size / 2**20}


def _admit_release(c: Controller, ids: list[str], rng: random.Random) -> None:
    for rid in ids:
        c.admit(rid)
    rng.shuffle(ids)
    for rid in ids:
        c.release(rid, {"tokens": 1 + rng.randrange(4096)})


class _Deadlined(Controller):
    """Every begin states a deadline, as the runner's do (the trace checker's timing check
    then has something to check on every attempt)."""

    def fire(self, trigger: str, param: Any = None, detail: Any = None) -> Any:
        if trigger.endswith("_begin"):
            detail = {**(detail or {}), "deadline_s": 30.0}
        return super().fire(trigger, param, detail)


def build_cycles_journal(path: Path, cycles: int, lo: int, hi: int, *,
                         seed: int = 0) -> dict[str, Any]:
    """``cycles`` update cycles back to back (every third with failed attempts and
    retries), each after ``lo``..``hi`` rollouts bound at once and released: the length of
    an RL run that publishes every step. Every begin states its deadline."""
    rng = random.Random(seed)
    n = 0
    with Journal(path, fsync=False, clock=FixedClock()) as j:
        c = _Deadlined(trace=j)
        bootstrap(c)
        for i in range(cycles):
            k = rng.randint(lo, hi)
            _admit_release(c, [f"r{n + x}" for x in range(k)], rng)
            n += k
            full_cycle(c, retries=i % 3 == 2)
        written = j.last_seq
    return {"checker": "engine", "members": 1, "cycles": cycles, "rollouts": f"{lo}-{hi}",
            "records": written, "mb": path.stat().st_size / 2**20}


def build_fleet_journal(path: Path, members: int, cycles: int, lo: int, hi: int, *,
                        seed: int = 0) -> dict[str, Any]:
    """A fleet journal of ``members`` members (the fleet's own steps and every member's,
    in one chain) through ``cycles`` fleet updates, each after ``lo``..``hi`` rollouts
    spread over the members."""
    rng = random.Random(seed)
    names = [f"m{i}" for i in range(members)]
    n = 0
    with Journal(path, fsync=False, clock=FixedClock(), spec_name=FLEET.name) as j:
        cs = {m: Controller(trace=j.member(m)) for m in names}
        for c in cs.values():
            bootstrap(c)
        j.fleet_step("fleet_open", "READY", 1, 0, {"members": names, "min_serving": members})
        for i in range(cycles):
            k = rng.randint(lo, hi)
            for x in range(k):
                cs[names[x % members]].admit(f"r{n + x}")
            for x in range(k):
                cs[names[x % members]].release(f"r{n + x}", {"tokens": 1})
            n += k
            g = cs[names[0]].control.committed + 1
            j.fleet_step("fleet_request_update", "UPDATING", g - 1, g,
                         {"target": f"gen-{g}", "identity": "x", "members": names,
                          "min_serving": members})
            for c in cs.values():
                drain_and_pause(c, pause_fails=i % 3 == 2)
                mutate(c)
                invalidate(c)
                validate_resume_probe(c)
            j.fleet_step("fleet_publish", "READY", g, 0, {"members": names, "label": f"gen-{g}",
                                                          "min_serving": members})
            for c in cs.values():
                publish(c)
        written = j.last_seq
    return {"checker": "fleet", "members": members, "cycles": cycles, "rollouts": f"{lo}-{hi}",
            "records": written, "mb": path.stat().st_size / 2**20}


def run_cycles(cycles: int, fleet_cycles: int, members: int, lo: int, hi: int,
               tmp: Path, *, timing_cost: bool = True) -> list[dict[str, Any]]:
    """Checker time and memory against run length: each journal checked once in a fresh
    process (``fleet`` journals by the fleet checker)."""
    rows = []
    for build in (lambda p: build_cycles_journal(p, cycles, lo, hi),
                  lambda p: build_fleet_journal(p, members, fleet_cycles, lo, hi)):
        path = tmp / f"cycles-{len(rows)}.jsonl"
        t0 = time.perf_counter()
        row = build(path)
        row["build_s"] = time.perf_counter() - t0
        r = measure(path, "fleet" if row["checker"] == "fleet" else "check")
        assert r["accepted"], f"{row} rejected: {r['message']}"
        rows.append({**row, "seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"],
                     "us_per_record": r["seconds"] / row["records"] * 1e6})
        if timing_cost and row["checker"] == "engine":
            # The timing checks' cost: the same file without them, alternated with it (a
            # burst of load from elsewhere hits both alike).
            timed, untimed = [r["seconds"]], []
            for mode in ("untimed", "check", "untimed"):
                m = measure(path, mode)
                assert m["accepted"], m["message"]
                (untimed if mode == "untimed" else timed).append(m["seconds"])
            rows[-1]["seconds"] = min(timed)
            rows[-1]["us_per_record"] = min(timed) / row["records"] * 1e6
            rows[-1]["untimed_seconds"] = min(untimed)
            rows[-1]["timing_cost_ratio"] = min(timed) / min(untimed)
        path.unlink()
    return rows


def run(ks: list[int], sizes: list[int], tmp: Path, repeat: int) -> dict[str, Any]:
    built: dict[Path, dict[str, Any]] = {}
    for records in sizes:
        for k in ks:
            path = tmp / f"k{k}-n{records}.jsonl"
            t0 = time.perf_counter()
            built[path] = build_journal(path, k, records)
            built[path]["build_s"] = time.perf_counter() - t0
    # Rounds over all journals rather than repeats of one: a burst of load from elsewhere
    # on this small machine then hits every configuration alike, not one ratio's side.
    runs: dict[Path, list[dict[str, Any]]] = {p: [] for p in built}
    for _ in range(repeat):
        for path, b in built.items():
            r = measure(path)
            # A rejected journal means the builder or the checker is wrong: the timing
            # of a check that stopped early measures nothing.
            assert r["accepted"], f"K={b['k']}, {b['records']} records rejected: {r['message']}"
            assert r["records"] == b["records"], (r["records"], b)
            runs[path].append(r)
    rows: list[dict[str, Any]] = []
    for path, b in built.items():
        best = min(runs[path], key=lambda r: float(r["seconds"]))
        rows.append({**b, "seconds": best["seconds"],
                     "us_per_record": best["seconds"] / b["records"] * 1e6,
                     "peak_rss_mb": max(float(r["peak_rss_mb"]) for r in runs[path]),
                     "states_max": best["states_max"]})
    return {"rows": rows, "baseline_rss_mb": baseline_rss_mb(), "repeat": repeat}


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    rows = result["rows"]
    ks = sorted({r["k"] for r in rows})
    sizes = sorted({r["records_target"] for r in rows})
    at = {(r["k"], r["records_target"]): r for r in rows}
    out: dict[str, Any] = {}
    if len(ks) > 1:
        out["per_record_kmax_over_kmin"] = {
            str(n): at[(ks[-1], n)]["us_per_record"] / at[(ks[0], n)]["us_per_record"]
            for n in sizes}
    if len(sizes) > 1:
        out["time_nmax_over_nmin"] = {
            str(k): at[(k, sizes[-1])]["seconds"] / at[(k, sizes[0])]["seconds"] for k in ks}
        out["size_ratio"] = sizes[-1] / sizes[0]
    goal = at.get((GOAL_K, GOAL_RECORDS))
    if goal is not None:
        out["goal"] = {"k": GOAL_K, "records": GOAL_RECORDS, "seconds": goal["seconds"],
                       "peak_rss_mb": goal["peak_rss_mb"], "goal_seconds": GOAL_S,
                       "goal_peak_rss_mb": GOAL_MB,
                       "met": goal["seconds"] < GOAL_S and goal["peak_rss_mb"] < GOAL_MB}
    return out


def render(result: dict[str, Any]) -> str:
    rows, r = result["rows"], result["ratios"]
    lines = [f"interpreter baseline (python + import check_file, no file): peak RSS "
             f"{result['baseline_rss_mb']:.1f} MB",
             f"{'K':>5} {'records':>8} {'MB':>6} {'cycles':>6} {'at K':>5} {'seconds':>8} "
             f"{'us/record':>9} {'peak RSS MB':>11} {'states_max':>10}"]
    for x in rows:
        lines.append(f"{x['k']:>5} {x['records']:>8,} {x['mb']:>6.1f} {x['update_cycles']:>6} "
                     f"{x['at_k_fraction']:>5.0%} {x['seconds']:>8.2f} "
                     f"{x['us_per_record']:>9.1f} {x['peak_rss_mb']:>11.1f} "
                     f"{x['states_max']:>10}")
    ks = sorted({x["k"] for x in rows})
    for n, v in r.get("per_record_kmax_over_kmin", {}).items():
        lines.append(f"per-record cost, K={ks[-1]} / K={ks[0]} at {int(n):,} records: "
                     f"{v:.2f}x (goal ~1.0x: does not grow with bound rollouts)")
    for k, v in r.get("time_nmax_over_nmin", {}).items():
        lines.append(f"time, largest / smallest journal at K={k}: {v:.2f}x "
                     f"(goal ~{r['size_ratio']:.0f}x: linear)")
    if result["cycle_rows"]:
        lines.append(f"\n{'checker':>8} {'members':>7} {'cycles':>7} {'rollouts':>8} "
                     f"{'records':>10} {'MB':>7} {'seconds':>8} {'us/record':>9} "
                     f"{'peak RSS MB':>11}")
    for x in result["cycle_rows"]:
        met = x["seconds"] < GOAL_CYCLES_S and x["peak_rss_mb"] < GOAL_CYCLES_MB
        lines.append(f"{x['checker']:>8} {x['members']:>7} {x['cycles']:>7,} "
                     f"{x['rollouts']:>8} {x['records']:>10,} {x['mb']:>7.1f} "
                     f"{x['seconds']:>8.2f} {x['us_per_record']:>9.1f} "
                     f"{x['peak_rss_mb']:>11.1f}  goal < {GOAL_CYCLES_S:.0f} s and < "
                     f"{GOAL_CYCLES_MB:.0f} MB: {'met' if met else 'NOT met'}")
        if "timing_cost_ratio" in x:
            lines.append(f"{'':>8} the timing checks (every begin states its deadline; "
                         f"closed windows): {x['seconds']:.2f} s with them / "
                         f"{x['untimed_seconds']:.2f} s without = "
                         f"{x['timing_cost_ratio']:.3f}x (fastest of two each)")
    g = r.get("goal")
    if g is not None:
        lines.append(f"goal: K={g['k']}, {g['records']:,} records in < {g['goal_seconds']:.0f} s "
                     f"and < {g['goal_peak_rss_mb']:.0f} MB; measured {g['seconds']:.2f} s, "
                     f"{g['peak_rss_mb']:.1f} MB peak RSS: {'met' if g['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bound", type=int, nargs="*", default=[10, 100, 1000],
                    help="rollouts bound at once (K)")
    ap.add_argument("--records", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=3,
                    help="checks per journal, each in a fresh process (the fastest is kept)")
    ap.add_argument("--cycles", type=int, default=GOAL_CYCLES,
                    help="update cycles of the run-length journal (0: skip it)")
    ap.add_argument("--fleet-cycles", type=int, default=3_000,
                    help="fleet updates of the fleet run-length journal")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--cycle-rollouts", type=int, nargs=2, default=[4, 100],
                    metavar=("LO", "HI"), help="rollouts bound before each cycle")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timing-cost", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the engine journal's check without its timing checks "
                    "(three more checks: the ratio)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-trace-check-") as tmp:
        result = run(sorted(args.bound), sorted(args.records), Path(tmp), args.repeat) \
            if args.bound else {"rows": [], "baseline_rss_mb": baseline_rss_mb(), "repeat": 0}
        result["cycle_rows"] = run_cycles(args.cycles, args.fleet_cycles, args.members,
                                          *args.cycle_rollouts, Path(tmp),
                                          timing_cost=args.timing_cost) \
            if args.cycles else []
    result["ratios"] = ratios(result)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
