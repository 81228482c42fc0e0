"""``records verify``: each record's binding against the journal that bound it. The
journals here are built record by record (chain sealed with the journal's own helpers),
so each disagreement is exactly the one under test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.cli import main
from rolloutcore.engine.controller import Binding
from rolloutcore.journal import HEADER, SCHEMA, ZERO_HASH, dumps_line, rechain
from rolloutcore.trajectories.format import (
    Decoding,
    Segment,
    Timing,
    TrajectoryRecord,
    record_from,
    write_jsonl,
    write_parquet,
)
from rolloutcore.trajectories.provenance import Fact, JournalIndex, journal_fact

ID1, ID2 = "sha256:" + "11" * 32, "sha256:" + "22" * 32


def _step(seq: int, step: str, param: str | None = None, committed: int = 1,
          detail: dict[str, Any] | None = None, typ: str = "step") -> dict[str, Any]:
    rec: dict[str, Any] = {"seq": seq, "type": typ, "op": None, "step": step, "param": param,
                           "phase": "READY", "committed": committed, "target": 0,
                           "pending": "none", "t": float(seq), "prev": ""}
    if detail is not None:
        rec["detail"] = detail
    return rec


def _write_journal(path: Path, steps: list[dict[str, Any]]) -> Path:
    header = {"seq": 0, "type": HEADER, "schema": SCHEMA, "spec": "RolloutCore", "t": 0.0,
              "prev": ZERO_HASH}
    path.write_text("".join(dumps_line(r) for r in rechain([header, *steps])))
    return path


def _verified(rec: dict[str, Any], identity: str | None) -> dict[str, Any]:
    """``rec`` as an outcome whose decision was verified against ``identity``."""
    rec["evidence"] = {"op": "x", "evidence": [], "expected": {"identity": identity}}
    return rec


def _steps(*, bootstrap_identity: str | None = ID1,
           published_identity: str = ID2) -> list[dict[str, Any]]:
    validated = _verified(_step(6, "validate_ok", typ="ok"), ID2)
    validated["target"] = 2
    return [
        _verified(_step(1, "bootstrap_ok", detail={"label": "gen-1"}, typ="ok"),
                  bootstrap_identity),
        _step(2, "admit", "a"), _step(3, "admit", "b"),
        _step(4, "release", "a"), _step(5, "release", "b"), validated,
        # What the publish names is not evidence: validation's verified identity is.
        _step(7, "publish", committed=2, detail={"label": "gen-2",
                                                 "identity": published_identity}),
        _step(8, "admit", "c", 2), _step(9, "release", "c", 2),
        _step(10, "admit", "d", 2),  # never released
        _step(11, "admit", "a", 2), _step(12, "release", "a", 2),  # an id used again
    ]


def _rec(rollout: str, generation: int, identity: str | None, seq: int,
         aborted: bool = False) -> TrajectoryRecord:
    return record_from(Binding(rollout, generation, identity, seq, aborted), f"gen-{generation}",
                       (1, 2, 3), GenerationResult((1, 2, 3), (4,), "length", (-0.5,)),
                       Decoding(0.0), Timing(1.0, 0.1))


Row = tuple[str, int, str | None, int]
GOOD: list[Row] = [("a", 1, ID1, 2), ("b", 1, ID1, 3), ("c", 2, ID2, 8), ("a", 2, ID2, 11)]


def _verify(tmp_path: Path, records: list[Row],
            capsys: pytest.CaptureFixture[str], *, steps: list[dict[str, Any]] | None = None,
            parquet: bool = False) -> tuple[int, dict[str, Any]]:
    journal = _write_journal(tmp_path / "j.jsonl", _steps() if steps is None else steps)
    path = tmp_path / ("r.parquet" if parquet else "r.jsonl")
    (write_parquet if parquet else write_jsonl)(path, [_rec(*r) for r in records])
    rc = main(["records", "verify", str(path), "--journal", str(journal), "--json"])
    out, err = capsys.readouterr()
    assert err == ""
    return rc, json.loads(out)


def test_consistent_records_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _verify(tmp_path, GOOD, capsys)
    assert rc == 0 and data["ok"] is True
    assert data["counts"] == {"consistent": 4, "rejected": 0, "unverifiable": 0}
    assert [v["position"] for v in data["verdicts"]] == [1, 2, 3, 4]
    assert data["journal"]["admissions"] == 5


@pytest.mark.parametrize(("bad", "reason"), [
    (("a", 2, ID1, 2), "claims generation 2, admitted under generation 1"),
    (("b", 1, ID2, 3), f"claims identity {ID2}, generation 1 is {ID1}"),
    (("b", 1, None, 3), f"claims identity None, generation 1 is {ID1}"),
    (("zz", 1, ID1, 2), "journal seq 2 admits another rollout than 'zz'"),
    (("a", 1, ID1, 4), "no admission at journal seq 4"),
    (("a", 1, ID1, 99), "no admission at journal seq 99 (the journal ends at seq 12)"),
    (("d", 2, ID2, 10), "its admission (seq 10) was never released"),
    (("a", 1, ID1, 2), "a second record for the admission at seq 2 (the first is at line 1)"),
])
def test_each_disagreement_is_rejected_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        bad: Row, reason: str) -> None:
    rc, data = _verify(tmp_path, [*GOOD, bad], capsys)
    assert rc == 1 and data["ok"] is False
    last = data["verdicts"][-1]
    assert last["verdict"] == "rejected" and last["position"] == len(GOOD) + 1
    assert any(reason in r for r in last["reasons"]), last["reasons"]
    assert data["counts"]["rejected"] == 1
    # the text form names the record by file:line and says what disagrees
    journal, records = tmp_path / "j.jsonl", tmp_path / "r.jsonl"
    assert main(["records", "verify", str(records), "--journal", str(journal)]) == 1
    out = capsys.readouterr().out
    assert f"{records}:{len(GOOD) + 1}: rollout {bad[0]!r}" in out and reason in out


def test_unknown_identity_is_unverifiable_not_passed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _verify(tmp_path, GOOD, capsys, steps=_steps(bootstrap_identity=None))
    assert rc == 1 and data["ok"] is False
    verdicts = [v["verdict"] for v in data["verdicts"]]
    assert verdicts == ["unverifiable", "unverifiable", "consistent", "consistent"]
    assert "no identity for generation 1" in data["verdicts"][0]["reasons"][0]


def test_parquet_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = _verify(tmp_path, GOOD, capsys, parquet=True)
    assert rc == 0 and [v["position"] for v in data["verdicts"]] == [0, 1, 2, 3]
    rc, data = _verify(tmp_path, [*GOOD, GOOD[0]], capsys, parquet=True)
    assert rc == 1 and "(the first is at row 0)" in data["verdicts"][-1]["reasons"][0]


def test_journal_torn_tail_and_broken_chain(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    journal = _write_journal(tmp_path / "j.jsonl", _steps())
    records = tmp_path / "r.jsonl"
    write_jsonl(records, [_rec(*r) for r in GOOD])
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines) + lines[-1][:20])  # a crash mid-write: still fine
    assert main(["records", "verify", str(records), "--journal", str(journal)]) == 0
    assert "torn final record" in capsys.readouterr().out
    edited = json.loads(lines[7])  # the publish: its identity edited, chain not re-sealed
    edited["detail"]["identity"] = ID1
    journal.write_text("".join([*lines[:7], dumps_line(edited), *lines[8:]]))
    assert main(["records", "verify", str(records), "--journal", str(journal)]) == 1
    out = capsys.readouterr().out
    assert "chain BROKEN at line 8" in out and "its evidence ends there" in out


@pytest.mark.parametrize("parquet", [False, True])
def test_aborted_rollouts_are_marked_and_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], parquet: bool) -> None:
    """A rollout the drain aborted is released as aborted in the journal; its record says
    so (``binding.aborted``), and a record that says otherwise is rejected."""
    steps = [*_steps(), _step(13, "admit", "e", 2), _step(14, "release_aborted", "e", 2)]
    aborted = ("e", 2, ID2, 13, True)
    rc, data = _verify(tmp_path, [*GOOD, aborted], capsys, steps=steps,
                       parquet=parquet)
    assert rc == 0 and data["counts"]["consistent"] == len(GOOD) + 1
    for bad, reason in ((("e", 2, ID2, 13, False),
                         "claims it finished; the journal released it as aborted by the drain"),
                        (("c", 2, ID2, 8, True),
                         "claims it aborted; the journal released it as finished")):
        rows = [r for r in GOOD if r[0] != bad[0] or r[3] != bad[3]]
        rc, data = _verify(tmp_path, [*rows, bad], capsys, steps=steps,
                           parquet=parquet)
        assert rc == 1 and data["counts"]["rejected"] == 1, data
        assert any(reason in r for r in data["verdicts"][-1]["reasons"]), data["verdicts"][-1]


def test_journal_fact_is_the_one_schema_reader() -> None:
    assert journal_fact(_step(2, "admit", "a")) == Fact("admit", 2, "a", 1)
    assert journal_fact(_step(4, "release", "a")) == Fact("release", 4, "a")
    assert journal_fact(_step(4, "release_aborted", "a")) == Fact("release", 4, "a",
                                                                   aborted=True)
    # What a publish names is no evidence: the identity its validation verified is.
    assert journal_fact(_step(6, "publish", committed=2, detail={"identity": ID2})) == \
        Fact("publish", 6, None, 2)
    validated = _verified(_step(5, "validate_ok", typ="ok"), ID2)
    validated["target"] = 2
    assert journal_fact(validated) == Fact("verified", 5, None, 2, ID2)
    boot = _step(1, "bootstrap_ok", detail={"identity": ID2}, typ="ok")
    assert journal_fact(_verified(boot, ID1)) == Fact("identity", 1, None, 1, ID1)
    assert journal_fact(_step(3, "pause_ok")) is None


def test_a_publish_naming_other_weights_than_verified_is_not_believed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A journal whose publish names another identity than its validation verified: a
    record carrying the forged identity is rejected, one carrying the verified identity
    is consistent (identities come only from verified evidence)."""
    forged = "sha256:" + "ee" * 32
    steps = _steps(published_identity=forged)
    rc, data = _verify(tmp_path, GOOD, capsys, steps=steps)
    assert rc == 0 and data["counts"]["consistent"] == len(GOOD), data
    rc, data = _verify(tmp_path, [*GOOD[:2], ("c", 2, forged, 8)], capsys, steps=steps)
    assert rc == 1 and data["verdicts"][-1]["verdict"] == "rejected", data


def test_index_is_flat_arrays(tmp_path: Path) -> None:
    index = JournalIndex(_write_journal(tmp_path / "j.jsonl", _steps()))
    assert list(index.seqs) == [2, 3, 8, 10, 11]
    assert list(index.generations) == [1, 1, 2, 2, 2]
    assert list(index.released) == [1, 1, 1, 0, 1]
    assert index.identities == {1: ID1, 2: ID2}


def test_runner_rollouts_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """End to end through the runner and the simulated engine: generation 1's identity
    comes from the bootstrap's verified evidence, generation 2's from its validation."""
    from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
    from rolloutcore.engine.controller import Controller
    from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy, rollout_record
    from rolloutcore.journal import Journal, read_journal

    journal, records = tmp_path / "j.jsonl", tmp_path / "r.jsonl"
    policy = RunnerPolicy(step_timeout_s=5, retries=2, retry_backoff_s=0.0,
                          drain_timeout_s=5, mutation_base_s=5,
                          mutation_floor_bytes_per_s=1e12)
    with Journal(journal, fsync=False) as j:
        runner = LifecycleRunner(Controller(trace=j),
                                 SimAdapter(SimEngine("ckpt-1", label="rc-1")), policy)
        assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
        recs = [rollout_record(runner, "a", (1, 2, 3), 3)]
        assert runner.update(sim_target(2, "ckpt-2")).published
        recs += [rollout_record(runner, "b", (1, 2, 3), 3),
                 rollout_record(runner, "c", (4, 5), 2)]
    write_jsonl(records, recs)
    rc = main(["records", "verify", str(records), "--journal", str(journal), "--json"])
    data = json.loads(capsys.readouterr().out)
    by_id = {v["rollout_id"]: v["verdict"] for v in data["verdicts"]}
    assert by_id == {"a": "consistent", "b": "consistent", "c": "consistent"}, data
    assert rc == 0 and recs[0].identity != recs[1].identity
    # the same records against a journal of another run: rejected, not passed
    other = tmp_path / "other.jsonl"
    _, steps = read_journal(journal)
    boot = next(r for r in steps if r.get("step") == "bootstrap_ok")
    boot["evidence"]["expected"]["identity"] = "sha256:other"
    other.write_text("".join(dumps_line(r) for r in rechain(steps)))
    assert main(["records", "verify", str(records), "--journal", str(other)]) == 1
    assert "claims identity" in capsys.readouterr().out


def test_a_rollout_the_drain_aborts_is_recorded_as_aborted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the runner: a rollout far longer than the drain's abort deadline (100 s of
    simulated generation against 0.05 s) is aborted by a wait-then-abort update; its
    record is marked aborted and agrees with the journal's release_aborted."""
    import threading

    from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
    from rolloutcore.engine.controller import Controller
    from rolloutcore.engine.runner import DrainPolicy, LifecycleRunner, RunnerPolicy, rollout_record
    from rolloutcore.journal import Journal

    journal, records = tmp_path / "j.jsonl", tmp_path / "r.jsonl"
    policy = RunnerPolicy(step_timeout_s=5, retries=0, retry_backoff_s=0.0,
                          drain_policy=DrainPolicy.WAIT_THEN_ABORT, abort_after_s=0.05,
                          mutation_base_s=5, mutation_floor_bytes_per_s=1e12)
    engine = SimEngine("ckpt-1", label="rc-1", token_seconds=0.01)
    box: dict[str, TrajectoryRecord] = {}
    with Journal(journal, fsync=False) as j:
        runner = LifecycleRunner(Controller(trace=j), SimAdapter(engine), policy)
        assert runner.bootstrap(sim_target(1, "ckpt-1")).trigger == "bootstrap_ok"
        t = threading.Thread(target=lambda: box.setdefault(
            "r", rollout_record(runner, "long", (1, 2, 3), 10_000)))
        t.start()
        while not engine.running:  # the rollout's request is in the engine
            threading.Event().wait(0.001)
        report = runner.update(sim_target(2, "ckpt-2"))
        t.join(30)
    assert report.published and report.aborted == ["long"]
    rec = box["r"]
    assert rec.binding.aborted and rec.version == 1 and len(rec.response_token_ids) < 10_000
    write_jsonl(records, [rec])
    assert main(["records", "verify", str(records), "--journal", str(journal), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["consistent"] == 1


def _on(engine: str, rec: dict[str, Any]) -> dict[str, Any]:
    rec["engine"] = engine
    return rec


def _migrated_journal(second_generation: int = 1) -> list[dict[str, Any]]:
    """Rollout ``m`` admitted on e0, moved to e1 (the fleet's migrate, released there,
    admitted here), ended; rollout ``n`` admitted on e1 alone."""
    return [_verified(_step(1, "bootstrap_ok", detail={"label": "gen-1"}, typ="ok"), ID1),
            _on("e0", _step(2, "admit", "m")),
            _step(3, "migrate", detail={"rollout": "m", "members": ["e0", "e1"],
                                        "generation": 1}),
            _on("e0", _step(4, "release", "m", detail={"migrated_to": "e1"})),
            _on("e1", _step(5, "admit", "m", second_generation,
                            detail={"migrated_from": "e0"})),
            _on("e1", _step(6, "admit", "n")),
            _on("e1", _step(7, "release", "m", second_generation)),
            _on("e1", _step(8, "release", "n"))]


def _migrated(*parts: tuple[str, int, int], rollout: str = "m") -> TrajectoryRecord:
    """A record of four tokens in ``parts`` (engine, seq, generation), two tokens each
    but the last, which takes the rest."""
    at, segments, first = 0, [], parts[0][1]
    if len(parts) == 1:  # not split: a plain record of its first admission
        parts = ()
    for k, (engine, seq, generation) in enumerate(parts):
        end = 4 if k == len(parts) - 1 else at + 2
        segments.append(Segment(engine, seq, generation, at, end))
        at = end
    whole = record_from(Binding(rollout, 1, ID1, first), "gen-1", (1, 2, 3),
                        GenerationResult((1, 2, 3), (4, 5, 6, 7), "length", None),
                        Decoding(0.0), Timing(1.0, 0.1))
    return dataclasses.replace(whole, segments=tuple(segments))


@pytest.mark.parametrize(("journal_gen", "parts", "reason"), [
    (1, [("e0", 2, 1), ("e1", 5, 1)], None),
    (2, [("e0", 2, 1), ("e1", 5, 1)], "segment 1 (e1, tokens 2..4): admitted under "
                                      "generation 2, the rollout under 1: one rollout, two "
                                      "policies"),
    (1, [("e0", 2, 1), ("e1", 5, 2)], "claims generation 2, the rollout's binding 1"),
    (1, [("e0", 2, 1), ("e0", 5, 1)], "claims member 'e0', journal seq 5 admitted it on "
                                      "'e1'"),
    (1, [("e0", 2, 1), ("e1", 6, 1)], "journal seq 6 admits another rollout than 'm'"),
    (1, [("e0", 2, 1), ("e1", 7, 1)], "no admission at journal seq 7"),
    # The journal migrated m: a record of its first admission alone omits the rest.
    (1, [("e0", 2, 1)], "the journal migrated the rollout off its admission at seq 2"),
])
def test_each_segment_of_a_migrated_rollout_is_checked_against_the_journal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], journal_gen: int,
        parts: list[tuple[str, int, int]], reason: str | None) -> None:
    """A migrated rollout is consistent only if every segment's admission is of this
    rollout, on the member it names, under the rollout's one generation."""
    journal = _write_journal(tmp_path / "j.jsonl", _migrated_journal(journal_gen))
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [_migrated(*parts)])
    rc = main(["records", "verify", str(path), "--journal", str(journal), "--json"])
    data = json.loads(capsys.readouterr().out)
    (verdict,) = data["verdicts"]
    if reason is None:
        assert rc == 0 and verdict["verdict"] == "consistent", verdict
    else:
        assert rc == 1 and verdict["verdict"] == "rejected", verdict
        assert any(reason in r for r in verdict["reasons"]), verdict["reasons"]


def test_segments_claim_a_move_only_where_the_journal_migrated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same journal without its migrate record (m released on e0 and admitted on e1
    with no move announced): the record's two segments claim a move it never made."""
    steps = [r for r in _migrated_journal() if r["step"] != "migrate"]
    journal = _write_journal(tmp_path / "j.jsonl", steps)
    path = tmp_path / "r.jsonl"
    write_jsonl(path, [_migrated(("e0", 2, 1), ("e1", 5, 1))])
    rc = main(["records", "verify", str(path), "--journal", str(journal), "--json"])
    (verdict,) = json.loads(capsys.readouterr().out)["verdicts"]
    assert rc == 1 and any("never migrated it off its admission at seq 2" in r
                           for r in verdict["reasons"]), verdict
