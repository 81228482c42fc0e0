"""The fleet journal's fleet-wide properties (spec.fleet.JOURNAL_PROPERTIES) on real fleet
journals: each cross-record forgery of the project's forgery generator (records valid
alone, inconsistent together) is rejected by the property it breaks, at the record that
breaks it, while the journal it was made from is accepted; and the runtime refuses to
bind one rollout id on two members."""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.check.fleet_trace import check_fleet_records
from rolloutcore.conformance import forge
from rolloutcore.fleet import Fleet, FleetError
from rolloutcore.spec.fleet import JOURNAL_PROPERTIES


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> list[forge.Journal_]:
    tmp = tmp_path_factory.mktemp("fleet-journals")
    return [*forge.fleet_journals(tmp), forge.takeover_journal(tmp)]


def numbered(records: list[dict[str, object]]) -> list[tuple[int, dict[str, object]]]:
    return list(enumerate(records, start=1))


def test_every_journal_property_has_a_forgery() -> None:
    assert set(forge.CROSS_RECORD.values()) == set(JOURNAL_PROPERTIES)
    assert set(forge.CROSS_FORGERS) == set(forge.CROSS_RECORD)


@pytest.mark.parametrize("kind", sorted(forge.CROSS_RECORD))
def test_a_cross_record_forgery_is_rejected_by_its_property(
        journals: list[forge.Journal_], kind: str) -> None:
    made = 0
    for j in journals:
        forged = forge.CROSS_FORGERS[kind](j.records)
        if forged is None:
            continue
        made += 1
        assert check_fleet_records(numbered(j.records)).accepted, j.name
        records, line = forged
        verdict = check_fleet_records(numbered(records))
        assert not verdict.accepted, (j.name, kind)
        assert (verdict.violated, verdict.first_bad_line) == (forge.CROSS_RECORD[kind], line), (
            j.name, verdict)
    assert made, f"no journal to forge {kind} from"


def test_the_fleet_binds_a_rollout_id_on_one_member_only(tmp_path: Path) -> None:
    fleet = Fleet([(n, SimAdapter(SimEngine("ckpt-1", label="rc-1")), None) for n in "ab"],
                  journal=tmp_path / "f.jsonl", min_serving=1, fsync=False)
    try:
        fleet.bootstrap(sim_target(1, "ckpt-1"))
        lease = fleet.admit("r1")
        with pytest.raises(FleetError, match="already bound on"):
            fleet.admit("r1", exclude=[lease.engine])
        assert sum(m.controller.bound_count() for m in fleet.members.values()) == 1
    finally:
        fleet.close()


def test_recovery_refuses_a_checkpoint_path_that_does_not_hold_the_journalled_identity(
        tmp_path: Path) -> None:
    """Recovery rebuilds a generation's target from the checkpoint path its records name,
    a field the checker cannot verify (a path on the writer's machine); it believes the
    path only once the bytes there have the identity the journal verified. A journal
    whose publish names another checkpoint is refused in one line, nothing bound; the
    same journal unforged recovers."""
    import json

    from rolloutcore.journal import read_journal

    engines = {n: SimEngine("ckpt-1", label="rc-1") for n in "ab"}

    def target_of(source: str, generation: int, label: str) -> object:
        return sim_target(generation, source, label=label)

    def open_fleet(path: Path) -> Fleet:
        return Fleet([(n, SimAdapter(e), None) for n, e in engines.items()], journal=path,
                     min_serving=1, fsync=False, target_of=target_of)  # type: ignore[arg-type]

    path = tmp_path / "f.jsonl"
    first = open_fleet(path)
    first.bootstrap(sim_target(1, "ckpt-1"))
    assert first.update(sim_target(2, "ckpt-2")).published
    first.close()
    records = read_journal(path)[1]
    forged = [dict(r, detail={**r["detail"], "checkpoint": "ckpt-elsewhere"})
              if r.get("step") == "publish" and r.get("engine") == "a" else r for r in records]
    assert forged != records
    bad = tmp_path / "forged.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in forge._resealed(forged)))
    assert check_fleet_records(numbered(forge._resealed(forged))).accepted  # a path: unchecked
    with pytest.raises(FleetError) as refused:
        open_fleet(bad)
    line = str(refused.value)
    assert "\n" not in line and "refusing to recover" in line and "ckpt-elsewhere" in line
    fleet = open_fleet(path)  # the real journal recovers, and serves generation 2
    try:
        assert fleet.committed == 2 and fleet.admit("r").generation == 2
    finally:
        fleet.close()


def test_a_takeover_that_names_a_member_twice_is_rejected(
        journals: list[forge.Journal_]) -> None:
    j = next(j for j in journals if j.name == "takeover")
    records = [dict(r) for r in j.records]
    i = next(k for k, r in enumerate(records)
             if r.get("step") == "fleet_takeover" and r["detail"].get("fenced"))
    fenced = records[i]["detail"]["fenced"]
    records[i] = dict(records[i], detail={**records[i]["detail"], "fenced": fenced + fenced[:1]})
    verdict = check_fleet_records(numbered(forge._resealed(records)))
    assert (verdict.violated, verdict.first_bad_line) == ("DetailContradictsFleet", i + 1)


def test_a_member_asked_twice_in_one_update_is_rejected(
        journals: list[forge.Journal_]) -> None:
    """The fleet spec asks each member once per update (``fasked``: its liveness rests on
    it), and the checker holds a journal to it: a member that cancels and is asked again
    within the same update is rejected at the second request, although every record is a
    legal step of the member's own spec (the cancel, then the request, from READY)."""
    j = next(j for j in journals if j.name == "fleet:clean_update_live")
    assert check_fleet_records(numbered(j.records)).accepted
    i = next(k for k, r in enumerate(j.records) if r.get("step") == "request_update")
    ask = j.records[i]
    cancel = {**ask, "step": "cancel_update", "phase": "READY", "target": 0,
              "detail": {"reason": "drain timeout", "target": ask["detail"]["target"],
                         "identity": ask["detail"]["identity"]}}
    forged = forge._resealed([*j.records[:i + 1], cancel, ask, *j.records[i + 1:]])
    verdict = check_fleet_records(numbered(forged))
    assert (verdict.accepted, verdict.violated, verdict.first_bad_line) == (
        False, "spec", i + 3), verdict
    assert "asks each member once" in str(verdict.message)
