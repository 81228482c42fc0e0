"""Runner overhead per update cycle against the simulated engine with zero-latency
operations and an in-memory trace (the cost of the control logic itself; goal < 1 ms),
compared in the same run with the bare adapter calls a cycle makes (the floor).

Idempotent calls run inline on the runner's thread (the adapter honours each step's
deadline); only the mutation is handed to a supervised worker. The policy used to offer
``supervise_idempotent`` (every call on a watchdog worker), and this benchmark compared
the two; that option is gone, so the comparison is too. In its place, the cost of the one
remaining hand-off (``CallPool.call`` of a no-op vs a direct call) is measured, so the
overhead splits into that hand-off, the controller's steps (the same steps replayed on a
bare controller, mean per cycle) and the rest (decisions, evidence to JSON, bookkeeping).

Usage: .venv/bin/python benchmarks/bench_runner.py [--cycles N] [--json]"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from rolloutcore.adapters.contract import PauseMode
from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.engine.controller import Controller, TraceBuffer, TraceRecord
from rolloutcore.engine.runner import CallPool, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import apply_record

DEADLINE_S = 30.0


def cycles(n: int) -> tuple[list[float], list[TraceRecord]]:
    """Seconds per published cycle, and every step the runner took (bootstrap included)."""
    engine = SimEngine("ckpt-1", label="rc-1")
    trace = TraceBuffer()
    runner = LifecycleRunner(Controller(trace=trace), SimAdapter(engine),
                             RunnerPolicy(retry_backoff_s=0))
    runner.bootstrap(sim_target(1, "ckpt-1"))
    out = []
    for g in range(2, n + 2):
        t = sim_target(g, f"ckpt-{g}")
        t0 = time.perf_counter()
        assert runner.update(t).published
        out.append(time.perf_counter() - t0)
    return out, trace.records


def controller_steps(records: list[TraceRecord]) -> float:
    """Seconds to take the same steps on a bare controller (in-memory trace, no detail):
    the spec machine's share of the runner's cost."""
    steps = [r.as_json_dict() for r in records]
    best = float("inf")
    for _ in range(3):  # one pass is short: keep the fastest of three
        c = Controller(trace=TraceBuffer())
        t0 = time.perf_counter()
        for r in steps:
            apply_record(c, r)
        best = min(best, time.perf_counter() - t0)
    return best


def floor(n: int) -> list[float]:
    """The same adapter calls, in the same order and with deadlines, without the runner
    (the probe scored, as the runner's default probe mode sends it for these targets)."""
    adapter = SimAdapter(SimEngine("ckpt-1", label="rc-1"))
    out = []
    for g in range(n):
        t = sim_target(g + 2, f"floor-{g}")
        t0 = time.perf_counter()
        d = time.monotonic() + DEADLINE_S
        adapter.pause(PauseMode.WAIT, d)
        adapter.mutate(t, time.monotonic() + DEADLINE_S)
        for tier in ("prefix", "encoder", "mm"):
            adapter.reset_cache(tier, time.monotonic() + DEADLINE_S)
        adapter.read_state(time.monotonic() + DEADLINE_S)
        adapter.resume(time.monotonic() + DEADLINE_S)
        adapter.probe(t.probe_prompt, 1, time.monotonic() + DEADLINE_S, scored=True)
        out.append(time.perf_counter() - t0)
    return out


def handoff(n: int) -> float:
    """Median extra seconds of one supervised call (the mutation's) over a direct call."""
    pool = CallPool()
    pool.call(lambda: None, DEADLINE_S, "warm-up")
    supervised, direct = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        pool.call(lambda: None, DEADLINE_S, "bench")
        t1 = time.perf_counter()
        (lambda: None)()
        t2 = time.perf_counter()
        supervised.append(t1 - t0)
        direct.append(t2 - t1)
    return statistics.median(supervised) - statistics.median(direct)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    fl = statistics.median(floor(args.cycles))
    times, records = cycles(args.cycles)
    med = statistics.median(times)
    ctl = controller_steps(records) / args.cycles
    hand = handoff(10 * args.cycles)
    over = med - fl
    out: dict[str, Any] = {
        "cycles": args.cycles, "floor_ms": fl * 1e3, "runner_ms": med * 1e3,
        "overhead_ms": over * 1e3, "runner_over_floor": med / fl,
        "steps_per_cycle": (len(records) - 2) / args.cycles,
        "controller_steps_ms": ctl * 1e3, "controller_share_of_overhead": ctl / over,
        "mutation_handoff_ms": hand * 1e3, "handoff_share_of_overhead": hand / over,
        "goal_overhead_ms": 1.0, "goal_met": over < 1e-3}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"cycles: {args.cycles} (medians)")
    print(f"bare adapter calls of a cycle (floor):       {fl * 1e3:8.3f} ms")
    print(f"{'runner (only the mutation supervised)':44s} {med * 1e3:8.3f} ms: overhead "
          f"{over * 1e3:.3f} ms ({med / fl:.1f}x floor); goal < 1 ms: "
          f"{'met' if out['goal_met'] else 'NOT met'}")
    print(f"  of which the controller's {out['steps_per_cycle']:.0f} steps (replayed on a bare "
          f"controller): {ctl * 1e3:.3f} ms ({ctl / over:.0%} of the overhead)")
    print(f"  of which the mutation's hand-off to a watchdog worker: {hand * 1e3:.3f} ms "
          f"({hand / over:.0%} of the overhead)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
