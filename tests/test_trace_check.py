"""The trace checker: the corpus is classified correctly (and up to date), random spec
walks are accepted and corrupted ones rejected at the right line, a long journal is
checked in linear time, and the CLI's exit codes."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.check.trace import (
    SPEC_VIOLATION,
    TraceInputError,
    check_file,
    check_trace,
)
from rolloutcore.cli import main
from rolloutcore.conformance.make_traces import (
    SCENARIOS,
    TRACES,
    control_step,
    generate,
    make_bad,
    out,
    write_long_trace,
)
from rolloutcore.engine.controller import Controller, slot_id
from rolloutcore.journal import Journal, read_journal, rechain
from rolloutcore.spec.lifecycle import SPEC, Action, Bounds, Kind, Phase

GOOD = sorted((TRACES / "good").glob("*.jsonl"))
BAD = sorted((TRACES / "bad").glob("*.jsonl"))


#: The good traces make_traces writes besides one per scenario: crash recovery (ready,
#: tainted, a broken chain) and a torn final record.
RECOVERY_TRACES = ("recover_ready", "recover_tainted", "recover_broken_chain", "torn_tail")


def test_corpus_is_present(tmp_path: Path) -> None:
    assert sorted(p.stem for p in GOOD) == sorted([*SCENARIOS, *RECOVERY_TRACES])
    make_bad(TRACES / "good", tmp_path)  # the bad traces: the good ones, tampered with
    assert [p.name for p in BAD] == sorted(p.name for p in tmp_path.glob("*.jsonl"))
    assert BAD


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_traces_are_accepted(path: Path) -> None:
    v = check_file(path)
    assert v.accepted, v.message
    assert v.first_bad_line is None and v.violated is None and v.records > 0


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_traces_report_their_property(path: Path) -> None:
    expected = path.stem.split("__")[0]
    v = check_file(path)
    assert not v.accepted
    assert v.first_bad_line is not None and f"line {v.first_bad_line}" in v.message
    if expected == "spec":
        assert v.violated == SPEC_VIOLATION, v.message
    else:
        assert v.violated == expected, v.message


def test_every_kind_of_rejection_has_a_bad_trace() -> None:
    """History properties now live in the spec; the checker names the spec property a
    bad record breaks. Each of these has a bad trace in the corpus."""
    named = {p.stem.split("__")[0] for p in BAD}
    assert {"NoRolloutCrossesMutation", "AdmissionOnlyInReady", "TaintedIsAbsorbing",
            "PublishOnlyVerified", "ReadyEngineServesCommitted", "EvidenceContradictsOutcome",
            "EvidenceContradictsTarget", "Evidence", "SegmentStart", "Schema", "SequenceGap",
            "HashChain", "spec"} <= named
    history = {p.name for p in SPEC.action_properties if p.doc.startswith("History")}
    # A release clears the binding, so no journal record can change a held binding.
    assert history - named == {"BindingsKeepTheirGeneration"}


def test_corpus_is_up_to_date(tmp_path: Path) -> None:
    """The committed corpus is exactly what make_traces writes (fixed clock)."""
    fresh = generate(tmp_path)
    names = sorted(p.relative_to(tmp_path) for p in fresh)
    assert names == sorted(p.relative_to(TRACES) for p in GOOD + BAD), \
        "run `python -m rolloutcore.conformance.make_traces`"
    for p in fresh:
        assert p.read_bytes() == (TRACES / p.relative_to(tmp_path)).read_bytes(), p


# ---------------------------------------------------------------- random walks


def _random_walk(path: Path, seed: int, steps: int = 400) -> None:
    """Walk the spec at random (environment steps included, unjournalled), driving the
    real controller with a journal sink."""
    rng = random.Random(seed)
    spec = SPEC.with_bounds(Bounds(rollouts=3, generations=6, faults=3))
    s = spec.initial_states()[0]
    with Journal(path, fsync=False) as j:
        ctl = Controller(trace=j)
        for _ in range(steps):
            succ = spec.successors(s)
            if not succ:
                break
            # Mostly the happy path, so that walks get through several update cycles.
            calm = [x for x in succ if not x[0].fault and x[0].dest is not Phase.TAINTED]
            a, p, s = rng.choice(calm if calm and rng.random() < 0.93 else succ)
            take(ctl, a, p)


def take(ctl: Controller, a: Action, p: Any) -> None:
    """Drive the real controller through spec action ``a`` (outcomes journalled with
    evidence that decides them)."""
    if a.kind is Kind.ENVIRONMENT:
        return
    trigger = str(a.trigger)
    if trigger == "admit":
        ctl.admit(slot_id(p))
    elif trigger == "release":
        ctl.release(slot_id(p))
    elif trigger == "release_aborted":
        ctl.abort(slot_id(p))
    elif a.kind is Kind.RESTART:
        ctl.restart(trigger)
    elif a.kind is Kind.OUTCOME:
        out(ctl, trigger, p)
    else:
        control_step(ctl, trigger, p)


@pytest.mark.parametrize("seed", range(8))
def test_random_spec_walks_are_accepted(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "walk.jsonl"
    _random_walk(path, seed)
    v = check_file(path)
    assert v.accepted, v.message


@pytest.mark.parametrize("seed", range(4))
def test_a_corrupted_projection_is_rejected_at_its_line(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "walk.jsonl"
    _random_walk(path, seed)
    _, records = read_journal(path)
    rng = random.Random(seed)
    for _ in range(10):
        i = rng.randrange(1, len(records))
        if records[i]["type"] == "recover" or records[i]["step"].startswith("fence"):
            continue
        field = rng.choice(["phase", "committed", "target", "pending"])
        bad = [dict(r) for r in records]
        old = bad[i][field]
        if field == "phase":
            bad[i][field] = rng.choice([p.value for p in Phase if p.value != old])
        elif field == "pending":
            bad[i][field] = "none" if old != "none" else "mutate"
        else:
            bad[i][field] = old + 1
        v = check_trace(rechain(bad))
        assert not v.accepted and v.first_bad_line == i + 1, (i, field, v.message)


def test_recovered_to_tainted_is_terminal() -> None:
    _, records = read_journal(TRACES / "good" / "recover_tainted.jsonl")
    extra = {**records[-1], "seq": records[-1]["seq"] + 1, "step": "reset_begin",
             "type": "invoke", "op": "reset", "param": "prefix"}
    extra.pop("detail", None)
    v = check_trace(rechain([*records, extra]))
    assert not v.accepted and v.violated == SPEC_VIOLATION
    assert v.first_bad_line == len(records) + 1


def test_records_without_header_are_rejected() -> None:
    _, records = read_journal(TRACES / "good" / "admit_release.jsonl")
    v = check_trace(records[1:])
    assert not v.accepted and v.violated == "Schema" and v.first_bad_line == 1


# ---------------------------------------------------------------------- scale


def test_long_journal_is_checked_in_bounded_states(tmp_path: Path) -> None:
    """The checker's frontier stays small however long the journal: the work per record is
    bounded (its speed is measured in benchmarks/, never here)."""
    path = tmp_path / "long.jsonl"
    n = write_long_trace(path, 20_000, seed=1)
    v = check_file(path)
    assert v.accepted, v.message
    assert v.records == n and n >= 20_000
    assert v.states_max <= 64


# ------------------------------------------------------------------------ CLI


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_trace_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = str(TRACES / "good" / "update_cycle.jsonl")
    rc, out, _ = _cli(capsys, "trace", "check", good)
    assert rc == 0 and out.startswith("accepted")
    bad = TRACES / "bad" / "PublishOnlyVerified__publish_missing_mm_reset.jsonl"
    rc, out, _ = _cli(capsys, "trace", "check", str(bad))
    assert rc == 1 and "PublishOnlyVerified" in out and "rejected at line" in out
    rc, out, _ = _cli(capsys, "trace", "check", str(bad), "--json")
    data: dict[str, Any] = json.loads(out)
    assert rc == 1 and data["accepted"] is False
    assert data["violated"] == "PublishOnlyVerified" and data["first_bad_line"] > 1
    not_json = tmp_path / "notes.txt"
    not_json.write_text("hello, this is not a journal\n")
    rc, _, err = _cli(capsys, "trace", "check", str(not_json))
    assert rc == 2 and "not a RolloutCore journal" in err
    rc, _, err = _cli(capsys, "trace", "check", str(tmp_path / "missing.jsonl"))
    assert rc == 2 and "no such file" in err
    rc, out, _ = _cli(capsys, "trace", "check", str(tmp_path / "missing.jsonl"), "--json")
    assert rc == 2 and "error" in json.loads(out)
    with pytest.raises(TraceInputError):
        check_file(tmp_path)


def test_cli_journal_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _cli(capsys, "journal", "verify", str(TRACES / "good" / "retries.jsonl"))
    assert rc == 0 and out.startswith("chain intact")
    rc, out, _ = _cli(capsys, "journal", "verify",
                      str(TRACES / "bad" / "HashChain__edited_record.jsonl"), "--json")
    data = json.loads(out)
    assert rc == 1 and data["ok"] is False and data["first_bad_line"] > 1
    rc, out, _ = _cli(capsys, "journal", "verify", str(TRACES / "good" / "torn_tail.jsonl"))
    assert rc == 1 and "truncated final record" in out
    rc, _, err = _cli(capsys, "journal", "verify", str(tmp_path / "missing.jsonl"))
    assert rc == 2 and err == f"error: {tmp_path / 'missing.jsonl'}: no such file\n"


def test_the_scale_benchmark_at_a_thousand_bound_rollouts() -> None:
    """The checker's scale benchmark at its goal size (1,000 rollouts bound at once,
    100,000 records, built with the real controller and journal) runs in CI: the journal
    is accepted (a rejection fails the run) in memory within the goal. Its time is
    printed, not asserted: speed goals are the benchmark's to report."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_trace_check.py"
    r = subprocess.run([sys.executable, str(bench), "--bound", "1000", "--records", "100000",
                        "--repeat", "1", "--cycles", "0", "--json"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    goal = result["ratios"]["goal"]
    (row,) = result["rows"]
    print(f"\nK=1000, {row['records']:,} records: {goal['seconds']:.2f} s, "
          f"{goal['peak_rss_mb']:.1f} MB peak RSS, states_max {row['states_max']}")
    assert row["k"] == 1000 and row["records"] >= 100_000
    assert goal["peak_rss_mb"] < goal["goal_peak_rss_mb"]


@pytest.mark.deep
def test_the_run_length_benchmark_at_reduced_size() -> None:
    """The run-length benchmark (its goal: 10,000 update cycles, a fleet of 8 through
    3,000) at a tenth of its size in CI: both journals accepted, peak memory within the
    goal, which does not depend on the run's length. Times are printed, not asserted."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_trace_check.py"
    r = subprocess.run([sys.executable, str(bench), "--bound", "--cycles", "1000",
                        "--fleet-cycles", "300", "--no-timing-cost", "--json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(r.stdout)["cycle_rows"]
    assert [x["checker"] for x in rows] == ["engine", "fleet"]
    for x in rows:
        print(f"\n{x['checker']} ({x['members']} members): {x['cycles']:,} cycles, "
              f"{x['records']:,} records: {x['seconds']:.1f} s, {x['peak_rss_mb']:.1f} MB")
        assert x["records"] > 75_000
        assert x["peak_rss_mb"] < 300
