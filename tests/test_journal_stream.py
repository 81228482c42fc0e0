"""Streaming readers: the journal's :class:`JournalReader` (same verdicts as the former
whole-file scan, kept here as the reference, on many damaged journals), bounded lines,
ill-typed fields; the records' ``iter_*`` readers; redaction by key name and by value."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.conformance.make_traces import FixedClock, s_admit_release
from rolloutcore.engine.controller import Binding, Controller
from rolloutcore.journal import (
    HEADER,
    REDACTED,
    ZERO_HASH,
    ChainReport,
    Journal,
    JournalReader,
    canonical,
    dumps_line,
    read_journal,
    rechain,
    redact,
    verify_chain,
)
from rolloutcore.journal.reader import _check_fields, _raw_hash_ok, scan
from rolloutcore.trajectories.format import (
    PARQUET_ROW_GROUP,
    Decoding,
    RecordError,
    Timing,
    TrajectoryRecord,
    dumps,
    iter_records,
    iter_records_at,
    record_from,
    write_parquet,
)

# ------------------------------------------------ the former scan, as the reference


def _reference_scan(data: bytes) -> tuple[ChainReport, list[dict[str, Any]], int]:
    """The whole-file scan the streaming reader replaced (verbatim, but for the input)."""
    records: list[dict[str, Any]] = []
    if not data:
        return ChainReport(False, 0, 1, "truncated final record (empty journal)", True), [], 0
    lines = data.split(b"\n")
    torn_tail = lines.pop()
    prev, last_seq, offset, n = ZERO_HASH, -1, 0, 0

    def broken(reason: str, truncated: bool = False) -> tuple[
        ChainReport, list[dict[str, Any]], int
    ]:
        return (ChainReport(False, n, n + 1, reason, truncated, last_seq, prev),
                records, offset)

    for raw in lines:
        try:
            rec = json.loads(raw)
        except ValueError:
            if not raw.strip(b"\0") and n + 1 == len(lines) and not torn_tail.strip(b"\0"):
                return broken("truncated final record", truncated=True)
            return broken("not a JSON line")
        if not isinstance(rec, dict):
            return broken("not a JSON object")
        h = rec.pop("hash", None)
        if not isinstance(h, str):
            return broken("missing field: hash")
        bad = _check_fields(rec)
        if bad:
            return broken(bad)
        if rec["prev"] != prev:
            return broken("prev does not match the previous record's hash"
                          if n else "the first record's prev is not 64 zeros")
        if not _raw_hash_ok(raw, h) and hashlib.sha256(
                json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest() != h:
            return broken("hash does not match the record's content")
        seq = rec["seq"]
        if n == 0 and (rec["type"] != HEADER or seq != 0):
            return broken("the first record is not a header with seq 0")
        if n and seq <= last_seq:
            return broken(f"seq {seq} does not increase (previous {last_seq})")
        rec["hash"] = h
        records.append(rec)
        prev, last_seq, n = h, seq, n + 1
        offset += len(raw) + 1
    if torn_tail:
        return broken("truncated final record", truncated=True)
    return ChainReport(True, n, None, "chain intact", False, last_seq, prev), records, offset


def _good(tmp_path: Path) -> bytes:
    path = tmp_path / "good.jsonl"
    with Journal(path, fsync=False, clock=FixedClock()) as j:
        s_admit_release(Controller(trace=j))
    return path.read_bytes()


def _damaged(good: bytes, rng: random.Random) -> bytes:
    lines = good.splitlines(keepends=True)
    k = rng.randrange(len(lines))
    how = rng.randrange(9)
    if how == 0:  # cut anywhere
        return good[:rng.randrange(len(good) + 1)]
    if how == 1:  # NULs after the last full line, with or without a newline
        return b"".join(lines[:k]) + b"\0" * rng.randrange(1, 50) + rng.choice([b"", b"\n"])
    if how == 2:  # NUL line, then a torn NUL tail or more records
        return b"".join(lines[:k]) + b"\0" * 9 + b"\n" + rng.choice(
            [b"", b"\0\0\0", b"".join(lines[k:]), b"x"])
    if how == 3:  # empty lines
        return b"".join(lines[:k]) + b"\n" * rng.randrange(1, 3) + rng.choice(
            [b"", b"".join(lines[k:])])
    if how == 4:  # a byte flipped
        i = rng.randrange(len(good))
        return good[:i] + bytes([good[i] ^ 1]) + good[i + 1:]
    if how == 5:  # a line dropped or duplicated
        return b"".join(lines[:k] + lines[k + 1:] if rng.random() < 0.5 else
                        lines[:k + 1] + lines[k:])
    if how == 6:  # garbage: not JSON, not an object, an array
        return b"".join(lines[:k]) + rng.choice([b"{x\n", b"[1]\n", b"17\n", b"\xff\n"]) \
            + b"".join(lines[k:])
    if how == 7:  # a torn tail after NULs mixed with data
        return b"".join(lines[:k]) + b"\0\0a\0"
    return good


def test_reader_agrees_with_the_former_scan(tmp_path: Path) -> None:
    good = _good(tmp_path)
    rng = random.Random(1234)
    path = tmp_path / "j.jsonl"
    cases = [good, b"", b"\n", b"\0" * 10, b"\0\n\0", good + b"\n", good + b"\0\n\0\0"]
    cases += [_damaged(good, rng) for _ in range(400)]
    kinds = set()
    for data in cases:
        path.write_bytes(data)
        report, records, end = scan(path)
        want = _reference_scan(data)
        assert (report, records, end) == want, (data[-80:], report, want[0])
        kinds.add((report.ok, report.truncated, report.reason.split(" ")[0]))
    assert len(kinds) >= 6  # the damage reached many different verdicts


def test_reader_yields_line_numbers_and_reports_after(tmp_path: Path) -> None:
    good = _good(tmp_path)
    path = tmp_path / "j.jsonl"
    path.write_bytes(good + b'{"torn')
    reader = JournalReader(path)
    with pytest.raises(RuntimeError):
        _ = reader.report
    seen = list(reader)
    assert [n for n, _ in seen] == list(range(1, good.count(b"\n") + 1))
    assert all("hash" in r for _, r in seen) and seen[0][1]["type"] == HEADER
    assert reader.report.truncated and reader.good_end == len(good)
    assert read_journal(path)[1] == [r for _, r in seen]
    with pytest.raises(IsADirectoryError):
        list(JournalReader(tmp_path))


def test_overlong_lines_are_never_loaded(tmp_path: Path) -> None:
    good = _good(tmp_path)
    path = tmp_path / "j.jsonl"
    path.write_bytes(good + b"x" * 5000 + b"\n" + good.split(b"\n")[0] + b"\n")
    r = JournalReader(path, max_line=1000)
    assert len(list(r)) == good.count(b"\n")
    assert r.report.reason == "line longer than 1000 bytes" and not r.report.truncated
    assert r.report.first_bad_line == good.count(b"\n") + 1
    for tail in (b"x" * 5000, b"\0" * 5000 + b"\n", b"\0" * 5000 + b"\n" + b"\0" * 3000):
        path.write_bytes(good + tail)  # a long torn tail or final NUL run: a crash
        r = JournalReader(path, max_line=1000)
        list(r)
        assert r.report.truncated and r.good_end == len(good), tail[:3]


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("seq", [2], "seq is not an integer"),
    ("committed", "1", "committed has the wrong type: str"),
    ("committed", True, "committed has the wrong type: bool"),
    ("phase", None, "phase has the wrong type"),
    ("param", 7, "param has the wrong type"),
    ("type", ["step"], "type is not a string"),
    ("detail", [1], "detail is not an object"),
])
def test_ill_typed_fields_break_the_chain_at_their_line(
        tmp_path: Path, field: str, value: Any, reason: str) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(_good(tmp_path))
    _, recs = read_journal(path)
    recs[3][field] = value  # valid JSON, re-sealed: only the type is wrong
    path.write_text("".join(dumps_line(r) for r in rechain(recs)))
    report = verify_chain(path)
    assert not report.ok and report.first_bad_line == 4 and reason in report.reason


def test_nested_too_deep_is_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"[" * 200_000 + b"\n")
    assert verify_chain(path).reason == "not a JSON line"


# --------------------------------------------------------------------- records


def _rec(i: int) -> TrajectoryRecord:
    return record_from(Binding(f"r{i}", 1, None, i), "v1", (1, 2, i),
                       GenerationResult((1, 2, i), (4,), "length", (-0.5,)),
                       Decoding(0.0), Timing(1.0, 0.1))


def test_iter_records_jsonl_positions(tmp_path: Path) -> None:
    p = tmp_path / "r.jsonl"
    p.write_text(dumps(_rec(0)) + "\n\n" + dumps(_rec(1)) + "\n")
    assert [(n, r.rollout_id) for n, r in iter_records_at(p)] == [(1, "r0"), (3, "r1")]
    p.write_text(dumps(_rec(0)) + "\n" + "[" * 100_000 + "\n")
    it = iter_records(p)
    assert next(it).rollout_id == "r0"  # streamed: the first record before the bad line
    with pytest.raises(RecordError, match=r"r.jsonl:2: not JSON"):
        next(it)
    with pytest.raises(RecordError, match="is a directory"):
        list(iter_records(tmp_path))


def test_iter_parquet_by_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    p = tmp_path / "r.parquet"
    n = 2 * PARQUET_ROW_GROUP + 5
    assert write_parquet(p, (_rec(i) for i in range(n))) == n
    assert pq.ParquetFile(p).num_row_groups == 3  # written in bounded row groups

    def whole_file(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("read_table loads the whole file")

    monkeypatch.setattr(pq, "read_table", whole_file)
    got = [(i, r.rollout_id) for i, r in iter_records_at(p)]
    assert got == [(i, f"r{i}") for i in range(n)]


# ------------------------------------------------------------------- redaction


def test_token_fields_survive_redaction() -> None:
    detail = {"tokens": [1, 2, 3], "prompt_token_ids": [5, 6], "max_tokens": 16,
              "num_tokens": 7, "token": 42, "tokens_in": 512, "eos_token_id": 2}
    assert redact(detail) == detail


@pytest.mark.parametrize("key", [
    "Authorization", "proxy-authorization", "Proxy_Authorization", "API_KEY", "apikey",
    "x-api-key", "X_Api_Key", "bearer", "Bearer-Token", "admin_token", "ACCESS_TOKEN",
    "auth-token", "secret", "ClientSecret", "client_secret", "password", "Cookie",
    "Set-Cookie", "refresh_token",
])
def test_secret_keys_are_redacted(key: str) -> None:
    assert redact({key: "s3cr3t", "nested": [{key: {"deep": 1}}]}) == {
        key: REDACTED, "nested": [{key: REDACTED}]}


@pytest.mark.parametrize("value", [
    "Bearer abcdefghijklmnopqrstuvwxyz0123", "bearer eyJhbGciOiJIUzI1NiJ9.abc.def",
    "sk-" + "A1b2" * 6, "hf_" + "x" * 34,
])
def test_credential_values_are_redacted_under_any_key(value: str) -> None:
    assert redact({"tokens": value, "note": [value], "headers": [["Authorization", value]]}) \
        == {"tokens": REDACTED, "note": [REDACTED], "headers": [["Authorization", REDACTED]]}


def test_ordinary_values_survive() -> None:
    detail = {"identity": "sha256:" + "ab" * 32, "label": "gen-2", "url": "http://x",
              "reason": "Bearer auth failed", "error": "sk-short"}
    assert redact(detail) == detail


def test_journal_writes_token_counts(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, fsync=False) as j:
        c = Controller(trace=j)
        c.fire("bootstrap_begin", detail={"tokens": [3, 4], "api_key": "sk-" + "z" * 30,
                                          "auth": "Bearer " + "q" * 30})
    rec = json.loads(path.read_text().splitlines()[1])
    assert rec["detail"] == {"tokens": [3, 4], "api_key": REDACTED, "auth": REDACTED}
    assert "z" * 30 not in path.read_text() and "q" * 30 not in path.read_text()
    assert canonical(rec)  # still a sealed record
    assert verify_chain(path).ok
