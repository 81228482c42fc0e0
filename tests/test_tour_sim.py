"""The spec-generated tour on the simulator: every edge class of the spec realised, the
plan for real vLLM (what it cannot realise, and why), and negative controls: an engine
that lies about pausing, a decision that misreads a 500, each caught at the step where
the run leaves the path; a failing random walk shrunk to a minimal replayable one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutcore.adapters.contract import PauseEvidence, PauseMode
from rolloutcore.adapters.sim import SimAdapter
from rolloutcore.conformance.engines import SimHarnessEngine
from rolloutcore.conformance.tour import (
    MEANS,
    Capability,
    TourGraph,
    TourRun,
    class_name,
    decode_walk,
    edge_class,
    observable,
    plan,
    run_walks,
    tour,
)
from rolloutcore.engine import postconditions as post
from rolloutcore.spec.lifecycle import Kind, Phase
from rolloutcore.spec.triggers import Trigger


@pytest.fixture(scope="module")
def graph() -> TourGraph:
    return TourGraph()


def test_classes_are_the_spec_graphs_observable_action_phase_pairs(graph: TourGraph) -> None:
    spec = graph.spec
    # Every observable action of the spec, from every phase it is taken in within the
    # bounds; restart_tainted is never taken from READY (READY restarts READY).
    from_graph = {edge_class(e.action, e.source) for s in list(graph._succ)
                  for e in graph.successors(s) if observable(e.action)}
    assert set(graph.classes()) == from_graph
    assert {a for a, _ in from_graph} == {a.name for a in spec.actions
                                         if a.kind is not Kind.ENVIRONMENT}


def test_the_simulator_realises_every_class(graph: TourGraph, tmp_path: Path) -> None:
    report = tour(SimHarnessEngine(), tmp_path, graph=graph, walks=0)
    failed = [(r.diverged_at, r.message) for r in report.schedules if not r.passed]
    assert failed == []
    assert report.unrealisable == {}
    assert report.realised == set(graph.classes())
    assert report.passed
    # Each schedule's journal is the path and the trace checker accepted it.
    assert all(r.trace and r.trace.startswith("accepted") for r in report.schedules)


def test_plan_for_real_vllm_names_what_it_cannot_realise(graph: TourGraph) -> None:
    schedules, reasons = plan(graph, Capability("vllm"))
    no_vllm = {name for name, alts in MEANS.items() if all(m.vllm for m in alts)}
    assert no_vllm == {"mutate_ok_unlabelled", "mutate_ok_broken"}
    direct = {c for c in reasons if c[0] in no_vllm}
    assert {c[0] for c in direct} == no_vllm
    # Nothing else is out of reach: probe_mismatch, whose weights the digest cannot tell
    # apart on an update's own path (mutate_ok_broken), is reached by an engine replaced
    # out of band between the validation and the probe.
    assert {c for c in reasons if c not in direct} == set()
    probe_mismatch = next(s for s in schedules
                          if ("probe_mismatch", Phase.RESUMING) in s.classes())
    assert "engine_restart" in probe_mismatch.labels()
    covered = set().union(*(s.classes() for s in schedules))
    assert covered == set(graph.classes()) - set(reasons)


def test_safe_plan_leaves_out_the_broken_checkpoint(graph: TourGraph) -> None:
    schedules, reasons = plan(graph, Capability("vllm", safe=True))
    assert class_name(("mutate_refused", next(iter(graph.spec.action(
        "mutate_refused").sources)))) in {class_name(c) for c in reasons}
    for sched in schedules:
        assert "mutate_refused" not in {e.action.name for e in sched.edges}


class LyingPause(SimAdapter):
    """Reports a pause it did not make (paused, nothing running)."""

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        return PauseEvidence(mode, 200, {"status": "paused"}, True, 0)


def _lying_engine() -> SimHarnessEngine:
    e = SimHarnessEngine()
    original = e._fresh

    def fresh(initial: str = "v1") -> None:
        original(initial)
        e.sim_adapter = LyingPause(e.engine)
        e.adapter = e.sim_adapter

    e._fresh = fresh  # type: ignore[method-assign]
    e.restore()
    return e


def _schedule_for(graph: TourGraph, cls: str):  # type: ignore[no-untyped-def]
    schedules, _ = plan(graph, Capability("sim"))
    return next(s for s in schedules if class_name(s.covers[0]) == cls)


def test_an_engine_that_lies_about_pausing_is_caught(graph: TourGraph, tmp_path: Path) -> None:
    sched = _schedule_for(graph, "pause_begin@DRAINING")
    good = TourRun(SimHarnessEngine(), sched, tmp_path / "good").run()
    assert good.passed
    bad = TourRun(_lying_engine(), sched, tmp_path / "bad").run()
    assert not bad.passed
    k = bad.diverged_at
    assert k is not None and sched.edges[k].action.name == "pause_begin"
    assert "paused state disagrees" in bad.message


def test_a_decision_that_misreads_a_500_is_caught(graph: TourGraph, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sched = _schedule_for(graph, "pause_failed@DRAINING")
    real = post.decide

    def lenient(d: post.Decision) -> post.Outcome:
        out = real(d)
        if out.trigger == Trigger.PAUSE_FAILED:
            return post.Outcome(Trigger.PAUSE_OK, "a 500 read as paused")
        return out

    monkeypatch.setattr(post, "decide", lenient)
    res = TourRun(SimHarnessEngine(), sched, tmp_path).run()
    assert not res.passed
    assert "outcome pause_ok" in res.message and "predicts pause_failed" in res.message


def test_a_failing_walk_is_shrunk_to_a_minimal_replayable_one(graph: TourGraph,
                                                              tmp_path: Path) -> None:
    # Seeded, so deterministic; a change to the spec graph changes which walks a seed draws.
    failure = run_walks(_lying_engine(), graph, tmp_path, count=40, seed=6)
    assert failure is not None
    labels = failure.result.schedule.labels()
    # Minimal: bootstrap, request the update, pause; nothing else is needed.
    assert labels[-2:] == ["pause_begin", "pause_ok"] and len(labels) <= 6, labels
    assert failure.command.endswith(",".join(map(str, failure.choices)))
    replay = decode_walk(graph, Capability("sim"), failure.choices)
    assert replay.labels() == labels
    assert not TourRun(_lying_engine(), replay, tmp_path / "replay").run().passed


def test_random_walks_pass_on_the_simulator(graph: TourGraph, tmp_path: Path) -> None:
    assert run_walks(SimHarnessEngine(), graph, tmp_path, count=60, seed=11) is None


@pytest.mark.deep  # the whole tour through the CLI twice: make test (the walks stay)
def test_cli_tour_json_and_replay(tmp_path: Path) -> None:
    env_out = {"ROLLOUTCORE_ARTIFACTS": str(tmp_path)}
    import os

    env = {**os.environ, **env_out}
    r = subprocess.run([sys.executable, "-m", "rolloutcore.cli", "conformance", "tour",
                        "--walks", "3", "--json"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["coverage"]["classes"] == rep["coverage"]["realised"] > 0
    assert rep["walks"] == {"ran": 3, "failure": None}
    r = subprocess.run([sys.executable, "-m", "rolloutcore.cli", "conformance", "tour",
                        "--walk", "0,0,1,0,0"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("PASS"), r.stdout + r.stderr
    for bad in (["--walk", "a,b"], ["--walks", "-1"], ["--checkpoint", "v1=/x"]):
        r = subprocess.run([sys.executable, "-m", "rolloutcore.cli", "conformance", "tour",
                            *bad], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
