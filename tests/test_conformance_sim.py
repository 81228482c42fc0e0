"""The conformance corpus on the simulated engine (fast), and the harness's own
negative controls: a broken engine must fail the scenario that covers it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.cli import main as cli_main
from rolloutcore.conformance.engines import SimHarnessEngine
from rolloutcore.conformance.harness import (
    Check,
    ScenarioResult,
    compare,
    run_corpus,
    run_scenario,
    sim_factory,
)
from rolloutcore.conformance.scenarios import SCENARIOS

#: Scenarios that fail because of a bug outside the harness; strict: a fix turns them red
#: here so that the marker goes away with the bug.
KNOWN_BUGS: dict[str, str] = {}  # pause_timeout was here: fixed in the spec (pause_failed)


def _params(names: list[str]) -> list[Any]:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[n]))
            if n in KNOWN_BUGS else n for n in names]


@pytest.mark.parametrize("name", _params(list(SCENARIOS)))
def test_scenario_passes_on_the_simulator(name: str, tmp_path: Path) -> None:
    r = run_scenario(SCENARIOS[name], SimHarnessEngine(), tmp_path)
    assert r.passed, r.failures()
    assert r.trace is not None and r.trace["accepted"] and r.trace["chain_ok"]
    assert r.journal is not None and Path(r.journal).exists()
    assert r.checks and all(c.ok for c in r.checks)


def test_corpus_runs_destructive_scenarios_last_on_one_pool(tmp_path: Path) -> None:
    results = run_corpus(sim_factory(), tmp_path, ["failed_load", "bootstrap"])
    assert [r.name for r in results] == ["bootstrap", "failed_load"]
    assert all(r.passed for r in results)


def test_a_lying_prefix_reset_fails_the_stale_cache_scenario(tmp_path: Path) -> None:
    """An engine that answers success:true without clearing: the post-update probe sees
    old-generation hits, RolloutCore latches TAINTED and the scenario fails."""
    engine = SimHarnessEngine()
    real_restore = engine.restore

    def restore() -> None:
        real_restore()
        engine.engine.reset_prefix_cache = lambda: True  # type: ignore[method-assign]

    engine.restore = restore  # type: ignore[method-assign]
    r = run_scenario(SCENARIOS["stale_cache"], engine, tmp_path)
    assert not r.passed
    failed = {c.description for c in r.checks if not c.ok}
    assert "the first request after the update has zero old-generation prefix hits" in failed
    cycle = r.evidence["cycle"]
    assert cycle["final_phase"] == "TAINTED" and not cycle["published"]
    assert any(s["outcome"] == "probe_mismatch" for s in cycle["steps"])
    assert r.trace is not None and r.trace["accepted"]  # fail-closed is spec-conformant


@pytest.mark.deep  # make test: the whole pause scenario once more (make check was 320 s)
def test_an_engine_that_ignores_wait_mode_fails_pause_semantics(tmp_path: Path) -> None:
    """pause(wait) returning at once (like keep) breaks the spec's drain assumption."""
    from rolloutcore.adapters.contract import PauseMode

    engine = SimHarnessEngine()
    real_restore = engine.restore

    def restore() -> None:
        real_restore()
        inner = engine.engine
        real_pause = inner.pause
        inner.pause = (  # type: ignore[method-assign]
            lambda mode: real_pause(PauseMode.KEEP if mode is PauseMode.WAIT else mode))

    engine.restore = restore  # type: ignore[method-assign]
    r = run_scenario(SCENARIOS["pause_semantics"], engine, tmp_path)
    assert not r.passed
    failed = " ".join(c.description for c in r.checks if not c.ok)
    assert "wait: the pause returns only once" in failed
    assert "drained it" in failed  # the runner's pause saw a request still running


def test_compare_reports_every_differing_verdict() -> None:
    def res(passed: bool, ok: bool) -> ScenarioResult:
        return ScenarioResult("x", "e", passed, [Check("c", ok, None)], {}, None, None, 0.0)

    assert compare([res(True, True)], [res(True, True)]) == []
    d = compare([res(True, True)], [res(False, False)])
    assert [(x.scenario, x.what, x.sim, x.vllm) for x in d] == [
        ("x", "scenario verdict", True, False), ("x", "c", True, False)]


def test_cli_conformance_run_sim_json(capsys: pytest.CaptureFixture[str],
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTCORE_ARTIFACTS", str(tmp_path))
    rc = cli_main(["conformance", "run", "--engine", "sim", "--scenario", "bootstrap",
                   "--scenario", "update_idle", "--json"])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["passed"]
    rows = out["engines"]["sim"]
    assert [r["name"] for r in rows] == ["bootstrap", "update_idle"]
    assert all(r["trace"]["accepted"] for r in rows)
    assert Path(rows[0]["journal"]).is_file()


def test_cli_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["conformance", "run", "--engine", "sim", "--scenario", "nope"]) == 2
    assert "unknown scenario" in capsys.readouterr().err
