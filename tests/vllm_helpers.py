"""Checks shared by the tests that run the tour and the scenario corpus on a real vLLM
engine (a server, a multimodal server, an in-process engine in a Ray actor): the same
verdicts asked of every kind of real engine."""

from __future__ import annotations

from pathlib import Path

from rolloutcore.conformance.engines import HarnessEngine, SimHarnessEngine
from rolloutcore.conformance.harness import ScenarioResult, compare, run_scenario
from rolloutcore.conformance.scenarios import SCENARIOS
from rolloutcore.conformance.tour import Capability, TourGraph, TourReport, class_name, plan

#: Non-destructive scenarios first, in corpus order; the destructive ones last.
SCENARIO_ORDER = sorted(SCENARIOS, key=lambda n: SCENARIOS[n].destructive)


def check_real_vllm_tour(report: TourReport, graph: TourGraph) -> None:
    """Every schedule and walk passed, and what was not realised is exactly what the plan
    says a real vLLM cannot be made to show (two loader bugs, without patching vLLM)."""
    failed = [(r.schedule.labels(), r.message) for r in report.schedules if not r.passed]
    assert failed == []
    assert report.walk_failure is None
    _, reasons = plan(graph, Capability("vllm"))
    assert report.unrealisable == reasons
    assert {class_name(c) for c in reasons} == {
        "mutate_ok_unlabelled@UPDATING", "mutate_ok_broken@UPDATING"}
    assert report.realised == set(graph.classes()) - set(reasons)
    assert report.passed


def check_scenario_against_simulator(name: str, engine: HarnessEngine,
                                     tmp_path: Path) -> ScenarioResult:
    """Scenario ``name`` on ``engine`` and on the simulator: the same observations, both
    passed, the real journal's chain intact and its trace accepted."""
    real = run_scenario(SCENARIOS[name], engine, tmp_path, printer=print)
    sim = run_scenario(SCENARIOS[name], SimHarnessEngine(), tmp_path)
    assert compare([sim], [real]) == [], f"the simulator and {engine.kind} disagree"
    assert real.passed, real.failures()
    assert real.trace is not None and real.trace["accepted"] and real.trace["chain_ok"]
    assert sim.passed, sim.failures()
    return real
