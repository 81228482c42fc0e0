"""The checkers believe nothing unproven: every field a journal claims has a rule.

The mutation test forges every field of every good journal (the trace corpus, fleet
journals written on simulated engines, a ``rolloutcore simulate`` journal) one at a time
and requires each forgery to be rejected unless ``rolloutcore.check.claims`` declares its field
informational; with the claim rules switched off, the same test finds thousands. Then
regression traces for the holes it found, each named by what it forged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.check import claims
from rolloutcore.check.fleet_trace import check_fleet_records
from rolloutcore.check.trace import check_file, check_records
from rolloutcore.cli import main
from rolloutcore.conformance import forge
from rolloutcore.conformance.make_traces import TRACES
from rolloutcore.engine.identity import ADAPTER_JOIN
from rolloutcore.journal import dumps_line, read_journal, rechain

GOOD = TRACES / "good"


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> list[forge.Journal_]:
    return forge.all_journals(tmp_path_factory.mktemp("forge"))


@pytest.mark.parametrize("stride", [pytest.param(1, marks=pytest.mark.deep), 10],
                         ids=["every", "every-tenth"])
def test_no_forged_claim_is_accepted(journals: list[forge.Journal_], stride: int) -> None:
    """Every single-field forgery of every good journal is rejected, or its field is one
    the claims module declares informational (the table is printed); make check tries
    every tenth forgery of each journal, make test all of them."""
    assert {j.fleet for j in journals} == {False, True} and len(journals) >= 21
    tally = forge.run(journals, stride=stride)
    print("\n" + forge.render(tally))
    # the generator really forges (fields x substitutions)
    assert tally.total > 30_000 // stride
    assert sum(tally.rejected.values()) > 0.8 * tally.total
    assert not tally.accepted, forge.render(tally)


def test_the_mutation_test_catches_a_checker_that_trusts_claims(
        journals: list[forge.Journal_], monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with the claim rules off (the checker as it was: decisions
    re-decided, claims believed), the mutation test finds accepted forgeries of claims:
    a publish naming other weights, an audit against other weights, a reset's tier..."""
    monkeypatch.setattr(claims.Claims, "problem", lambda self, r, phase: None)
    tally = forge.run([j for j in journals if not j.fleet][:8])
    fields = {k[1] for k in tally.accepted}
    assert sum(tally.accepted.values()) > 100
    assert {"detail.identity", "evidence.expected.identity",
            "evidence.evidence[ResetEvidence].tier",
            "evidence.evidence[PauseEvidence].mode"} <= fields, sorted(fields)


def test_every_informational_field_says_why() -> None:
    """The informational fields are declared in one place, each with its reason, and
    every step of the spec has a detail schema (derived from the spec's triggers)."""
    from rolloutcore.spec.lifecycle import SPEC

    for table in (claims.DETAIL, claims.FLEET_DETAIL):
        for fields in table.values():
            for f in (fields or {}).values():
                assert f.role.reason if isinstance(f.role, claims.Info) else f.role.rule
    for (_kind, _field), (_cond, reason) in claims.EVIDENCE_INFO.items():
        assert len(reason) > 10
    outcomes = {a.trigger for a in SPEC.actions if a.kind.value == "outcome"}
    assert outcomes <= set(claims.DETAIL)


# ------------------------------------------------------------------ regressions


def _load(name: str) -> list[dict[str, Any]]:
    return read_journal(GOOD / f"{name}.jsonl")[1]


def _at(records: list[dict[str, Any]], step: str, k: int = 0) -> int:
    return [i for i, r in enumerate(records) if r.get("step") == step][k]


def _forged(records: list[dict[str, Any]], i: int, path: tuple[Any, ...],
            value: Any) -> list[dict[str, Any]]:
    out = json.loads(json.dumps(records))
    node = out[i]
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


def _verdict(records: list[dict[str, Any]]) -> tuple[bool, str | None, str]:
    v = check_records(enumerate(rechain(records), start=1))
    return v.accepted, v.violated, v.message


OTHER = "9" * 64


def _cases() -> Iterator[tuple[str, str, int, tuple[Any, ...], Any, str]]:
    """(journal, step, its occurrence, field path, forged value, violation)."""
    yield "update_cycle", "publish", 0, ("detail", "identity"), OTHER, \
        "DetailContradictsTarget"
    yield "update_cycle", "publish", 0, ("detail", "label"), "gen-9", "DetailContradictsTarget"
    yield "update_cycle", "mutate_begin", 0, ("detail", "identity"), OTHER, \
        "DetailContradictsTarget"
    yield "update_cycle", "probe_ok", 0, ("evidence", "expected", "tolerance"), 5.0, \
        "EvidenceContradictsTarget"
    yield "update_cycle", "probe_ok", 0, ("evidence", "evidence", 0, "prompt"), [5, 3], \
        "EvidenceIncoherent"
    yield "update_cycle", "reset_ok", 2, ("evidence", "evidence", 0, "tier"), "prefix", \
        "EvidenceIncoherent"
    yield "update_cycle", "pause_ok", 0, ("evidence", "evidence", 0, "mode"), "keep", \
        "EvidenceIncoherent"
    yield "update_cycle", "validate_ok", 0, ("evidence", "evidence", 0, "paused"), False, \
        "EvidenceIncoherent"
    yield "update_cycle", "request_update", 0, ("detail", "target"), "gen-1", \
        "DetailContradictsTarget"
    yield "update_cycle", "reset_ok", 0, ("evidence", "evidence", 0, "http_status"), "200", \
        "Schema"
    yield "audit", "readmit_begin", 0, ("detail", "identity"), OTHER, \
        "DetailContradictsCommitted"
    yield "retries", "probe_ok", 0, ("evidence", "expected", "first_since_reset"), True, \
        "EvidenceIncoherent"
    yield "recover_ready", "restart_ready", 0, ("detail", "from_phase"), "UPDATING", \
        "DetailContradictsJournal"


@pytest.mark.parametrize(("name", "step", "k", "path", "value", "violated"), list(_cases()),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_a_forged_claim_is_rejected_by_name(name: str, step: str, k: int,
                                            path: tuple[Any, ...], value: Any,
                                            violated: str) -> None:
    records = _load(name)
    assert _verdict(records)[0]
    ok, got, message = _verdict(_forged(records, _at(records, step, k), path, value))
    assert not ok and got == violated, message


def test_an_audit_against_itself_onto_other_weights_is_rejected() -> None:
    """An audit that read other weights and was decided against those same weights (so
    its decision is self-consistent) is held to the committed generation's identity."""
    records = _load("audit")
    i = _at(records, "audit_ok")
    forged = _forged(records, i, ("evidence", "expected", "identity"), OTHER)
    forged = _forged(forged, i, ("evidence", "evidence", 0, "identity"), OTHER)
    ok, violated, message = _verdict(forged)
    assert not ok and violated == "EvidenceContradictsCommitted", message
    j = _at(records, "readmit_ok")
    forged = _forged(records, j, ("evidence", "expected", "identity"), OTHER)
    forged = _forged(forged, j, ("evidence", "evidence", 5, "identity"), OTHER)
    ok, violated, message = _verdict(forged)
    assert not ok and violated == "EvidenceContradictsCommitted", message


def test_a_fence_under_another_label_is_rejected() -> None:
    """A fence confirmed (its read-back equals its label) under a label that is not the
    taint label of the generation it fenced."""
    records = _load("probe_mismatch")
    i = _at(records, "fence_ok")
    forged = _forged(records, i, ("evidence", "evidence", 0, "label"), "tainted:gen-9")
    forged = _forged(forged, i, ("evidence", "evidence", 0, "label_read_back"),
                     "tainted:gen-9")
    ok, violated, message = _verdict(forged)
    assert not ok and violated == "EvidenceIncoherent", message


def test_a_request_without_its_target_is_rejected() -> None:
    records = _load("update_cycle")
    i = _at(records, "request_update")
    del records[i]["detail"]
    ok, violated, message = _verdict(records)
    assert not ok and violated == "Schema" and "lacks target" in message, message


def test_an_adapter_update_names_its_adapter_and_base() -> None:
    """An adapter update is a mutation of its own kind in the journal: the request names
    the adapter, its identity names base and adapter, on the base the engine serves."""
    records = _load("update_cycle")
    i = _at(records, "request_update")
    boot = next(r for r in records[:i] if r.get("step") == "bootstrap_ok")
    base = boot["evidence"]["evidence"][0]["identity"]  # the engine's report: what it serves
    lora = ADAPTER_JOIN + "a" * 64
    # named as an adapter update, the identity names the base weights alone
    ok, violated, message = _verdict(_forged(records, i, ("detail", "adapter"), "pol"))
    assert not ok and violated == "DetailContradictsTarget", message
    assert "base weights alone" in message
    # an identity of base and adapter, with no adapter named
    ok, violated, message = _verdict(_forged(records, i, ("detail", "identity"), base + lora))
    assert not ok and violated == "DetailContradictsTarget" and "names no adapter" in message
    # named, on a base the engine does not serve
    other = _forged(_forged(records, i, ("detail", "adapter"), "pol"), i,
                    ("detail", "identity"), OTHER + lora)
    ok, violated, message = _verdict(other)
    assert not ok and violated == "DetailContradictsCommitted", message
    # named, on the served base: the request stands (the cycle's later records, which name
    # the old identity, are what the checker rejects next)
    named = _forged(_forged(records, i, ("detail", "adapter"), "pol"), i,
                    ("detail", "identity"), base + lora)
    v = check_records(enumerate(rechain(named), start=1))
    assert not v.accepted and v.first_bad_line is not None and v.first_bad_line > i + 1, v


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(dumps_line(r) for r in records))
    return path


def test_a_continuing_segment_starts_where_the_previous_ended(tmp_path: Path) -> None:
    """With --after, the restart of a continuing segment is held to the generations and
    the phase the segment it continues ended at."""
    j = next(j for j in forge.corpus() if j.after is not None)
    assert j.after is not None
    prev = _write(tmp_path / "prev.jsonl", j.after)
    segment = tmp_path / "segment.jsonl"
    ok = check_file(_write(segment, j.records), after=prev)
    assert ok.accepted, ok.message
    for path, value, violated in (
            (("committed",), j.records[1]["committed"] + 1, "SegmentStart"),
            (("detail", "from_phase"), "UPDATING", "DetailContradictsJournal")):
        forged = rechain(_forged(j.records, 1, path, value))
        v = check_file(_write(segment, forged), after=prev)
        assert not v.accepted and v.violated == violated, v.message


def test_fleet_publish_members_of_the_wrong_type_are_a_schema_rejection(
        journals: list[forge.Journal_]) -> None:
    """Never exit 3: a fleet_publish whose members is not a list of names is rejected as
    Schema (it was a TypeError), and a string is not sorted into member names."""
    j = next(j for j in journals if j.fleet)
    i = _at(j.records, "fleet_publish")
    for bad in ("ab", [1, 2], {"a": 1}, None):
        v = check_fleet_records(enumerate(rechain(
            _forged(j.records, i, ("detail", "members"), bad)), start=1))
        assert not v.accepted and v.violated == "Schema", (bad, v.message)


def test_a_torn_final_record_is_said_and_strict_rejects_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    torn = GOOD / "torn_tail.jsonl"
    assert main(["trace", "check", str(torn)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[1] == (
        "warning: line 10 is a torn final record (a crash in mid-write), ignored"), out
    assert main(["trace", "check", str(torn), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == [
        "line 10 is a torn final record (a crash in mid-write), ignored"]
    assert main(["trace", "check", str(torn), "--strict"]) == 1
    out, err = capsys.readouterr()
    assert "TornRecord" in out


@pytest.mark.parametrize("stride", [pytest.param(1, marks=pytest.mark.deep), 10],
                         ids=["every", "every-tenth"])
def test_every_late_outcome_forgery_is_rejected_by_strict_and_warned_of_by_default(
        journals: list[forge.Journal_], stride: int) -> None:
    """Timestamp forgeries: every begin that declares its deadline, in every journal that
    has one, with the records after it dated past the deadline plus the slack. ``--strict``
    rejects each as DeadlineExceeded; the default check accepts it and reports it late.
    The good journals themselves are in time under both. (make check: every tenth.)"""
    forged = 0
    for j in journals:
        for n, (_i, records) in enumerate(forge.late_outcomes(j)):
            if n % stride:
                continue
            forged += 1
            violated, _ = forge.timing_verdict(j, records, strict=True)
            assert violated == "DeadlineExceeded", (j.name, _i, violated)
            assert forge.timing_verdict(j, records, strict=False)[0] is None, (j.name, _i)
            assert forge.timing_verdict(j, records, strict=False)[1] >= 1, (j.name, _i)
        assert forge.timing_verdict(j, j.records, strict=True) == (None, 0), j.name
    assert forged > 50 // stride, forged
