"""The conformance harness: one scenario corpus, two engines (the real vLLM server and
the simulator, see :mod:`rolloutcore.conformance.engines`), every run journalled and
trace-checked.

A scenario is a function of a :class:`ScenarioContext`; it drives a
:class:`~rolloutcore.engine.runner.LifecycleRunner` (whose controller journals to a
:class:`~rolloutcore.journal.Journal`) against a
:class:`~rolloutcore.conformance.engines.HarnessEngine` and records checks
(description, ok, observed) and evidence (tokens, counters, timings).

A scenario passes when every check holds, nothing raised, and its journal's chain is
intact and accepted by the trace checker. A scenario whose verdict (or any check's)
differs between the engines is reported by :func:`compare`: a bug in the simulator or
the spec, never smoothed over here.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import ProbeEvidence
from rolloutcore.check.trace import check_file
from rolloutcore.conformance.engines import (
    HarnessEngine,
    RecordingAdapter,
    SimHarnessEngine,
    VllmHarnessEngine,
)
from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import Journal, open_controller, read_journal, verify_chain
from rolloutcore.spec.lifecycle import Phase

# --------------------------------------------------------------------------- results


@dataclass
class Check:
    description: str
    ok: bool
    observed: Any

    def as_json(self) -> dict[str, Any]:
        return {"description": self.description, "ok": self.ok, "observed": self.observed}


@dataclass
class ScenarioResult:
    name: str
    engine: str
    passed: bool
    checks: list[Check]
    evidence: dict[str, Any]
    journal: str | None
    trace: dict[str, Any] | None  # the trace checker's verdict (and the chain's)
    seconds: float
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "passed": self.passed,
                "checks": [c.as_json() for c in self.checks], "evidence": self.evidence,
                "journal": self.journal, "trace": self.trace,
                "seconds": round(self.seconds, 3), "error": self.error}

    def failures(self) -> list[str]:
        out = [f"{c.description}: observed {c.observed!r}" for c in self.checks if not c.ok]
        if self.error:
            out.append(f"error: {self.error}")
        if self.trace is not None and not self.trace.get("accepted"):
            out.append(f"trace: {self.trace.get('message')}")
        return out



# ------------------------------------------------------------------------ contexts


StepPrinter = Callable[[str], None]


@dataclass
class ScenarioContext:
    """What a scenario function gets: the engine, where to journal, and its records."""

    engine: HarnessEngine
    name: str
    journal_path: Path
    policy: RunnerPolicy = field(default_factory=lambda: RunnerPolicy(
        step_timeout_s=60.0, drain_timeout_s=120.0))
    printer: StepPrinter | None = None
    checks: list[Check] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    recorder: RecordingAdapter | None = None
    runner: LifecycleRunner | None = None
    journal: Journal | None = None

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.checks.append(Check(description, bool(ok), _plain(observed)))
        if self.printer is not None:
            self.printer(f"    [{'ok' if ok else 'FAIL'}] {description}: {_short(observed)}")
        return bool(ok)

    def say(self, text: str) -> None:
        if self.printer is not None:
            self.printer(text)

    def open_runner(self) -> LifecycleRunner:
        """A fresh controller journalling to this scenario's journal, over a recording
        adapter; the engine is expected in its fresh state (label, weights)."""
        if self.runner is not None:
            raise RuntimeError("one runner per scenario (one journal)")
        self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        if self.journal_path.exists():
            self.journal_path.unlink()
        controller, journal, _rec = open_controller(self.journal_path)
        self.journal = journal
        self.recorder = RecordingAdapter(self.engine.adapter)

        def on_step(step: str, outcome: str, seconds: float) -> None:
            self.say(f"    {step:<16} -> {outcome:<18} {seconds * 1000:8.1f} ms   "
                     f"phase {controller.phase.value}")

        self.runner = LifecycleRunner(controller, self.recorder, self.policy, on_step=on_step)
        return self.runner

    def bootstrap(self) -> LifecycleRunner:
        runner = self.open_runner()
        initial = self.engine.initial_target()
        outcome = runner.bootstrap(initial)
        self.say(f"    bootstrap -> {outcome.trigger}: {outcome.reason}")
        self.check("bootstrap: the fresh engine is adopted as generation 1",
                   outcome.trigger == "bootstrap_ok", outcome.reason)
        return runner

    def cycle_evidence(self, key: str, report: CycleReport) -> None:
        self.evidence[key] = cycle_json(report)
        self.say(f"    cycle -> {'published' if report.published else 'NOT published'} "
                 f"{report.target.label} in {report.total_s * 1000:.0f} ms "
                 f"(drain wait {report.drain_wait_s * 1000:.0f} ms), "
                 f"phase {report.final_phase.value}")
        if report.final_phase is Phase.READY:
            # The spec's ReadyEngineServesCommitted, checked against the engine itself.
            paused = self.engine.is_paused_raw()
            self.check(f"{key}: READY with the engine running (not left paused)", not paused,
                       {"is_paused": paused})

    def journal_steps(self) -> list[dict[str, Any]]:
        _report, records = read_journal(self.journal_path)
        return records[1:]

    def probes(self) -> list[ProbeEvidence]:
        assert self.recorder is not None
        return [c.evidence for c in self.recorder.of("probe")
                if isinstance(c.evidence, ProbeEvidence)]


def cycle_json(report: CycleReport) -> dict[str, Any]:
    return {"target": report.target.label, "published": report.published,
            "final_phase": report.final_phase.value,
            "total_s": round(report.total_s, 4), "drain_wait_s": round(report.drain_wait_s, 4),
            "steps": [{"step": s.step, "outcome": s.outcome, "seconds": round(s.seconds, 4),
                       "attempts": s.attempts, "reason": s.reason} for s in report.steps],
            "stuck_calls": report.stuck_calls}


def _plain(v: Any) -> Any:
    """JSON-ready observed values (tuples to lists, enums to strings)."""
    try:
        return json.loads(json.dumps(v, default=str))
    except (TypeError, ValueError):
        return repr(v)


def _short(v: Any, n: int = 100) -> str:
    s = json.dumps(_plain(v), default=str)
    return s if len(s) <= n else s[:n - 3] + "..."


# ------------------------------------------------------------------------ running


ScenarioFn = Callable[[ScenarioContext], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fn: ScenarioFn
    destructive: bool = False  # may kill the engine: runs last, on its own engine


def run_scenario(scenario: Scenario, engine: HarnessEngine, out_dir: Path, *,
                 printer: StepPrinter | None = None, restore: bool = True) -> ScenarioResult:
    """Run one scenario on ``engine`` (restored to its fresh state first), then verify
    its journal: hash chain and trace check."""
    journal = out_dir / engine.kind / f"{scenario.name}.jsonl"
    ctx = ScenarioContext(engine, scenario.name, journal, printer=printer)
    if printer is not None:
        printer(f"[{engine.kind}] {scenario.name}: {scenario.description}")
    t0 = time.perf_counter()
    error: str | None = None
    try:
        if restore:
            engine.restore()
        scenario.fn(ctx)
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        ctx.evidence["traceback"] = traceback.format_exc(limit=8)
        if printer is not None:
            printer(f"    ERROR {error}")
    finally:
        if ctx.journal is not None:
            ctx.journal.close()
    seconds = time.perf_counter() - t0
    trace: dict[str, Any] | None = None
    if ctx.runner is not None and journal.exists():
        chain = verify_chain(journal)
        verdict = check_file(journal)
        trace = {**verdict.as_json(), "chain_ok": chain.ok}
        if printer is not None:
            why = "" if verdict.accepted else f": {verdict.message}"
            printer(f"    journal {journal}: chain {'intact' if chain.ok else 'BROKEN'}, "
                    f"trace {'accepted' if verdict.accepted else 'REJECTED'} "
                    f"({verdict.records} records){why}")
    else:
        trace = {"accepted": False, "message": "the scenario recorded no journal"}
    passed = (error is None and bool(ctx.checks) and all(c.ok for c in ctx.checks)
              and bool(trace.get("accepted")) and trace.get("chain_ok", False) is True)
    return ScenarioResult(scenario.name, engine.kind, passed, ctx.checks, ctx.evidence,
                          str(journal) if journal.exists() else None, trace, seconds, error)


EngineFactory = Callable[[], HarnessEngine]


class EnginePool:
    """One shared engine for every scenario; a replacement when a scenario killed it."""

    def __init__(self, factory: EngineFactory) -> None:
        self.factory = factory
        self.engine: HarnessEngine | None = None
        self.started = 0

    def get(self) -> HarnessEngine:
        if self.engine is not None and not self.engine.alive():
            self.engine.close()
            self.engine = None
        if self.engine is None:
            self.engine = self.factory()
            self.started += 1
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def run_corpus(factory: EngineFactory, out_dir: Path, names: list[str] | None = None, *,
               printer: StepPrinter | None = None) -> list[ScenarioResult]:
    """Run the named scenarios (all by default), destructive ones last."""
    from rolloutcore.conformance.scenarios import SCENARIOS

    chosen = [SCENARIOS[n] for n in (names or list(SCENARIOS))]
    chosen.sort(key=lambda s: s.destructive)  # stable: corpus order otherwise
    pool = EnginePool(factory)
    results: list[ScenarioResult] = []
    try:
        for s in chosen:
            results.append(run_scenario(s, pool.get(), out_dir, printer=printer))
    finally:
        pool.close()
    return results


def sim_factory(**kwargs: Any) -> EngineFactory:
    return lambda: SimHarnessEngine(**kwargs)


def vllm_factory(out_dir: Path, models: Mapping[str, Path] | None = None) -> EngineFactory:
    def make() -> HarnessEngine:
        from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

        m = models if models is not None else build_models(DEFAULT_OUT)
        return VllmHarnessEngine.start(m, out_dir / "vllm")
    return make


@dataclass(frozen=True)
class Discrepancy:
    scenario: str
    what: str
    sim: Any
    vllm: Any

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "what": self.what, "sim": self.sim,
                "vllm": self.vllm}


def compare(sim: list[ScenarioResult], real: list[ScenarioResult]) -> list[Discrepancy]:
    """Scenario and check verdicts that differ between the simulator and real vLLM."""
    out: list[Discrepancy] = []
    by_name = {r.name: r for r in real}
    for s in sim:
        r = by_name.get(s.name)
        if r is None:
            continue
        if s.passed != r.passed:
            out.append(Discrepancy(s.name, "scenario verdict", s.passed, r.passed))
        sc = {c.description: c.ok for c in s.checks}
        rc = {c.description: c.ok for c in r.checks}
        for d in sorted(sc.keys() | rc.keys()):
            if sc.get(d) != rc.get(d):
                out.append(Discrepancy(s.name, d, sc.get(d), rc.get(d)))
        steps_s, steps_r = _outcome_steps(s), _outcome_steps(r)
        if steps_s is not None and steps_r is not None and steps_s != steps_r:
            out.append(Discrepancy(s.name, "journal step sequence", steps_s, steps_r))
    return out


def _outcome_steps(r: ScenarioResult) -> list[str] | None:
    """The journal's step names, admissions and releases aside (their interleaving with
    the cycle depends on timing, which the trace checker judges on its own)."""
    if r.journal is None or not os.path.exists(r.journal):
        return None
    _rep, records = read_journal(r.journal)
    return [str(x.get("step")) for x in records[1:] if x.get("step") not in ("admit", "release")]


@contextmanager
def background(fn: Callable[[], Any], join_timeout: float = 120.0) -> Iterator[
        dict[str, Any]]:
    """Run ``fn`` on a thread; the dict gets ``result``/``error`` and ``t_end``
    (perf_counter) once it finishes; joined on exit."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:
            box["error"] = e
        finally:
            box["t_end"] = time.perf_counter()

    th = threading.Thread(target=run, daemon=True)
    box["thread"] = th
    th.start()
    try:
        yield box
    finally:
        th.join(join_timeout)
        if th.is_alive():  # left behind (daemon): the scenario reports it
            box.setdefault("error", TimeoutError(f"still running after {join_timeout} s"))


def wait_until(cond: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True

__all__ = ["Check", "EnginePool", "Scenario", "ScenarioContext", "ScenarioResult", "background",
           "compare", "cycle_json", "run_corpus", "run_scenario", "sim_factory", "vllm_factory",
           "wait_until"]
