"""Staged updates on the simulated engine (spec/staged.py at run time): the weights are
staged on every rank while the engine serves, the closed window only installs; a staging
that fails on any rank is refused with the engine serving its generation, never TAINTED;
an ambiguous install is TAINTED; every journal passes the trace checker, which steps the
staged spec's table from it and catches a journal that installs unprepared."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.adapters.sim import FaultPlan, SimAdapter, SimEngine, reference_tokens, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.check.trace import check_file
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.delta import read_delta, write_delta
from rolloutcore.engine.identity import checkpoint_entries, checkpoint_identity
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.engine.targets import checkpoint_target
from rolloutcore.fleet import Fleet
from rolloutcore.journal import Journal, open_controller
from rolloutcore.journal.codec import dumps_line, rechain
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase

STAGED = RunnerPolicy(step_timeout_s=0.5, pause_timeout_s=0.5, retries=2,
                      retry_backoff_s=0.0, drain_timeout_s=5, mutation_base_s=0.3,
                      mutation_floor_bytes_per_s=1e12, staged=True)
PROMPT = (1, 2, 3, 4, 5, 6)


def _runner(tmp_path: Path, ranks: int = 2,
            policy: RunnerPolicy = STAGED) -> tuple[LifecycleRunner, SimAdapter]:
    adapter = SimAdapter(SimEngine("ckpt-1", label="rc-1", ranks=ranks), hang_seconds=5)
    runner = LifecycleRunner(Controller(trace=Journal(tmp_path / "j.jsonl", fsync=False)),
                             adapter, policy)
    assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
    return runner, adapter


def _steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()[1:]]


def test_a_staged_update_stages_every_rank_then_installs_in_the_window(
        tmp_path: Path) -> None:
    runner, adapter = _runner(tmp_path, ranks=3)
    report = runner.update(sim_target(2, "ckpt-2"))
    assert report.published and report.staged, report.steps
    assert adapter.engine.weights == "ckpt-2" and adapter.engine.staged == {}
    steps = [r["step"] for r in _steps(tmp_path / "j.jsonl")]
    i = steps.index("stage_begin")
    assert steps[i:i + 8] == ["stage_begin", *["stage_receive"] * 3,
                              *["stage_prepare"] * 3, "request_update"]
    assert check_file(tmp_path / "j.jsonl").accepted


@pytest.mark.parametrize("fault", ["corrupt", "partial", "other", "refuse", "hang"])
def test_a_failed_staging_is_refused_while_serving_never_tainted(
        tmp_path: Path, fault: str) -> None:
    """One rank's staging fails (a corrupt chunk, a sender gone mid-stream, another
    generation's bytes, a rank refusing, no answer by the deadline): the update is
    refused before admissions close; the engine serves generation 1 throughout, its
    output unchanged; a rollout admitted before the staging finishes on generation 1."""
    runner, adapter = _runner(tmp_path)
    before = adapter.engine.generate(PROMPT, 6)
    adapter.faults = FaultPlan({"stage": [fault]})
    with runner.rollout("during") as binding:
        report = runner.update(sim_target(2, "ckpt-2"))
        assert binding.generation == 1
    adapter.release_hangs()
    assert not report.published and not report.staged and report.staging_refused
    assert report.final_phase is Phase.READY and runner.controller.control.committed == 1
    assert adapter.engine.weights == "ckpt-1" and adapter.engine.staged == {}
    assert adapter.engine.generate(PROMPT, 6).tokens == before.tokens
    steps = [r["step"] for r in _steps(tmp_path / "j.jsonl")]
    assert "stage_fail" in steps and "request_update" not in steps
    assert check_file(tmp_path / "j.jsonl").accepted
    # ... and the next staging of the same target goes through.
    assert runner.update(sim_target(2, "ckpt-2")).published


@pytest.mark.parametrize(("fault", "phase"), [("die_halfway", Phase.TAINTED),
                                              ("refuse", Phase.READY),
                                              ("one_rank", Phase.TAINTED)])
def test_the_install_decides_like_the_mutation(tmp_path: Path, fault: str,
                                               phase: Phase) -> None:
    """An ambiguous install latches TAINTED; a refused one reopens on generation 1; the
    negative control ``one_rank`` installs on one rank only and says it succeeded: the
    mixed weights are caught by the probe (TAINTED), not by the install's word."""
    runner, adapter = _runner(tmp_path)
    adapter.faults = FaultPlan({"install": [fault]})
    report = runner.update(sim_target(2, "ckpt-2"))
    assert report.staged and report.final_phase is phase and not report.published
    if fault == "one_rank":
        assert adapter.engine.weights == "miscomputed(ckpt-2)"
        assert any(s.outcome == "probe_mismatch" for s in report.steps), report.steps
    if phase is Phase.READY:
        assert adapter.engine.weights == "ckpt-1"
        _b, out = runner.generate("after", PROMPT, 6)
        assert out.tokens == reference_tokens("ckpt-1", PROMPT, 6)
    assert check_file(tmp_path / "j.jsonl").accepted


def test_the_drain_timing_out_abandons_the_staging(tmp_path: Path) -> None:
    runner, adapter = _runner(tmp_path, policy=replace(STAGED, drain_timeout_s=0.05))
    with runner.rollout("long"):
        report = runner.update(sim_target(2, "ckpt-2"))
    assert report.staged and not report.published and report.final_phase is Phase.READY
    assert adapter.engine.staged == {} and adapter.engine.weights == "ckpt-1"
    assert check_file(tmp_path / "j.jsonl").accepted


def _rewrite(path: Path, out: Path, edit: Any) -> Path:
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    body = recs[1:]
    edit(body)
    out.write_text("".join(dumps_line(r) for r in rechain([recs[0], *body])))
    return out


def test_the_checker_catches_an_install_without_every_rank_prepared(tmp_path: Path) -> None:
    """Negative controls: the same journal with one rank's prepare dropped (an install
    without every rank's evidence), with a receive whose evidence names another identity
    but says ``exact``, and with a staged request after a refused staging."""
    runner, _adapter = _runner(tmp_path)
    assert runner.update(sim_target(2, "ckpt-2")).published
    src = tmp_path / "j.jsonl"

    def drop_prepare(recs: list[dict[str, Any]]) -> None:
        i = next(i for i, r in enumerate(recs) if r["step"] == "stage_prepare")
        del recs[i]
        for j, r in enumerate(recs):
            r["seq"] = j + 1

    def lie_about_kind(recs: list[dict[str, Any]]) -> None:
        r = next(r for r in recs if r["step"] == "stage_receive")
        r["detail"]["rank_stage"]["identity"] = "0" * 64

    v = check_file(_rewrite(src, tmp_path / "a.jsonl", drop_prepare))
    assert not v.accepted and "staged spec" in v.message and "close" in v.message, v.message
    v = check_file(_rewrite(src, tmp_path / "b.jsonl", lie_about_kind))
    assert not v.accepted and "evidence" in v.message, v.message


# ------------------------------------------------------------------ a fleet


def _fleet(tmp_path: Path, n: int = 3, ranks: int = 2, min_serving: int = 3,
           peer_sources: bool = False) -> tuple[Fleet, dict[str, SimAdapter]]:
    adapters = {f"e{i}": SimAdapter(SimEngine("ckpt-1", label="rc-1", ranks=ranks),
                                    hang_seconds=5) for i in range(n)}
    fleet = Fleet([(name, a, None) for name, a in adapters.items()],
                  journal=tmp_path / "f.jsonl", min_serving=min_serving, policy=STAGED,
                  fsync=False, peer_sources=peer_sources)
    fleet.bootstrap(sim_target(1, "ckpt-1"))
    assert fleet.phase == FleetPhase.READY
    return fleet, adapters


def test_a_fleet_stages_every_member_before_any_closes(tmp_path: Path) -> None:
    """Prepare-then-commit across the fleet: one member's staging fails (a rank's chunk
    corrupt) and the quorum is every member, so no member closes, every member serves
    generation 1 and holds no staged buffer, nothing is TAINTED; the next update stages
    all and publishes on all; the fleet journal passes the fleet trace checker (each
    member's staging stepped by the staged spec's table)."""
    fleet, adapters = _fleet(tmp_path)
    adapters["e1"].faults = FaultPlan({"stage": ["corrupt"]})
    report = fleet.update(sim_target(2, "ckpt-2"))
    assert not report.published and not report.aborted and report.refused, report
    assert "e1" in report.refused and fleet.committed == 1 and fleet.phase == FleetPhase.READY
    for a in adapters.values():
        assert a.engine.weights == "ckpt-1" and a.engine.staged == {} and not a.engine.paused
    assert all(m.controller.phase is Phase.READY for m in fleet.members.values())
    steps = [r["step"] for r in _steps(tmp_path / "f.jsonl")]
    assert steps.count("stage_fail") == 3 and "request_update" not in steps
    report = fleet.update(sim_target(2, "ckpt-2"))
    assert report.published and sorted(report.committed_on) == ["e0", "e1", "e2"]
    assert all(r.staged for r in report.members.values())
    assert all(a.engine.weights == "ckpt-2" for a in adapters.values())
    fleet.close()
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def test_a_member_whose_staging_fails_sits_the_update_out(tmp_path: Path) -> None:
    """With a quorum of two of three, a member whose staging is refused sits the update
    out (READY on generation 1, never TAINTED, nothing touched) while the others publish
    generation 2; its re-admission then catches it up (a verified update of its own)."""
    fleet, adapters = _fleet(tmp_path, min_serving=2)
    adapters["e1"].faults = FaultPlan({"stage": ["partial"]})
    report = fleet.update(sim_target(2, "ckpt-2"))
    assert report.published and sorted(report.committed_on) == ["e0", "e2"], report
    assert report.members["e1"].staging_refused and not report.quarantined
    e1 = fleet.members["e1"]
    assert e1.controller.phase is Phase.READY and e1.controller.control.committed == 1
    assert adapters["e1"].engine.weights == "ckpt-1" and adapters["e1"].engine.staged == {}
    out = fleet.readmit("e1", who="test: catch up after a refused staging")
    assert out.trigger == "readmit_ok", out
    assert e1.controller.control.committed == 2 and adapters["e1"].engine.weights == "ckpt-2"
    fleet.close()
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def _stage_sources(path: Path) -> dict[str, str]:
    """Each member's ``stage_begin`` source in a fleet journal (the last, by member)."""
    return {r["engine"]: r["detail"]["source"] for r in _steps(path)
            if r.get("step") == "stage_begin"}


def test_peer_sources_send_the_trainers_bytes_once_per_fleet(tmp_path: Path) -> None:
    """Inference to inference: the trainer's checkpoint is staged by one member (e0), the
    others stage from e0's verified staging, and the journal says so. Then e0 dies while
    it streams to the others: their stagings did not complete, so they are refused while
    serving (never TAINTED); with a quorum of every member the update is refused with
    nothing closed anywhere. Every fleet journal passes the fleet trace checker."""
    fleet, adapters = _fleet(tmp_path, peer_sources=True)
    assert len({a.peer_token for a in adapters.values()}) == 1
    target = sim_target(2, "ckpt-2")
    report = fleet.update(target)
    assert report.published and sorted(report.committed_on) == ["e0", "e1", "e2"], report
    assert {n: r.peer for n, r in report.members.items()} == {
        "e0": None, "e1": "e0", "e2": "e0"}
    sources = _stage_sources(tmp_path / "f.jsonl")
    assert sources["e0"] == "ckpt-2"
    assert sources["e1"] == sources["e2"] and sources["e1"].startswith("sim-peer://")
    assert adapters["e0"].peer_served_bytes == 2 * target.nbytes  # one copy to each reader
    assert all(a.engine.weights == "ckpt-2" for a in adapters.values())

    adapters["e0"].kill_at = "serve_peer"  # it dies as the first reader's stream begins
    report = fleet.update(sim_target(3, "ckpt-3"))
    assert not report.published and report.refused and not report.quarantined, report
    for name in ("e1", "e2"):
        why = report.members[name].staging_refused
        assert why is not None and "after" in why and "bytes" in why, why
        assert adapters[name].engine.weights == "ckpt-2" and not adapters[name].engine.paused
        assert fleet.members[name].controller.phase is Phase.READY
    assert fleet.committed == 2 and fleet.phase == FleetPhase.READY
    fleet.close()
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def test_a_rolling_fleet_catches_up_from_a_member_that_installed(tmp_path: Path) -> None:
    """Rolling (K=2, one member admitting throughout): the wave stages the trainer's bytes
    and publishes; the members left behind stage generation 2 from a wave member that
    installed it (what it installed, served from its host copy), while the generation's
    checkpoint in the journal stays the trainer's (what a successor recovers from)."""
    adapters = {f"e{i}": SimAdapter(SimEngine("ckpt-1", label="rc-1", ranks=2),
                                    hang_seconds=5) for i in range(3)}
    fleet = Fleet([(n, a, None) for n, a in adapters.items()], journal=tmp_path / "f.jsonl",
                  min_serving=1, policy=STAGED, fsync=False, max_live=2, min_admitting=1,
                  peer_sources=True)
    fleet.bootstrap(sim_target(1, "ckpt-1"))
    report = fleet.update(sim_target(2, "ckpt-2"))
    assert report.published and sorted(report.committed_on) == ["e0", "e1", "e2"], report
    wave = report.waves[0]
    behind = sorted(set(adapters) - set(wave))
    assert behind and all(report.members[n].peer in wave for n in behind), report.as_json()
    assert all(report.members[n].peer is None for n in wave)
    sources = _stage_sources(tmp_path / "f.jsonl")
    assert all(sources[n] == "ckpt-2" for n in wave)
    assert all(sources[n].startswith("sim-peer://") for n in behind), sources
    published = {r["engine"]: r["detail"]["checkpoint"] for r in _steps(tmp_path / "f.jsonl")
                 if r.get("step") == "publish" and r.get("engine")}
    assert published == dict.fromkeys(adapters, "ckpt-2"), published
    assert all(a.engine.weights == "ckpt-2" for a in adapters.values())
    fleet.close()
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def test_a_peer_source_that_cannot_serve_refuses_its_readers(tmp_path: Path) -> None:
    """The member the trainer's bytes went to cannot serve them (its peer server does not
    answer): the others' stagings are refused with that reason, none of them turns to
    the trainer behind the report's back; e0 alone is fewer than the quorum of two, so
    the update is refused and every member serves generation 1."""
    fleet, adapters = _fleet(tmp_path, min_serving=2, peer_sources=True)
    adapters["e0"].faults = FaultPlan({"peer_source": ["connection_error"]})
    report = fleet.update(sim_target(2, "ckpt-2"))
    assert not report.published and report.refused, report
    for name in ("e1", "e2"):
        why = report.members[name].staging_refused
        assert why is not None and why.startswith("the peer source e0 cannot serve"), why
        assert adapters[name].engine.staged == {}
    assert all(a.engine.weights == "ckpt-1" for a in adapters.values())
    fleet.close()
    assert check_fleet_file(tmp_path / "f.jsonl").accepted


def test_peer_sources_need_every_member_to_serve_one(tmp_path: Path) -> None:
    class NoPeer(SimAdapter):
        peer_source = None  # type: ignore[assignment]

    with pytest.raises(ValueError, match="cannot serve a peer"):
        Fleet([("a", SimAdapter(SimEngine("ckpt-1")), None),
               ("b", NoPeer(SimEngine("ckpt-1")), None)], journal=tmp_path / "f.jsonl",
              policy=STAGED, fsync=False, peer_sources=True)


def test_a_delta_carries_only_the_changed_tensors(models: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """v1neg differs from v1 in two tensors: the delta carries those, names v1 as its base
    and v1neg's full identity as its result; a target read from it is v1neg's (its
    identity, its probe), sized by the bytes that travel."""
    info = write_delta(models["v1"], models["v1neg"], tmp_path / "d")
    assert (info.changed, info.tensors) == (2, len(checkpoint_entries(models["v1"])))
    assert info.base == checkpoint_identity(models["v1"])
    assert read_delta(tmp_path / "d") == info and read_delta(models["v1"]) is None
    t = checkpoint_target(tmp_path / "d", 2, "neg")
    full = checkpoint_target(models["v1neg"], 2, "neg")
    assert (t.identity, t.probe_tokens) == (full.identity, full.probe_tokens)
    assert t.nbytes == info.nbytes < full.nbytes / 5


def test_a_controller_recovers_from_a_journal_with_stagings(tmp_path: Path) -> None:
    """Staging steps change no lifecycle state: a controller restarted on a journal with
    a refused and a published staging recovers READY on generation 2."""
    runner, adapter = _runner(tmp_path)
    adapter.faults = FaultPlan({"stage": ["other"]})
    assert runner.update(sim_target(2, "ckpt-2")).staging_refused
    assert runner.update(sim_target(2, "ckpt-2")).published
    runner.controller.trace.close()  # type: ignore[union-attr]
    ctl, journal, _rec = open_controller(tmp_path / "j.jsonl")
    journal.close()
    assert (ctl.phase, ctl.control.committed) == (Phase.READY, 2)
