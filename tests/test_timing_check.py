"""Time on real journals: every attempt's begin declares its deadline (``deadline_s``), and
the trace checker holds the outcome to it plus TIMING_SLACK_S. A late outcome is a warning
by default (wall clocks can step) and a rejection with ``--strict``, naming the record and
the numbers. The negative control: an engine call that ignores its deadline (an injected
delay the test controls) yields a journal the strict check rejects."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.check.claims import TIMING_SLACK_S
from rolloutcore.check.trace import check_file
from rolloutcore.cli import main
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.engine.simulate import simulate
from rolloutcore.journal import Journal, read_journal, rechain

POLICY = RunnerPolicy(step_timeout_s=0.3, pause_timeout_s=5.0, fence_timeout_s=5.0,
                      drain_timeout_s=5.0, retries=0, retry_backoff_s=0.0)


def _late_copy(src: Path, dst: Path) -> int:
    """``src`` with one outcome written ``TIMING_SLACK_S`` + 1 s past its attempt's
    deadline (every later record shifted with it); returns that record's line."""
    header, *records = [json.loads(x) for x in src.read_text().splitlines()]
    i = next(k for k, r in enumerate(records)
             if r.get("type") == "invoke" and "deadline_s" in (r.get("detail") or {}))
    shift = records[i]["detail"]["deadline_s"] + TIMING_SLACK_S + 1.0
    for r in records[i + 1:]:
        r["t"] = r["t"] + shift
    dst.write_text("".join(json.dumps(r) + "\n" for r in rechain([header, *records])))
    return i + 3  # the header is line 1, the begin line i + 2, its outcome the next


def test_every_begin_declares_its_deadline_and_a_clean_journal_is_in_time(
        tmp_path: Path) -> None:
    res = simulate(2, journal=tmp_path / "j.jsonl", fsync=False)
    begins = [r for r in read_journal(tmp_path / "j.jsonl")[1] if r.get("type") == "invoke"]
    assert begins and all(isinstance((r.get("detail") or {}).get("deadline_s"), float)
                          for r in begins), begins[:3]
    verdict = check_file(tmp_path / "j.jsonl", strict=True)
    assert res.trace.accepted and verdict.accepted and verdict.warnings == (), verdict


def test_a_late_outcome_is_a_warning_and_strict_rejects_it(
        tmp_path: Path) -> None:
    simulate(1, journal=tmp_path / "j.jsonl", fsync=False)
    line = _late_copy(tmp_path / "j.jsonl", tmp_path / "late.jsonl")
    lenient = check_file(tmp_path / "late.jsonl")
    assert lenient.accepted and any("past their deadline" in w for w in lenient.warnings)
    strict = check_file(tmp_path / "late.jsonl", strict=True)
    assert not strict.accepted and strict.violated == "DeadlineExceeded", strict
    assert strict.first_bad_line == line and "past its deadline of" in strict.message
    assert main(["trace", "check", str(tmp_path / "late.jsonl"), "--strict"]) == 1
    assert main(["trace", "check", str(tmp_path / "late.jsonl")]) == 0


def test_a_call_that_ignores_its_deadline_leaves_a_journal_strict_rejects(
        tmp_path: Path) -> None:
    """The engine's state read during validation sleeps past the attempt's deadline (an
    adapter that cannot be interrupted): the runner records the late return, and the
    journal's outcome comes past the deadline plus the slack."""
    adapter = SimAdapter(SimEngine("ckpt-1", label="rc-1"))
    journal = tmp_path / "j.jsonl"
    controller = Controller(trace=Journal(journal, fsync=False))
    runner = LifecycleRunner(controller, adapter, POLICY)
    runner.bootstrap(sim_target(1, "ckpt-1"))
    read = adapter.read_state
    calls = {"n": 0}

    def slow_read(deadline: float) -> object:
        calls["n"] += 1
        if calls["n"] == 1:  # the validation's read: held past the deadline, once
            time.sleep(POLICY.step_timeout_s + TIMING_SLACK_S + 0.5)
        return read(deadline)

    adapter.read_state = slow_read  # type: ignore[method-assign, assignment]
    runner.update(sim_target(2, "ckpt-2"))
    assert runner.stuck_calls, "the runner did not see the late return"
    assert check_file(journal).accepted
    strict = check_file(journal, strict=True)
    assert not strict.accepted and strict.violated == "DeadlineExceeded", strict


def test_a_closed_window_longer_than_its_declared_deadlines_is_caught(
        tmp_path: Path) -> None:
    """Every attempt in time, but admissions stay closed longer than the request's drain
    plus every attempt's deadline (the controller sat between its last outcome and the
    publish): a warning by default, rejected with --strict, naming the window."""
    simulate(1, journal=tmp_path / "j.jsonl", fsync=False)
    header, *records = [json.loads(x) for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    start = next(i for i, r in enumerate(records) if r.get("step") == "request_update")
    publish = next(i for i, r in enumerate(records) if r.get("step") == "publish")
    window = records[start:publish]
    budget = records[start]["detail"]["drain_s"] + sum(
        r["detail"]["deadline_s"] for r in window if r.get("type") == "invoke")
    attempts = sum(r.get("type") == "invoke" for r in window)
    shift = budget + TIMING_SLACK_S * (attempts + 1) + 1.0
    for r in records[publish:]:
        r["t"] = r["t"] + shift
    late = tmp_path / "late.jsonl"
    late.write_text("".join(json.dumps(r) + "\n" for r in rechain([header, *records])))
    lenient = check_file(late)
    assert lenient.accepted and any("past their deadline" in w for w in lenient.warnings)
    strict = check_file(late, strict=True)
    assert not strict.accepted and strict.violated == "DeadlineExceeded", strict
    assert strict.first_bad_line == publish + 2 and "admissions were closed for" in \
        strict.message, strict
    # the same delay inside the budget is in time
    for r in records[publish:]:
        r["t"] = r["t"] - shift + budget / 2
    ok = tmp_path / "ok.jsonl"
    ok.write_text("".join(json.dumps(r) + "\n" for r in rechain([header, *records])))
    assert check_file(ok, strict=True).accepted
