"""Rolling updates on a simulated fleet of three (max_live 2, min_admitting 2): admissions
never close, a draining member's rollouts migrate to a member on their own generation
instead of being waited for, the floor rises once nobody serves below the frontier, and
the journal passes the fleet trace checker (which rejects a migration that changes a
rollout's generation, and a floor the spec would not set)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

from rolloutcore.adapters.sim import SimAdapter, SimEngine, reference_tokens, sim_target
from rolloutcore.check.fleet_trace import check_fleet_file, check_fleet_records
from rolloutcore.engine.controller import AdmissionTimeout
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet, FleetCycleReport, FleetError
from rolloutcore.journal import read_journal
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase

NAMES = ("e0", "e1", "e2")
#: Generous deadlines: every wait in these tests is on a lease the test holds.
POLICY = RunnerPolicy(step_timeout_s=30.0, pause_timeout_s=30.0, fence_timeout_s=30.0,
                      drain_timeout_s=30.0, retries=1, retry_backoff_s=0.0)
PROMPT = (3, 1, 4, 1, 5, 9, 2, 6)


def ckpt(g: int) -> str:
    return f"ckpt-{g}"


@pytest.fixture
def rolling(tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, SimAdapter]]]:
    adapters = {n: SimAdapter(SimEngine(ckpt(1), label="rc-1")) for n in NAMES}
    fleet = Fleet([(n, a, None) for n, a in adapters.items()], journal=tmp_path / "f.jsonl",
                  min_serving=2, policy=POLICY, fsync=False, max_live=2, min_admitting=2)
    fleet.bootstrap(sim_target(1, ckpt(1)))
    yield fleet, adapters
    fleet.close()


def draining(fleet: Fleet) -> str | None:
    return next((n for n, m in fleet.members.items()
                 if m.controller.phase is Phase.DRAINING), None)


def in_background(fn: Callable[[], FleetCycleReport]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # surfaced by the test
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def fleet_steps(path: Path) -> list[str]:
    _chain, records = read_journal(path)
    return [str(r["step"]) for r in records if "step" in r and r.get("engine") is None]


def test_a_rolling_update_never_closes_admissions_and_migrates_instead_of_waiting(
        rolling: tuple[Fleet, dict[str, SimAdapter]], tmp_path: Path) -> None:
    fleet, ad = rolling
    held = {lease.engine: lease for lease in (fleet.admit(f"r{i}") for i in range(3))}
    assert sorted(held) == list(NAMES)  # one rollout on each member
    worker, result = in_background(lambda: fleet.update(sim_target(2, ckpt(2))))
    # The wave: one member (three serve, two must keep serving) drains its rollout...
    wait_until(lambda: draining(fleet) is not None, "the wave to drain")
    wave = draining(fleet)
    assert wave is not None and fleet.phase == FleetPhase.ROLLING
    # ...and admissions stay open on the other two, on generation 1, meanwhile.
    during = fleet.admit("during-wave")
    assert during.engine != wave and during.generation == 1
    # Its rollout moves to a member serving generation 1: the wave does not wait for it.
    moved = fleet.migrate(held.pop(wave))
    assert moved.engine != wave and moved.generation == 1
    assert ad[moved.engine].generate(PROMPT, 4).tokens == reference_tokens(ckpt(1), PROMPT, 4)
    # The wave publishes; new rollouts go to the newest generation.
    wait_until(lambda: fleet.committed == 2, "the wave to publish")
    assert fleet.floor == 1
    # A request that accepts no staleness is served by the frontier only.
    wait_until(lambda: any(m.controller.phase is Phase.READY and m.controller.control.committed
                           == 1 for n, m in fleet.members.items() if n != wave),
               "a member on generation 1 to serve")
    with pytest.raises(AdmissionTimeout, match="no member serves generation 2"):
        fleet.admit("fresh-only", max_staleness=0, exclude=[wave])
    stale_ok = fleet.admit("stale-ok", max_staleness=1, exclude=[wave])
    assert stale_ok.generation == 1
    fleet.release(stale_ok)
    # The members left on generation 1 catch up one at a time, each moving its rollouts
    # to the other while one is left; the last one's rollouts have nowhere to go.
    leases = [moved, during, *held.values()]
    for _ in range(2):
        wait_until(lambda: draining(fleet) is not None, "a member to catch up")
        src = draining(fleet)
        mine = [x for x in leases if x.engine == src]
        others = [x for x in leases if x.engine != src]
        try:
            leases = others + [fleet.migrate(x) for x in mine]
        except FleetError as e:  # no other member on generation 1 serves: release them
            assert "no other member serves generation 1" in str(e)
            for x in mine:
                fleet.release(x)
            leases = others
        wait_until(lambda s=src: fleet.members[s].controller.control.committed == 2
                   or fleet.members[s].controller.phase is Phase.TAINTED, f"{src} to publish")
    worker.join(30)
    assert result and isinstance(result[0], FleetCycleReport), result
    report = result[0]
    assert report.published and len(report.waves) == 3 and report.quarantined == []
    assert (fleet.phase, fleet.committed, fleet.floor) == (FleetPhase.READY, 2, 2)
    newest = fleet.admit("after")
    assert newest.generation == 2
    for x in [*leases, newest]:
        fleet.release(x)
    steps = fleet_steps(tmp_path / "f.jsonl")
    assert steps[:2] == ["fleet_open", "fleet_roll"] and steps[-1] == "fleet_raise_floor"
    assert "fleet_publish_wave" in steps and steps.count("migrate") >= 2
    assert not {"fleet_request_update", "fleet_close", "fleet_abort"} & set(steps)
    verdict = check_fleet_file(tmp_path / "f.jsonl")
    assert verdict.accepted, verdict.message


def test_a_second_rolling_update_waits_for_the_floor(
        rolling: tuple[Fleet, dict[str, SimAdapter]], tmp_path: Path) -> None:
    fleet, _ad = rolling
    assert fleet.update(sim_target(2, ckpt(2))).published
    assert fleet.update(sim_target(3, ckpt(3))).published
    assert (fleet.committed, fleet.floor) == (3, 3)
    strict = Fleet([("x", SimAdapter(SimEngine(ckpt(1), label="rc-1")), None)],
                   journal=tmp_path / "strict.jsonl", fsync=False)
    strict.bootstrap(sim_target(1, ckpt(1)))
    # The one update call updates a strict fleet strictly: a fleet-wide request, no roll.
    assert strict.update(sim_target(2, ckpt(2))).published
    steps = [json.loads(line).get("step") for line in
             (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert "fleet_request_update" in steps and "fleet_roll" not in steps
    strict.close()


def test_the_checker_rejects_a_migration_across_generations_and_a_wrong_floor(
        rolling: tuple[Fleet, dict[str, SimAdapter]], tmp_path: Path) -> None:
    fleet, _ad = rolling
    held = {x.engine: x for x in (fleet.admit(f"r{i}") for i in range(3))}
    worker, result = in_background(lambda: fleet.update(sim_target(2, ckpt(2))))
    wait_until(lambda: draining(fleet) is not None, "the wave to drain")
    moved = fleet.migrate(held.pop(str(draining(fleet))))
    for x in [moved, *held.values()]:
        fleet.release(x)
    worker.join(30)
    assert result and isinstance(result[0], FleetCycleReport), result
    _chain, records = read_journal(tmp_path / "f.jsonl")
    assert check_fleet_records(enumerate(records, 1)).accepted

    def tampered(step: str, **detail: Any) -> list[dict[str, Any]]:
        out = [dict(r) for r in records]
        r = next(r for r in out if r.get("step") == step)
        r["detail"] = {**r["detail"], **detail}
        return out
    bad = check_fleet_records(enumerate(tampered("migrate", generation=2), 1))
    assert not bad.accepted and bad.violated == "MigrationKeepsGeneration"
    bad = check_fleet_records(enumerate(tampered("fleet_raise_floor", floor=1), 1))
    assert not bad.accepted and bad.violated == "DetailContradictsFleet"
    bad = check_fleet_records(enumerate(tampered("fleet_roll", members=["nobody"]), 1))
    assert not bad.accepted


def test_rolling_bounds_are_checked() -> None:
    ad = [("a", SimAdapter(SimEngine(ckpt(1), label="rc-1")), None),
          ("b", SimAdapter(SimEngine(ckpt(1), label="rc-1")), None)]
    for k, c in ((0, 0), (1, 1), (2, 2), (3, 1)):  # K above the members: never servable
        with pytest.raises(ValueError, match="max_live"):
            Fleet(ad, journal="/nonexistent/never-written.jsonl", max_live=k, min_admitting=c)


def test_fleet_status_shows_frontier_floor_and_the_policy_mid_roll(
        rolling: tuple[Fleet, dict[str, SimAdapter]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fleet status` reads the journal: while a member still holds a rollout below the
    frontier, the floor stays behind it; the policy is the one the journal opened with."""
    import json

    from rolloutcore import cli

    fleet, _ad = rolling
    (tmp_path / "fleet.toml").write_text(
        '[fleet]\nmin_serving = 2\nmax_live = 2\nmin_admitting = 2\njournal = "f.jsonl"\n'
        + "".join(f'[[engine]]\nname = "{n}"\nurl = "http://127.0.0.1:1"\n' for n in NAMES))
    held = {x.engine: x for x in (fleet.admit(f"r{i}") for i in range(3))}
    worker, result = in_background(lambda: fleet.update(sim_target(2, ckpt(2))))
    wait_until(lambda: draining(fleet) is not None, "the wave to drain")
    held[str(draining(fleet))] = fleet.migrate(held.pop(str(draining(fleet))))
    wait_until(lambda: fleet.committed == 2, "the wave to publish")

    def status() -> dict[str, Any]:
        assert cli.main(["fleet", "status", "--fleet", str(tmp_path / "fleet.toml"),
                         "--json"]) == 0
        return dict(json.loads(capsys.readouterr().out)["fleet"])
    mid = status()
    assert (mid["committed"], mid["floor"], mid["max_live"], mid["min_admitting"]) == (
        2, 1, 2, 2), mid
    for x in held.values():
        fleet.release(x)
    worker.join(30)
    assert result and isinstance(result[0], FleetCycleReport) and result[0].published
    assert (status()["committed"], status()["floor"]) == (2, 2)


def test_a_wave_member_that_loads_the_wrong_weights_is_quarantined_and_serves_nothing(
        rolling: tuple[Fleet, dict[str, SimAdapter]], tmp_path: Path) -> None:
    """The wave's one member loads other weights than the target declares: it is
    quarantined, nothing publishes, the fleet stays on one live generation, every
    admission goes to the members that kept serving, and verified re-admission brings
    it back onto the committed generation."""
    fleet, ad = rolling
    for a in ad.values():  # whichever member the wave takes; the others never mutate
        a.faults.add("mutate", "wrong_weights")
    report = fleet.update(sim_target(2, ckpt(2)))
    assert not report.published and len(report.quarantined) == 1, report.as_json()
    (bad,) = report.quarantined
    assert fleet.members[bad].controller.phase is Phase.TAINTED
    assert (fleet.phase, fleet.committed, fleet.floor) == (FleetPhase.READY, 1, 1)
    served = [fleet.admit(f"r{i}") for i in range(4)]
    assert {x.engine for x in served} == set(NAMES) - {bad}
    assert {x.generation for x in served} == {1}
    for x in served:
        fleet.release(x)
    assert fleet.readmit(bad, who="operator").trigger.name == "READMIT_OK"
    assert fleet.admit("after", min_generation=1).generation == 1
    _chain, records = read_journal(tmp_path / "f.jsonl")
    verdict = check_fleet_records(enumerate(records, 1))
    assert verdict.accepted, verdict


def test_advance_rolls_a_rolling_fleet_and_refuses_a_quorum_of_its_own(
        rolling: tuple[Fleet, dict[str, SimAdapter]]) -> None:
    """``Fleet.update`` is the one place that picks the update by the fleet's K: a
    rolling fleet rolls (waves, never a strict step) and keeps its own quorum."""
    fleet, _ad = rolling
    with pytest.raises(FleetError, match="keeps its quorum"):
        fleet.update(sim_target(2, ckpt(2)), min_serving=1)
    assert fleet.committed == 1  # nothing changed
    report = fleet.update(sim_target(2, ckpt(2)))
    assert report.published and len(report.waves) == len(NAMES), report.as_json()
