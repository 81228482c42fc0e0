"""``rolloutcore simulate``: update cycles against the simulated engine with rollouts in
flight, journalled and trace-checked. Fast enough to run thousands of cycles."""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.sim import FaultPlan, SimAdapter, SimEngine, sim_target
from rolloutcore.check.trace import TraceVerdict, check_file
from rolloutcore.engine.controller import Controller, IllegalTransition
from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import Journal, verify_chain

PROMPTS = ((11, 12, 13, 14, 15, 16, 17, 18, 19), (21, 22, 23, 24, 25, 26, 27, 28))


@dataclass
class SimulationResult:
    journal: Path
    cycles: list[CycleReport]
    rollouts: int
    crossings: int  # rollouts that saw more than one set of weights (must be 0)
    mismatched: int  # rollouts whose binding names other weights than they saw
    final_phase: str
    committed: int
    chain_ok: bool
    trace: TraceVerdict
    injected: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.crossings == 0 and self.mismatched == 0 and self.chain_ok
                and self.trace.accepted)

    def as_json(self) -> dict[str, Any]:
        return {
            "journal": str(self.journal), "journal_path": str(self.journal), "ok": self.ok,
            "final_phase": self.final_phase, "committed": self.committed,
            "rollouts": self.rollouts, "crossings": self.crossings,
            "mismatched_bindings": self.mismatched, "chain_ok": self.chain_ok,
            "trace_accepted": self.trace.accepted, "trace_message": self.trace.message,
            "faults_injected": [f"{op}={kind}" for op, kind in self.injected],
            "cycles": [
                {"target": c.target.label, "published": c.published,
                 "final_phase": str(c.final_phase), "total_s": round(c.total_s, 6),
                 "drain_wait_s": round(c.drain_wait_s, 6),
                 "steps": [{"step": s.step, "outcome": s.outcome, "attempts": s.attempts,
                            "seconds": round(s.seconds, 6)} for s in c.steps]}
                for c in self.cycles
            ],
        }


def simulate(cycles: int = 3, *, faults: str = "", journal: Path | None = None,
             workers: int = 2, token_seconds: float = 0.0005, max_tokens: int = 24,
             fsync: bool = True) -> SimulationResult:
    """Run ``cycles`` update cycles while ``workers`` threads keep rollouts in flight."""
    if journal is None:
        journal = Path(tempfile.mkdtemp(prefix="rolloutcore-sim-")) / "journal.jsonl"
    checkpoints = [f"ckpt-{g}" for g in range(1, cycles + 2)]  # at most one per cycle
    engine = SimEngine(checkpoints[0], token_seconds=token_seconds, label="rc-1")
    adapter = SimAdapter(engine, FaultPlan.parse(faults), hang_seconds=30)
    policy = RunnerPolicy(step_timeout_s=2.0, retry_backoff_s=0.001, drain_timeout_s=30,
                          mutation_base_s=1.0)
    seen: list[tuple[int, str, tuple[str, ...]]] = []  # (generation, bound ckpt, weights seen)
    stop = threading.Event()
    with Journal(journal, fsync=fsync) as sink:
        runner = LifecycleRunner(Controller(trace=sink), adapter, policy)
        reports: list[CycleReport] = []
        runner.bootstrap(sim_target(1, checkpoints[0]))

        def worker(n: int) -> None:
            k = 0
            while not stop.is_set():
                k += 1
                try:
                    binding, out = runner.generate(f"w{n}-{k}", PROMPTS[k % 2], max_tokens)
                except IllegalTransition:
                    time.sleep(0.0005)  # admissions closed: try again shortly
                    continue
                except Exception:
                    continue  # the engine died (a fault plan did that): no binding leaked
                ws = tuple(out.extra.get("weights_seen", ()))
                seen.append((binding.generation, checkpoints[binding.generation - 1], ws))

        threads = [threading.Thread(target=worker, args=(n,), daemon=True)
                   for n in range(workers)]
        for t in threads:
            t.start()
        try:
            while len(reports) < cycles and str(runner.controller.phase) == "READY":
                time.sleep(0.005)  # let rollouts get in flight
                g = runner.controller.control.committed + 1  # a refused update is retried
                reports.append(runner.update(sim_target(g, checkpoints[g - 1])))
        finally:
            stop.set()
            adapter.release_hangs()
            for t in threads:
                t.join(timeout=10)
        ctl = runner.controller
    crossings = sum(1 for _g, _c, ws in seen if len(ws) > 1)
    mismatched = sum(1 for _g, c, ws in seen if ws and ws != (c,))
    return SimulationResult(
        journal=journal, cycles=reports, rollouts=len(seen), crossings=crossings,
        mismatched=mismatched, final_phase=str(ctl.phase), committed=ctl.control.committed,
        chain_ok=verify_chain(journal).ok, trace=check_file(journal),
        injected=list(adapter.faults.injected),
    )
