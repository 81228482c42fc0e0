"""Runner overhead per update cycle against the simulated engine with zero-latency
operations and an in-memory trace (the cost of the control logic itself; goal < 1 ms),
compared in the same run with the bare adapter calls a cycle makes (the floor).
Usage: .venv/bin/python benchmarks/bench_runner.py"""

from __future__ import annotations

import statistics
import time

from rolloutcore.adapters.contract import PauseMode
from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.controller import Controller, TraceBuffer
from rolloutcore.runner import LifecycleRunner, RunnerPolicy

CYCLES = 300


def cycles(supervised: bool) -> list[float]:
    engine = SimEngine("ckpt-1", label="rc-1")
    runner = LifecycleRunner(Controller(trace=TraceBuffer()), SimAdapter(engine),
                             RunnerPolicy(retry_backoff_s=0, supervise_idempotent=supervised))
    runner.bootstrap(sim_target(1, "ckpt-1"))
    out = []
    for g in range(2, CYCLES + 2):
        t = sim_target(g, f"ckpt-{g}")
        t0 = time.perf_counter()
        assert runner.update(t).published
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    adapter = SimAdapter(SimEngine("ckpt-1", label="rc-1"))
    supervised = statistics.median(cycles(True))
    inline = statistics.median(cycles(False))
    # The floor: the same adapter calls, in the same order, without the runner.
    floor_s = []
    for g in range(CYCLES):
        t = sim_target(g + 2, f"floor-{g}")
        t0 = time.perf_counter()
        adapter.pause(PauseMode.WAIT)
        adapter.mutate(t)
        for tier in ("prefix", "encoder", "mm"):
            adapter.reset_cache(tier)
        adapter.read_state()
        adapter.resume()
        adapter.probe(t.probe_prompt, len(t.probe_tokens))
        floor_s.append(time.perf_counter() - t0)
    fl = statistics.median(floor_s)
    print(f"cycles: {CYCLES} (medians)")
    print(f"bare adapter calls of a cycle (floor):       {fl * 1e3:8.3f} ms")
    for name, med in (("runner, every call on a watchdog worker", supervised),
                      ("runner, only the mutation supervised", inline)):
        print(f"{name:44s} {med * 1e3:8.3f} ms: overhead {(med - fl) * 1e3:.3f} ms "
              f"({med / fl:.1f}x floor); goal < 1 ms "
              f"{'met' if med - fl < 1e-3 else 'NOT met'}")


if __name__ == "__main__":
    main()
