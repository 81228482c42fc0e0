"""The controller's crash and recovery as spec steps, on a real (simulated-engine) fleet
journal: the runtime's recovery journals each member's restart and then fleet_recover
(or fleet_recover_closed), the fleet checker accepts it, and it rejects a journal whose
recovery skips a member's restart, claims the wrong outcome, or lets a member act while
the fleet recovers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.check.fleet_trace import check_fleet_records
from rolloutcore.fleet import Fleet
from rolloutcore.journal import rechain
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.triggers import Trigger

Record = dict[str, Any]


def _records(path: Path) -> list[Record]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _check(records: list[Record]) -> Any:
    return check_fleet_records(list(enumerate(records, start=1)))


def _resealed(records: list[Record]) -> list[Record]:
    return rechain([dict(r, seq=i) for i, r in enumerate(records)])


@pytest.fixture(scope="module")
def recovered(tmp_path_factory: pytest.TempPathFactory) -> list[Record]:
    """A fleet of two (both needed) that crashes at rest and recovers on its journal."""
    path = tmp_path_factory.mktemp("recovery") / "f.jsonl"
    adapters = {n: SimAdapter(SimEngine("ckpt-1", label="rc-1")) for n in "ab"}
    fleet = Fleet([(n, a, None) for n, a in adapters.items()], journal=path, min_serving=2,
                  fsync=False)
    fleet.bootstrap(sim_target(1, "ckpt-1"))
    fleet.close()  # the process dies; its successor recovers on the journal
    again = Fleet([(n, a, None) for n, a in adapters.items()], journal=path, fsync=False,
                  target_of=lambda src, gen, label: sim_target(gen, src))
    try:
        assert again.recovered == {"a": Trigger.RESTART_READY, "b": Trigger.RESTART_READY}
        assert again.phase == FleetPhase.READY and again.down == frozenset()
    finally:
        again.close()
    return _records(path)


def _at(records: list[Record], step: str, engine: str | None = None) -> int:
    return next(i for i, r in enumerate(records)
                if r.get("step") == step and (engine is None or r.get("engine") == engine))


def test_the_runtime_recovery_is_restarts_then_fleet_recover_and_is_accepted(
        recovered: list[Record]) -> None:
    steps = [r.get("step") for r in recovered if r.get("type") != "header"]
    assert steps[-3:] == ["restart_ready", "restart_ready", "fleet_recover"]
    assert _check(recovered).accepted


def test_a_recovery_that_skips_a_restart_is_rejected(recovered: list[Record]) -> None:
    i = _at(recovered, "restart_ready", "b")
    forged = _resealed([*recovered[:i], *recovered[i + 1:]])
    v = _check(forged)
    assert not v.accepted
    assert (v.violated, v.first_bad_line) == ("spec", _at(forged, "fleet_recover") + 1)
    assert "['b'] restarted" in v.message


def test_a_recovery_that_stays_closed_with_a_quorum_is_rejected(
        recovered: list[Record]) -> None:
    i = _at(recovered, "fleet_recover")
    forged = _resealed([*recovered[:i], dict(recovered[i], step="fleet_recover_closed",
                                             phase=FleetPhase.ABORTING)])
    v = _check(forged)
    assert not v.accepted and (v.violated, v.first_bad_line) == ("spec", i + 1)


def test_a_member_step_while_the_fleet_recovers_is_rejected(
        recovered: list[Record]) -> None:
    """Between the restarts and the fleet's recovery the controller takes no other step:
    an audit of a member already restarted is not one the spec allows there."""
    i = _at(recovered, "restart_ready", "b")
    audit = dict(recovered[i - 1], step="audit_begin", detail={"deadline_s": 5.0})
    forged = _resealed([*recovered[:i], audit, *recovered[i:]])
    v = _check(forged)
    assert not v.accepted
    assert (v.violated, v.first_bad_line) == ("FleetGuard", i + 1)
    assert "while the fleet recovers" in v.message


def test_a_second_crash_during_the_recovery_restarts_everyone_again(
        recovered: list[Record]) -> None:
    """A member restarted twice means the controller crashed again mid-recovery: its
    successor restarts every member once more before the fleet recovers."""
    i = _at(recovered, "restart_ready", "b")
    again = dict(recovered[i - 1])  # a's restart, once more
    forged = _resealed([*recovered[:i], again, *recovered[i:]])
    assert _check(forged).accepted
    # and then b alone is not enough if a's second restart came after b's first
    j = _at(recovered, "fleet_recover")
    late = _resealed([*recovered[:j], again, *recovered[j:]])  # a, b, a: b is down again
    v = _check(late)
    assert not v.accepted and v.violated == "spec" and "['b'] restarted" in v.message
