"""The journal: record format, hash chain, redaction, fsync, torn tails, recovery, and
a controller killed after every step of an update cycle coming back safe."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.check.trace import check_file
from rolloutcore.conformance.make_traces import (
    FixedClock,
    bootstrap,
    cancel_update,
    drain_and_pause,
    full_cycle,
    mutate,
    request_update,
    s_retries,
    s_update_cycle,
)
from rolloutcore.engine.controller import Controller, TraceRecord
from rolloutcore.journal import (
    REDACTED,
    SCHEMA,
    ZERO_HASH,
    Journal,
    JournalError,
    canonical,
    jepsen_type,
    open_controller,
    read_journal,
    recover,
    verify_chain,
)
from rolloutcore.journal.reader import _raw_hash_ok
from rolloutcore.spec.lifecycle import ALL_EVIDENCE, NO_OP, SPEC, Kind, Phase
from rolloutcore.spec.triggers import Trigger


def _journal(path: Path, scenario: Any = s_update_cycle, *, fsync: bool = False) -> Path:
    with Journal(path, fsync=fsync, clock=FixedClock()) as j:
        scenario(Controller(trace=j))
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


# ----------------------------------------------------------------------- format


def test_jepsen_types_follow_the_spec() -> None:
    for a in SPEC.actions:
        if a.trigger is None:
            continue
        typ = jepsen_type(a.trigger)
        if a.kind is Kind.OUTCOME:
            assert typ in ("ok", "fail", "info"), a.name
            assert (typ == "info") == a.name.endswith("_ambiguous"), a.name
        elif a.kind is Kind.RESTART:
            assert typ == "recover", a.name
        else:
            assert typ == ("invoke" if a.name.endswith("_begin") else "step"), a.name
    assert [jepsen_type(s) for s in ("mutate_begin", "mutate_ok", "mutate_refused",
                                     "mutate_ambiguous", "validate_mismatch", "admit",
                                     "publish", "give_up", "restart_tainted")] == [
        "invoke", "ok", "fail", "info", "fail", "step", "step", "step", "recover"]
    with pytest.raises(KeyError):
        jepsen_type("teleport")


def test_record_format_and_chain(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j.jsonl")
    prev = ZERO_HASH
    for n, line in enumerate(_lines(path)):
        rec = json.loads(line)
        assert line == canonical(rec) + "\n"  # keys sorted, compact separators
        assert rec["seq"] == n and rec["prev"] == prev
        body = {k: v for k, v in rec.items() if k != "hash"}
        assert rec["hash"] == hashlib.sha256(canonical(body).encode()).hexdigest()
        assert _raw_hash_ok(line.rstrip("\n").encode(), rec["hash"])  # the fast path applies
        if n == 0:
            assert set(rec) == {"seq", "type", "schema", "spec", "t", "prev", "hash"}
            assert (rec["type"], rec["schema"], rec["spec"]) == (
                "header", SCHEMA, "RolloutCore")
        else:
            assert set(rec) - {"detail", "evidence"} == {
                "seq", "type", "op", "step", "param", "phase", "committed", "target",
                "pending", "t", "prev", "hash"}
            assert rec["type"] == jepsen_type(rec["step"])
            # Outcomes, and only outcomes, carry the decision they were taken on.
            assert ("evidence" in rec) == (rec["type"] in ("ok", "fail", "info")), rec
            assert isinstance(rec["t"], float)
        prev = rec["hash"]
    report = verify_chain(path)
    assert report.ok and report.records == len(_lines(path)) and report.first_bad_line is None


def test_secrets_never_reach_the_file(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, fsync=False) as j:
        ctl = Controller(trace=j)
        detail: dict[Any, Any] = {
            "url": "http://engine", "Authorization": "Bearer s3cr3t-1",
            "nested": {"deeper": [{"API_KEY": "s3cr3t-2"}, {"x-api-key": "s3cr3t-3"}],
                       "Set-Cookie": "s3cr3t-4", "keep": 1},
            "Password": "s3cr3t-5", "refresh_token": "s3cr3t-6", 7: {"ClientSecret": "s3cr3t-7"},
        }
        ctl.fire("bootstrap_begin", detail=detail)
    text = path.read_text()
    assert "s3cr3t" not in text
    detail = json.loads(_lines(path)[1])["detail"]
    assert detail["url"] == "http://engine" and detail["nested"]["keep"] == 1
    assert detail["Authorization"] == REDACTED
    assert detail["nested"]["deeper"] == [{"API_KEY": REDACTED}, {"x-api-key": REDACTED}]
    assert detail["7"] == {"ClientSecret": REDACTED}
    assert verify_chain(path).ok


def test_fsync_before_the_step_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:  # fsync on by default
        after_header = len(synced)
        assert after_header >= 2  # the header and the directory entry
        ctl = Controller(trace=j)
        ctl.fire("bootstrap_begin")
        assert len(synced) == after_header + 1  # durable before fire() returned
        ctl.fire("bootstrap_ok")
        ctl.admit("r1")
        assert len(synced) == after_header + 3
    assert verify_chain(path).ok
    synced.clear()
    with Journal(tmp_path / "nosync.jsonl", fsync=False) as j:
        Controller(trace=j).fire("bootstrap_begin")
    assert synced == []


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j.jsonl", s_retries)
    n = len(_lines(path))
    with Journal(path, fsync=False) as j:
        assert j.last_seq == n - 1
        j(TraceRecord(n, "admit", "late", Phase.READY, 2, 0, NO_OP, None))
        with pytest.raises(JournalError):  # a sequence number never goes back
            j(TraceRecord(n, "release", "late", Phase.READY, 2, 0, NO_OP, None))
        with pytest.raises(JournalError):
            j(TraceRecord(n + 1, "teleport", None, Phase.READY, 2, 0, NO_OP, None))
    report = verify_chain(path)
    assert report.ok and report.records == n + 1 and report.last_seq == n
    with pytest.raises(JournalError):
        j(TraceRecord(n + 1, "release", "late", Phase.READY, 2, 0, NO_OP, None))  # closed


def test_concurrent_steps_keep_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, fsync=False) as j:
        ctl = Controller(trace=j)
        bootstrap(ctl)

        def worker(w: int) -> None:
            for i in range(100):
                ctl.admit(f"w{w}-{i}")
                ctl.release(f"w{w}-{i}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    report = verify_chain(path)
    assert report.ok and report.last_seq == 2 + 800
    assert check_file(path).accepted


# ------------------------------------------------------------------ verification


@pytest.mark.parametrize("how", ["edit", "delete", "swap", "garbage", "drop_field"])
def test_tampering_is_found_at_the_right_line(tmp_path: Path, how: str) -> None:
    good = _lines(_journal(tmp_path / "good.jsonl"))
    for i in range(1, len(good) - 1):  # 0-based index of the tampered line
        lines = list(good)
        rec = json.loads(lines[i])
        if how == "edit":
            rec["committed"] += 1
            lines[i] = canonical(rec) + "\n"
        elif how == "delete":
            del lines[i]
        elif how == "swap":
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        elif how == "garbage":
            lines[i] = "{not json\n"
        else:
            del rec["target"]
            lines[i] = canonical(rec) + "\n"
        path = tmp_path / f"{how}.jsonl"
        path.write_text("".join(lines))
        report = verify_chain(path)
        assert not report.ok and not report.truncated, (how, i)
        assert report.first_bad_line == i + 1, (how, i, report)
        assert report.records == i


def test_a_bad_first_line_is_reported(tmp_path: Path) -> None:
    lines = _lines(_journal(tmp_path / "good.jsonl"))
    path = tmp_path / "j.jsonl"
    path.write_text("".join(lines[1:]))  # no header
    report = verify_chain(path)
    assert not report.ok and report.first_bad_line == 1


def test_torn_tail(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j.jsonl")
    lines = _lines(path)
    last = lines[-1]
    for cut in (1, len(last) // 2, len(last) - 1):  # the newline is the last byte written
        path.write_text("".join(lines[:-1]) + last[:cut])
        report = verify_chain(path)
        assert not report.ok and report.truncated
        assert report.reason == "truncated final record"
        assert report.first_bad_line == len(lines) and report.records == len(lines) - 1
        rec = recover(path)
        assert rec.next_seq == len(lines) - 1  # the torn step did not happen
    # NULs at the end (space allocated, data lost) are a torn tail too.
    path.write_text("".join(lines[:-1]) + "\0" * 40)
    assert verify_chain(path).truncated
    # Reopening cuts the torn tail off and continues the chain.
    with Journal(path, fsync=False) as j:
        assert j.last_seq == len(lines) - 2
    assert verify_chain(path).ok and _lines(path) == lines[:-1]


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    report = verify_chain(empty)
    assert not report.ok and report.truncated and report.records == 0
    assert recover(empty).control.phase is Phase.UNINITIALIZED
    with pytest.raises(FileNotFoundError):
        verify_chain(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------- recovery


def _unresolved_pause(prefix: list[dict[str, Any]]) -> bool:
    """A pause failed in the current drain and no resume was confirmed after it."""
    steps = [r.get("step") for r in prefix]
    start = max((i for i, st in enumerate(steps) if st == "request_update"), default=0)
    tail = steps[start:]
    last_fail = max((i for i, st in enumerate(tail) if st == "pause_failed"), default=-1)
    return last_fail >= 0 and "resume_ok" not in tail[last_fail:]


def test_killed_after_every_step_comes_back_safe(tmp_path: Path) -> None:
    """Truncate a journal of full update cycles (retries included) after each record,
    and mid-record, then recover: READY only when the spec proves it safe, TAINTED
    whenever a pause or mutation may be in flight, and the restarted controller's
    journal (with its recover record) passes the trace checker."""
    def scenario(c: Controller) -> None:
        s_retries(c)
        c.admit("r9")
        request_update(c)
        c.release("r9")
        cancel_update(c)
        full_cycle(c)

    full = _journal(tmp_path / "full.jsonl", scenario)
    lines = _lines(full)
    _, records = read_journal(full)
    outcomes: dict[str, int] = {}
    for k in range(1, len(lines) + 1):  # keep lines[:k]
        for torn in (False, True):
            if torn and k == len(lines):
                continue
            path = tmp_path / f"cut{k}{'t' if torn else ''}.jsonl"
            path.write_text("".join(lines[:k]) + (lines[k][:20] if torn else ""))
            last = records[k - 1]
            rec = recover(path)
            ctl, j, rec2 = open_controller(path, fsync=False, clock=FixedClock())
            phase = ctl.control.phase
            outcomes[phase.value] = outcomes.get(phase.value, 0) + 1
            assert rec.next_seq == k and rec2.trigger == rec.trigger
            if k == 1 or last["phase"] == "UNINITIALIZED":
                assert phase is Phase.UNINITIALIZED and not rec.tainted
            elif last["phase"] == "READY" or (last["phase"] == "DRAINING"
                                              and last["pending"] == NO_OP
                                              and not _unresolved_pause(records[:k])):
                assert phase is Phase.READY and not rec.tainted
                assert ctl.control.committed == last["committed"]
                assert ctl.control.evidence == ALL_EVIDENCE and ctl.control.target == 0
            else:  # a pause or mutation may be in flight, or it happened: fail closed
                assert phase is Phase.TAINTED and rec.tainted, (k, last)
            assert not (phase is Phase.READY and last["pending"] != NO_OP)
            assert not ctl.bindings
            if phase is Phase.READY:  # the restarted controller goes on working
                ctl.admit("after")
                ctl.release("after")
                full_cycle(ctl)
            j.close()
            # The restart record is a spec step: the checker proves it safe.
            verdict = check_file(path)
            assert verdict.accepted, (k, torn, verdict)
            assert verify_chain(path).ok
    assert set(outcomes) == {"UNINITIALIZED", "READY", "TAINTED"}


def test_recover_from_tainted_stays_tainted(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, fsync=False) as j:
        c = Controller(trace=j)
        bootstrap(c)
        drain_and_pause(c)
        mutate(c, "mutate_ambiguous")
    for _ in range(2):
        ctl, j, rec = open_controller(path, fsync=False)
        j.close()
        assert rec.tainted and ctl.phase is Phase.TAINTED and rec.from_phase == "TAINTED"
    assert check_file(path).accepted


def test_broken_chain_recovers_tainted_and_is_kept(tmp_path: Path) -> None:
    path = _journal(tmp_path / "j.jsonl")
    lines = _lines(path)
    lines[5] = lines[5].replace('"committed":1', '"committed":7')
    path.write_text("".join(lines))
    with pytest.raises(JournalError):
        Journal(path)
    rec = recover(path)
    assert rec.tainted and rec.control.phase is Phase.TAINTED and not rec.trusted
    assert "line 6" in rec.reason
    ctl, j, rec = open_controller(path, fsync=False)
    j.close()
    assert ctl.phase is Phase.TAINTED
    aside = tmp_path / "j.jsonl.broken"
    assert aside.read_text() == "".join(lines)  # the evidence is kept, untouched
    assert verify_chain(path).ok and check_file(path).accepted
    _, records = read_journal(path)
    assert [r["type"] for r in records] == ["header", "recover"]
    assert records[1]["step"] == Trigger.RESTART_TAINTED
    assert records[0]["continues"] == json.loads(lines[4])["hash"]  # the last good line


def test_open_controller_fresh(tmp_path: Path) -> None:
    ctl, j, rec = open_controller(tmp_path / "new.jsonl", fsync=False)
    assert ctl.phase is Phase.UNINITIALIZED and rec.next_seq == 1 and not rec.tainted
    ctl.fire("bootstrap_begin")
    j.close()
    _, records = read_journal(tmp_path / "new.jsonl")
    assert [r["seq"] for r in records] == [0, 1]
