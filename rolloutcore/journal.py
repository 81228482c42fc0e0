"""The journal: an append-only, hash-chained, fsynced record of every controller step.

One JSON object per line, keys sorted, compact separators, in Jepsen style: a begin
step is an ``invoke``, its outcome ``ok``, ``fail`` (proven to have had no effect) or
``info`` (may or may not have happened); controller decisions that are not part of an
operation (admit, publish, ...) are ``step``. The types are derived from the spec's
action table, not listed by hand.

Each record carries ``prev`` (the previous record's ``hash``; 64 zeros for the header)
and ``hash`` (sha256 of the canonical JSON of the record without ``hash``), so an
edited, dropped or reordered line breaks the chain. The journal is the controller's
trace sink: the line is written and fsynced before the sink returns, so a step is
durable before the runner relies on it (performs its effect). A crash mid-write leaves
a torn final line without its newline: that step did not happen.

Recovery reads the journal back and restarts the controller in a state the spec proves
safe: READY only when nothing had been paused or mutated, otherwise TAINTED.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from types import TracebackType
from typing import Any

from rolloutcore.controller import INITIAL_CONTROL, Controller, ControlState, TraceRecord
from rolloutcore.spec.lifecycle import ALL_EVIDENCE, NO_OP, SPEC, Kind, Phase, Spec

SCHEMA = 1
ZERO_HASH = "0" * 64
REDACTED = "<redacted>"
#: A detail key whose lower-cased name contains one of these is never written.
SECRET_MARKERS: tuple[str, ...] = (
    "token", "secret", "password", "authorization", "api_key", "apikey", "bearer", "cookie",
)
#: Journal-level record types that are not spec steps.
HEADER = "header"
RECOVER = "recover"

STEP_FIELDS: tuple[str, ...] = (
    "seq", "type", "op", "step", "param", "phase", "committed", "target", "pending", "t", "prev",
)
HEADER_FIELDS: tuple[str, ...] = ("seq", "type", "schema", "spec", "t", "prev")
JEPSEN_TYPES = frozenset({"invoke", "ok", "fail", "info", "step", RECOVER})


class JournalError(Exception):
    """The journal cannot be used as asked (broken chain, closed, bad record)."""


# ------------------------------------------------------------------ record types


def jepsen_types(spec: Spec = SPEC) -> dict[str, tuple[str, str | None]]:
    """Map every controller trigger to its (Jepsen type, operation), from the spec.

    Outcomes: ``*_ambiguous`` is ``info``, a trigger ending in ``_ok`` is ``ok``, any
    other outcome (failed, refused, mismatch) is ``fail``. Control steps: an operation's
    ``*_begin`` is ``invoke``, everything else (admit, publish, ...) is ``step``.
    """
    out: dict[str, tuple[str, str | None]] = {}
    for a in spec.actions:
        trigger = a.trigger
        if trigger is None:
            continue
        if a.kind is Kind.OUTCOME:
            typ = "info" if a.name.endswith("_ambiguous") else (
                "ok" if trigger.endswith("_ok") else "fail")
        elif a.op is not None and a.name.endswith("_begin"):
            typ = "invoke"
        else:
            typ = "step"
        seen = out.setdefault(trigger, (typ, a.op))
        if seen != (typ, a.op):  # actions observed alike must journal alike
            raise ValueError(f"{a.name} journals as {(typ, a.op)} but {trigger} as {seen}")
    return out


_SPEC_TYPES = jepsen_types(SPEC)


def jepsen_type(step: str, spec: Spec = SPEC) -> str:
    """The Jepsen type of a step (``recover`` for a recovery record)."""
    if step == RECOVER:
        return RECOVER
    table = _SPEC_TYPES if spec is SPEC else jepsen_types(spec)
    try:
        return table[step][0]
    except KeyError:
        raise KeyError(f"unknown step {step!r}") from None


# ------------------------------------------------------------------------ encoding


def _is_secret(key: str) -> bool:
    k = key.lower().replace("-", "_")  # X-Api-Key is an api_key too
    return any(m in k for m in SECRET_MARKERS)


def redact(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with every secret-named key's value replaced.

    Keys become strings (sorting mixed key types would fail) and sets sorted lists.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            out[key] = REDACTED if _is_secret(key) else redact(v)
        return out
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((redact(v) for v in value), key=repr)
    return value


def canonical(obj: Mapping[str, Any]) -> str:
    """The canonical JSON a record's hash is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def seal(record: Mapping[str, Any]) -> str:
    """The hash of a record (its ``hash`` field, if any, excluded)."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return _sha(canonical(body))


def rechain(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recompute ``prev`` and ``hash`` of every record in order (tooling and tests)."""
    prev = ZERO_HASH
    out: list[dict[str, Any]] = []
    for r in records:
        r = {k: v for k, v in r.items() if k != "hash"}
        r["prev"] = prev
        r["hash"] = prev = seal(r)
        out.append(r)
    return out


def dumps_line(record: Mapping[str, Any]) -> str:
    """One journal line (with its newline) for a record that already has its hash."""
    return canonical(record) + "\n"


# ---------------------------------------------------------------------- the journal


class Journal:
    """An append-only journal file; call it with a :class:`TraceRecord` to append one.

    Opening an existing file verifies its chain and continues it (a torn final line is
    cut off first: that step did not happen); a broken chain raises
    :class:`JournalError`. ``fsync=False`` only flushes to the OS (benchmarks, tests).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = True,
        clock: Callable[[], float] = time.time, spec: Spec = SPEC,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._clock = clock
        self._lock = threading.Lock()
        # Per trigger: (type, the JSON text of its op and of its step name), precomputed.
        self._steps = {
            step: (typ, "null" if op is None else _json_str(op), _json_str(step))
            for step, (typ, op) in jepsen_types(spec).items()
        }
        self._strs: dict[str, str] = {}  # JSON text of phases and pendings seen
        self._spec_name = spec.name
        self._fd = -1
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if fresh:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._prev, self._seq = ZERO_HASH, -1
            self._write_header()
            if fsync:  # the new directory entry must survive a crash too
                _fsync_dir(self.path.parent)
            return
        report, _recs, good_end = _scan(self.path, keep=False)
        if not report.ok and not report.truncated:
            raise JournalError(f"{self.path}: chain broken at line {report.first_bad_line}: "
                               f"{report.reason}")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if report.truncated:
            os.ftruncate(self._fd, good_end)  # the torn step did not happen
            if fsync:
                os.fsync(self._fd)
        self._prev, self._seq = report.last_hash, report.last_seq
        if report.records == 0:
            self._write_header()

    # ---------------------------------------------------------------------- writing

    def _write_header(self) -> None:
        rec: dict[str, Any] = {"seq": 0, "type": HEADER, "schema": SCHEMA,
                               "spec": self._spec_name, "t": float(self._clock()),
                               "prev": ZERO_HASH}
        rec["hash"] = seal(rec)
        self._write(dumps_line(rec).encode())
        self._prev, self._seq = rec["hash"], 0

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # os.write may write less than asked
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self._fd)

    def _str(self, s: str) -> str:
        out = self._strs.get(s)
        if out is None:
            out = self._strs[s] = _json_str(s)
        return out

    def _append(self, seq: int, typ: str, op_json: str, step_json: str, param: str | None,
                phase: str, committed: int, target: int, pending: str,
                detail: Mapping[str, Any] | None) -> None:
        # The line is assembled in sorted key order by hand so that the record is
        # serialised once: ``head + tail`` is the canonical JSON the hash covers and
        # ``head + hash + tail`` the line ("hash" sorts between "detail" and "op").
        head = f'{{"committed":{committed:d}'
        if detail is not None:
            head += ',"detail":' + canonical(redact(detail))
        param_json = "null" if param is None else _json_str(param)
        with self._lock:
            if self._fd < 0:
                raise JournalError(f"{self.path}: journal is closed")
            if seq <= self._seq:
                raise JournalError(f"seq {seq} does not follow {self._seq}")
            tail = (f',"op":{op_json},"param":{param_json},"pending":{self._str(pending)},'
                    f'"phase":{self._str(phase)},"prev":"{self._prev}","seq":{seq:d},'
                    f'"step":{step_json},"t":{float(self._clock())!r},"target":{target:d},'
                    f'"type":"{typ}"}}')
            h = hashlib.sha256((head + tail).encode()).hexdigest()
            self._write(f'{head},"hash":"{h}"{tail}\n'.encode())
            self._prev, self._seq = h, seq

    def __call__(self, record: TraceRecord) -> None:
        """Append one controller step; durable (if fsync) when this returns."""
        try:
            typ, op_json, step_json = self._steps[record.step]
        except KeyError:
            raise JournalError(f"unknown step {record.step!r}") from None
        self._append(record.seq, typ, op_json, step_json, record.param, record.phase,
                     record.committed, record.target, record.pending, record.detail)

    def record_recovery(self, recovery: Recovery) -> None:
        """Append the ``recover`` record that says in which state the controller restarts."""
        c = recovery.control
        detail = {"from_phase": recovery.from_phase, "to_phase": c.phase.value,
                  "reason": recovery.safe_reason}
        self._append(recovery.next_seq, RECOVER, "null", _json_str(RECOVER), None, c.phase,
                     c.committed, c.target, c.pending, detail)

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def last_hash(self) -> str:
        return self._prev

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------- verification


@dataclass(frozen=True)
class ChainReport:
    """The result of checking a journal's hash chain.

    ``truncated``: the only fault is a torn final line (a crash mid-write); ``ok`` is
    False then, but recovery treats that step as not having happened. ``records``
    counts the lines that verified, header included.
    """

    ok: bool
    records: int
    first_bad_line: int | None
    reason: str
    truncated: bool = False
    last_seq: int = -1
    last_hash: str = ZERO_HASH


def _check_fields(rec: dict[str, Any]) -> str | None:
    typ = rec.get("type")
    fields = HEADER_FIELDS if typ == HEADER else STEP_FIELDS
    missing = [f for f in fields if f not in rec]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    if typ != HEADER and typ not in JEPSEN_TYPES:
        return f"unknown record type {typ!r}"
    seq = rec["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool):
        return f"seq is not an integer: {seq!r}"
    return None


def _raw_hash_ok(raw: bytes, h: str) -> bool:
    """Fast path: a line the journal wrote is the canonical JSON with the hash field
    spliced in, so cutting it out again gives the hashed text without re-serialising.
    If that fails (a line written differently), the caller re-serialises."""
    i = raw.rfind(b'"hash":"')  # the last: nothing after the top-level one nests
    j = i + 73  # '"hash":"' + 64 hex digits + '"'
    if i < 1 or raw[i + 8:j - 1] != h.encode() or raw[j - 1:j] != b'"':
        return False
    if raw[i - 1:i] == b",":
        body = raw[:i - 1] + raw[j:]
    elif raw[j:j + 1] == b",":
        body = raw[:i] + raw[j + 1:]
    else:
        return False
    return hashlib.sha256(body).hexdigest() == h


def _scan(path: Path, *, keep: bool = True) -> tuple[ChainReport, list[dict[str, Any]], int]:
    """Verify the chain; return the report, the good records (if ``keep``) and the byte
    offset where the good records end. Raises OSError if the file cannot be read."""
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    if not data:
        return ChainReport(False, 0, 1, "truncated final record (empty journal)", True), [], 0
    lines = data.split(b"\n")
    torn_tail = lines.pop()  # b"" when the file ends with a newline
    prev, last_seq, offset, n = ZERO_HASH, -1, 0, 0

    def broken(reason: str, truncated: bool = False) -> tuple[
        ChainReport, list[dict[str, Any]], int
    ]:
        return (ChainReport(False, n, n + 1, reason, truncated, last_seq, prev),
                records, offset)

    loads, sha256, dumps = json.loads, hashlib.sha256, json.dumps
    for raw in lines:
        try:
            rec = loads(raw)
        except ValueError:
            # A final run of NULs: space allocated, data never written (a crash).
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
        if not _raw_hash_ok(raw, h) and sha256(
                dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest() != h:
            return broken("hash does not match the record's content")
        seq = rec["seq"]
        if n == 0 and (rec["type"] != HEADER or seq != 0):
            return broken("the first record is not a header with seq 0")
        if n and seq <= last_seq:
            return broken(f"seq {seq} does not increase (previous {last_seq})")
        if keep:
            rec["hash"] = h
            records.append(rec)
        prev, last_seq, n = h, seq, n + 1
        offset += len(raw) + 1
    if torn_tail:
        return broken("truncated final record", truncated=True)
    return ChainReport(True, n, None, "chain intact", False, last_seq, prev), records, offset


def verify_chain(path: str | os.PathLike[str]) -> ChainReport:
    """Check a journal's hash chain; the first bad line (1-based) if it is broken."""
    return _scan(Path(path), keep=False)[0]


def read_journal(path: str | os.PathLike[str]) -> tuple[ChainReport, list[dict[str, Any]]]:
    """The chain report and the records that verified (header first)."""
    report, records, _ = _scan(Path(path))
    return report, records


# ------------------------------------------------------------------------- recovery


@dataclass(frozen=True)
class Recovery:
    """In which state a controller restarts on a journal, and why that is safe.

    ``next_seq`` is the sequence number of the next record appended to the journal
    (the ``recover`` record; the controller's first step follows it).
    """

    control: ControlState
    next_seq: int
    safe_reason: str
    tainted: bool
    from_phase: str | None = None
    chain: ChainReport | None = None


def _tainted(last: Mapping[str, Any] | None, next_seq: int, reason: str, from_phase: str | None,
             chain: ChainReport) -> Recovery:
    committed = last.get("committed", 0) if last else 0
    target = last.get("target", 0) if last else 0
    if not isinstance(committed, int) or not isinstance(target, int):
        committed, target = 0, 0
    control = ControlState(Phase.TAINTED, committed, target, NO_OP, frozenset(), frozenset())
    return Recovery(control, next_seq, reason, True, from_phase, chain)


def recover(path: str | os.PathLike[str]) -> Recovery:
    """Decide the restart state from the last durable record of a journal.

    * chain broken (other than a torn final line): TAINTED;
    * no step yet, or UNINITIALIZED: UNINITIALIZED (a bootstrap in flight only read);
    * DRAINING after a pause attempt not followed by a confirmed resume: TAINTED (a
      failed pause may have taken effect);
    * READY, or DRAINING with nothing in flight (nothing paused, nothing mutated): READY
      with the same committed generation, all evidence, and no bindings: the crashed
      process's rollouts are gone; requests the engine still runs are orphans that the
      next update's wait-mode pause drains;
    * anything else (a pause in flight, QUIESCED or later, TAINTED): TAINTED.
    """
    report, records, _ = _scan(Path(path))
    steps = [r for r in records if r.get("type") != HEADER]
    last = steps[-1] if steps else None
    next_seq = max(report.last_seq, 0) + 1
    from_phase = str(last["phase"]) if last else None
    if not report.ok and not report.truncated:
        return _tainted(last, next_seq, f"journal chain broken at line {report.first_bad_line}: "
                        f"{report.reason}", from_phase, report)
    torn = " (a torn final record was ignored: that step did not happen)" \
        if report.truncated and report.records else ""
    if last is None:
        return Recovery(INITIAL_CONTROL, next_seq, "the journal holds no step" + torn, False,
                        None, report)
    try:
        phase = Phase(last["phase"])
    except ValueError:
        return _tainted(last, next_seq, f"unknown phase {last['phase']!r}", from_phase, report)
    pending, committed = last["pending"], last["committed"]
    if phase is Phase.UNINITIALIZED:
        return Recovery(INITIAL_CONTROL, next_seq, "not yet bootstrapped: the engine was only "
                        "read" + torn, False, from_phase, report)
    if phase is Phase.DRAINING and _maybe_paused(steps):
        return _tainted(last, next_seq, "DRAINING after a pause that did not complete and no "
                        "confirmed resume: the engine may be paused; fail closed" + torn,
                        from_phase, report)
    if phase in (Phase.READY, Phase.DRAINING) and pending == NO_OP and isinstance(committed, int):
        why = ("READY" if phase is Phase.READY else
               "DRAINING with nothing in flight (never paused, nothing mutated; the update "
               "request is dropped)")
        control = ControlState(Phase.READY, committed, 0, NO_OP, frozenset(), ALL_EVIDENCE)
        return Recovery(control, next_seq, f"last durable state {why}: the engine still "
                        f"serves generation {committed}; bindings of the crashed process are "
                        "dropped" + torn, False, from_phase, report)
    return _tainted(last, next_seq, f"last durable state {phase.value} (pending {pending}): "
                    "the engine may be paused or mutated; fail closed" + torn, from_phase, report)


def _maybe_paused(steps: list[dict[str, Any]]) -> bool:
    """Since the last update request, was a pause attempted and not followed by a confirmed
    resume? (A failed pause may have taken effect: the spec's pause_failed.)"""
    for r in reversed(steps):
        step = r.get("step")
        if step == "resume_ok" or step == "request_update":
            return False
        if step in ("pause_begin", "pause_failed"):
            return True
    return False


def open_controller(
    path: str | os.PathLike[str], spec: Spec = SPEC, *, fsync: bool = True,
    clock: Callable[[], float] = time.time,
) -> tuple[Controller, Journal, Recovery]:
    """A controller whose trace sink is the journal at ``path``.

    A new (or empty) journal starts fresh. An existing one is recovered: a ``recover``
    record is appended and the controller restored to the recovered state. A journal
    whose chain is broken is moved aside (``<name>.broken``, kept as evidence) and a new
    chain starts with the recovery to TAINTED.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        journal = Journal(p, fsync=fsync, clock=clock, spec=spec)
        ctl = Controller(spec=spec, trace=journal)
        return ctl, journal, Recovery(INITIAL_CONTROL, 1, "new journal", False)
    rec = recover(p)
    if rec.chain is not None and not rec.chain.ok and not rec.chain.truncated:
        aside = p.with_name(p.name + ".broken")
        n = 1
        while aside.exists():
            n += 1
            aside = p.with_name(f"{p.name}.broken{n}")
        p.rename(aside)
        rec = Recovery(rec.control, rec.next_seq, f"{rec.safe_reason} (moved to {aside.name})",
                       True, rec.from_phase, rec.chain)
    journal = Journal(p, fsync=fsync, clock=clock, spec=spec)
    journal.record_recovery(rec)
    ctl = Controller(spec=spec, trace=journal)
    ctl.restore(rec.control, {}, next_seq=rec.next_seq + 1)
    return ctl, journal, rec
