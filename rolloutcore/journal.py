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
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from rolloutcore.controller import (
    INITIAL_CONTROL,
    Controller,
    ControlState,
    IllegalTransition,
    TraceRecord,
)
from rolloutcore.spec.lifecycle import NO_OP, SPEC, Kind, Phase, Spec
from rolloutcore.spec.triggers import RESTARTS, Trigger

#: Version 2: outcome records carry the decision (``evidence``) they were decided on;
#: restarts are spec steps; a header may name the segment it continues.
SCHEMA = 2
ZERO_HASH = "0" * 64
REDACTED = "<redacted>"
#: The detail key under which the runner hands over an outcome's decision; the journal
#: writes it as the record's typed ``evidence`` field.
DECISION = "decision"
#: Header field of a new segment: the last good hash of the journal it continues.
CONTINUES = "continues"
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
    """Map every controller trigger to its (Jepsen type, operation), from the spec:
    an operation's action journals as its :class:`~rolloutcore.spec.lifecycle.Result`
    says (begin ``invoke``, ok ``ok``, ambiguous ``info``, any other outcome ``fail``), a
    restart as ``recover``, every other control step (admit, publish, ...) as ``step``.
    """
    out: dict[str, tuple[str, str | None]] = {}
    for a in spec.actions:
        trigger = a.trigger
        if trigger is None:
            continue
        if a.result is not None:
            typ = a.result.jepsen
        elif a.kind is Kind.RESTART:
            typ = RECOVER
        else:
            typ = "step"
        seen = out.setdefault(trigger, (typ, a.op))
        if seen != (typ, a.op):  # actions observed alike must journal alike
            raise ValueError(f"{a.name} journals as {(typ, a.op)} but {trigger} as {seen}")
    return out


_SPEC_TYPES = jepsen_types(SPEC)


def jepsen_type(step: str, spec: Spec = SPEC) -> str:
    """The Jepsen type of a step (``recover`` for a recovery record)."""
    table = _SPEC_TYPES if spec is SPEC else jepsen_types(spec)
    try:
        return table[step][0]
    except KeyError:
        raise KeyError(f"unknown step {step!r}") from None


# ------------------------------------------------------------------------ encoding


def _norm_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


#: Detail keys whose value is never written, compared case-insensitively and ignoring
#: ``-`` and ``_`` (``X-Api-Key`` is ``x_api_key``, ``ClientSecret`` is ``client_secret``).
#: Exact names, not substrings: ``tokens``, ``max_tokens`` or ``prompt_token_ids`` are
#: token ids and counts, and must survive.
SECRET_KEYS: frozenset[str] = frozenset(_norm_key(k) for k in (
    "authorization", "proxy-authorization", "api_key", "apikey", "x-api-key", "bearer",
    "bearer_token", "admin_token", "access_token", "auth_token", "refresh_token", "secret",
    "client_secret", "password", "cookie", "set-cookie",
))
#: A string value that looks like a credential, whatever its key: ``Bearer <token>``,
#: an OpenAI-style ``sk-...`` or a Hugging Face ``hf_...`` key, with 20+ token characters.
_CREDENTIAL = re.compile(r"\s*(?:bearer\s+|sk-|hf_)[A-Za-z0-9._~+/=-]{20,}", re.IGNORECASE)


#: Name endings that mark a secret whatever the prefix (``db_password``, ``ClientSecret``,
#: ``openai_api_key``); token-like names are matched exactly, since ``max_tokens`` and
#: ``prompt_token_ids`` are data.
SECRET_SUFFIXES: tuple[str, ...] = ("password", "secret", "apikey", "credential", "cookie")


def _is_secret(key: str) -> bool:
    hit = _SECRET_MEMO.get(key)
    if hit is None:
        k = _norm_key(key)
        hit = k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES)
        if len(_SECRET_MEMO) < 4096:  # detail keys are a small fixed set; bound it anyway
            _SECRET_MEMO[key] = hit
    return hit


_SECRET_MEMO: dict[str, bool] = {}
#: Values that are returned as they are (exact types: a str or int subclass, such as an
#: enum, takes the general path).
_PLAIN = frozenset({int, float, bool, type(None)})


def _looks_like_credential(value: str) -> bool:
    return _CREDENTIAL.match(value) is not None


def redact(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with the value of every secret key, and every
    credential-looking string, replaced by :data:`REDACTED`.

    Keys become strings (sorting mixed key types would fail) and sets sorted lists.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, str):
        return REDACTED if _looks_like_credential(value) else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            out[key] = REDACTED if _is_secret(key) else (
                v if type(v) in _PLAIN else redact(v))
        return out
    if isinstance(value, list | tuple):
        # Evidence carries long lists of numbers (token ids, log-probabilities).
        return [v if type(v) in _PLAIN else redact(v) for v in value]
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
    ``group_commit=True``: one fsync covers every record written while it runs, and a
    record is acknowledged once its batch is durable (see :class:`_GroupCommit`).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = True,
        clock: Callable[[], float] = time.time, spec: Spec = SPEC,
        continues: str | None = None, spec_name: str | None = None,
        group_commit: bool = False,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._clock = clock
        self._lock: threading.Lock | _GroupCommit = threading.Lock()
        self._commit: _GroupCommit | None = None
        # Per trigger: (type, the JSON text of its op and of its step name), precomputed.
        self._steps = {
            step: (typ, "null" if op is None else _json_str(op), _json_str(step))
            for step, (typ, op) in jepsen_types(spec).items()
        }
        self._strs: dict[str, str] = {}  # JSON text of phases and pendings seen
        self._spec_name = spec_name or spec.name  # a fleet's journal names the fleet spec
        self._continues = continues
        self._fd = -1
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        if fresh:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._prev, self._seq = ZERO_HASH, -1
            self._write_header()
            if fsync:  # the new directory entry must survive a crash too
                _fsync_dir(self.path.parent)
            if group_commit:  # after the header: that one is synced on its own
                self.use_group_commit()
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
        if group_commit:
            self.use_group_commit()

    # ---------------------------------------------------------------------- writing

    def _write_header(self) -> None:
        rec: dict[str, Any] = {"seq": 0, "type": HEADER, "schema": SCHEMA,
                               "spec": self._spec_name, "t": float(self._clock()),
                               "prev": ZERO_HASH}
        if self._continues is not None:  # a new segment after a broken one
            rec[CONTINUES] = self._continues
        rec["hash"] = seal(rec)
        self._write(dumps_line(rec).encode())
        self._prev, self._seq = rec["hash"], 0

    def _write(self, data: bytes) -> None:
        commit = self._commit
        if commit is not None and commit.error is not None:
            raise JournalError(f"{self.path}: an earlier fsync failed ({commit.error}): "
                               "nothing more is written")
        view = memoryview(data)
        while view:  # os.write may write less than asked
            n = os.write(self._fd, view)
            view = view[n:]
        if commit is not None:
            commit.written()  # the caller waits when it lets go of the lock
        elif self.fsync:
            os.fsync(self._fd)

    # ----------------------------------------------------------------- group commit

    def use_group_commit(self) -> None:
        """Switch to group commit (no-op without fsync). Call it before the journal is
        shared between threads: a fleet builds its journal itself, its owner switches."""
        if self.fsync and self._commit is None:
            self._commit = self._lock = _GroupCommit(self)

    @property
    def group_commit(self) -> bool:
        return self._commit is not None

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Records this thread appends inside the block are awaited once, when it ends,
        instead of one by one inside the caller's locks (a fleet admits under its own
        lock): their durability wait joins one batch. Nothing may act on them (forward a
        request, answer a client) before the block has ended. Without group commit each
        record is durable when written, and this changes nothing."""
        commit = self._commit
        if commit is None:
            yield
            return
        local = commit.local
        local.depth = getattr(local, "depth", 0) + 1
        try:
            yield
        finally:
            local.depth -= 1
            ticket = getattr(local, "deferred", 0)
            if local.depth == 0 and ticket:
                local.deferred = 0
                commit.wait(ticket)

    @property
    def fsyncs(self) -> int:
        """Batches fsynced by group commit so far (0 without it)."""
        return self._commit.fsyncs if self._commit is not None else 0

    def _str(self, s: str) -> str:
        out = self._strs.get(s)
        if out is None:
            out = self._strs[s] = _json_str(s)
        return out

    def _append(self, seq: int | None, typ: str, op_json: str, step_json: str,
                param: str | None, phase: str, committed: int, target: int, pending: str,
                detail: Mapping[str, Any] | None, engine: str | None = None) -> int:
        """Write one record; ``seq`` None: the journal numbers it (a shared journal).
        Returns the sequence number written."""
        # The line is assembled in sorted key order by hand so that the record is
        # serialised once: ``head + tail`` is the canonical JSON the hash covers and
        # ``head + hash + tail`` the line ("hash" sorts between "evidence" and "op").
        head = f'{{"committed":{committed:d}'
        evidence = None
        if detail is not None and DECISION in detail:
            detail = dict(detail)
            evidence = detail.pop(DECISION)
        if detail:
            head += ',"detail":' + canonical(redact(detail))
        if engine is not None:
            head += ',"engine":' + _json_str(engine)
        if evidence is not None:
            head += ',"evidence":' + canonical(redact(evidence))
        param_json = "null" if param is None else _json_str(param)
        with self._lock:
            if self._fd < 0:
                raise JournalError(f"{self.path}: journal is closed")
            if seq is None:
                seq = self._seq + 1
            elif seq <= self._seq:
                raise JournalError(f"seq {seq} does not follow {self._seq}")
            tail = (f',"op":{op_json},"param":{param_json},"pending":{self._str(pending)},'
                    f'"phase":{self._str(phase)},"prev":"{self._prev}","seq":{seq:d},'
                    f'"step":{step_json},"t":{float(self._clock())!r},"target":{target:d},'
                    f'"type":"{typ}"}}')
            h = hashlib.sha256((head + tail).encode()).hexdigest()
            self._write(f'{head},"hash":"{h}"{tail}\n'.encode())
            self._prev, self._seq = h, seq
            return seq

    def __call__(self, record: TraceRecord) -> None:
        """Append one controller step; durable (if fsync) when this returns."""
        try:
            typ, op_json, step_json = self._steps[record.step]
        except KeyError:
            raise JournalError(f"unknown step {record.step!r}") from None
        self._append(record.seq, typ, op_json, step_json, record.param, record.phase,
                     record.committed, record.target, record.pending, record.detail)

    def member(self, engine: str) -> Callable[[TraceRecord], int]:
        """The trace sink of one member of a fleet: its records are tagged with it and
        numbered by the journal (one chain, one sequence, every member)."""
        def sink(record: TraceRecord) -> int:
            try:
                typ, op_json, step_json = self._steps[record.step]
            except KeyError:
                raise JournalError(f"unknown step {record.step!r}") from None
            return self._append(None, typ, op_json, step_json, record.param, record.phase,
                                record.committed, record.target, record.pending,
                                record.detail, engine)
        return sink

    def fleet_step(self, step: str, phase: str, committed: int, target: int,
                   detail: Mapping[str, Any] | None = None) -> int:
        """A step of the fleet itself (not of a member): untagged, journalled as ``step``."""
        return self._append(None, "step", "null", _json_str(step), None, phase, committed,
                            target, NO_OP, detail)

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


class _GroupCommit:
    """The journal's lock under group commit, and the flusher.

    A writer appends its line while holding the lock (``_write`` takes a numbered
    ticket); letting go of the lock is where it waits, outside the lock, until an fsync
    has covered its ticket. The first waiter to find no fsync running leads: it fsyncs
    everything written up to then, once for every waiter, and wakes them; the others
    wait on a condition (leader election, no flusher thread). An fsync covers every
    line written before it started, whoever wrote it, so a batch is durable in order.
    A failed fsync fails every waiter it should have covered and every later write:
    what reached the disk is unknown, so nothing more is acknowledged.
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._inner = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self.local = threading.local()  # ticket (held), depth and deferred (deferred())
        self._written = 0  # tickets handed out (lines written)
        self._synced = 0  # tickets covered by a completed fsync
        self._flushing = False
        self.error: OSError | None = None
        self.fsyncs = 0

    def __enter__(self) -> _GroupCommit:
        self._inner.acquire()
        self.local.ticket = 0
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        ticket = self.local.ticket
        self.local.ticket = 0
        self._inner.release()
        if not ticket or exc_type is not None:
            return
        if getattr(self.local, "depth", 0):
            self.local.deferred = max(getattr(self.local, "deferred", 0), ticket)
        else:
            self.wait(ticket)

    def written(self) -> None:
        """A line was written (the lock is held): the caller's ticket."""
        with self._cond:
            self._written += 1
            self.local.ticket = self._written

    def wait(self, ticket: int) -> None:
        """Return once an fsync has covered ``ticket``; lead one if none is running."""
        with self._cond:
            while self._synced < ticket:
                if self.error is not None:
                    raise JournalError(f"{self._journal.path}: fsync failed: {self.error}")
                if self._flushing:
                    self._cond.wait()
                    continue
                self._flushing = True
                self._cond.release()
                upto, error = 0, None
                try:
                    upto = self._flush()
                except OSError as e:
                    error = e
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()
                if error is not None:
                    self.error = error
                else:
                    self._synced = max(self._synced, upto)
                    self.fsyncs += 1

    def _flush(self) -> int:
        """fsync every line written so far; returns the last ticket it covers. The fd is
        duplicated under the lock so that a concurrent close cannot pull it away."""
        j = self._journal
        with self._inner:
            upto = self._written
            fd = os.dup(j._fd) if j._fd >= 0 else os.open(j.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return upto


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------- verification

#: The longest journal line read (bytes, newline included). A controller step is far
#: below it; a longer line is not one the writer produced, and is skipped over without
#: being loaded, so a corrupt file cannot make the reader's memory grow.
MAX_LINE = 1 << 20
_CHUNK = 1 << 16


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


def not_a_journal(path: str | os.PathLike[str], report: ChainReport) -> str:
    """The one line for a file whose header did not verify (``records == 0``), in the
    ``path:line: what`` form every command uses."""
    return f"{path}:{report.first_bad_line or 1}: not a RolloutCore journal ({report.reason})"


_STEP_TYPES: dict[str, tuple[type, ...]] = {
    "op": (str, type(None)), "step": (str,), "param": (str, type(None)), "phase": (str,),
    "committed": (int,), "target": (int,), "pending": (str,), "t": (int, float),
    "prev": (str,),
}
_HEADER_TYPES: dict[str, tuple[type, ...]] = {
    "schema": (int,), "spec": (str,), "t": (int, float), "prev": (str,),
}


def _check_fields(rec: dict[str, Any]) -> str | None:
    """Why a decoded record is not a well-formed journal record (None if it is): the
    fields every reader relies on are there and of the type the writer gives them."""
    typ = rec.get("type")
    if not isinstance(typ, str):
        return f"type is not a string: {typ!r}"
    header = typ == HEADER
    fields = HEADER_FIELDS if header else STEP_FIELDS
    missing = [f for f in fields if f not in rec]
    if missing:
        return f"missing field(s): {', '.join(missing)}"
    if not header and typ not in JEPSEN_TYPES:
        return f"unknown record type {typ!r}"
    seq = rec["seq"]
    if not isinstance(seq, int) or isinstance(seq, bool):
        return f"seq is not an integer: {seq!r}"
    for name, types in (_HEADER_TYPES if header else _STEP_TYPES).items():
        v = rec[name]
        if not isinstance(v, types) or isinstance(v, bool):
            return f"{name} has the wrong type: {type(v).__name__} {v!r:.40}"
    if "detail" in rec and not isinstance(rec["detail"], dict):
        return f"detail is not an object: {type(rec['detail']).__name__}"
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


def _rest_is_nuls(fh: BinaryIO) -> bool:
    """Is everything left in ``fh`` NUL bytes (space allocated, data never written)?
    Reads in chunks: the rest may be large."""
    while chunk := fh.read(_CHUNK):
        if chunk.strip(b"\0"):
            return False
    return True


def _skip_line(fh: BinaryIO, start: bytes) -> tuple[bool, bool]:
    """Skip to the end of an overlong line whose first bytes are ``start``, in chunks.
    Returns (it ended with a newline, it is all NULs)."""
    nuls = not start.strip(b"\0")
    while chunk := fh.readline(_CHUNK):
        ended = chunk.endswith(b"\n")
        if nuls and (chunk[:-1] if ended else chunk).strip(b"\0"):
            nuls = False
        if ended:
            return True, nuls
    return False, nuls


class JournalReader:
    """Stream a journal's records while verifying its hash chain.

    Iterating yields ``(line_number, record)`` (1-based; ``record`` is the decoded dict,
    its ``hash`` included) for each record that verifies, header first, and stops at the
    first that does not. The file is read one line at a time (at most :data:`MAX_LINE`
    bytes held), so memory does not grow with the journal. After iteration, ``report``
    is the :class:`ChainReport` and ``good_end`` the byte offset where the good records
    end (where a writer continues after cutting off a torn tail).

    A file that cannot be opened raises :class:`OSError` from the first ``next()``.
    Rules for a crash mid-write (both report ``truncated``): a final line without its
    newline is torn; so is a final run of NUL bytes (allocated, never written) on the
    last line, with or without a newline before it.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_line: int = MAX_LINE) -> None:
        self.path = Path(path)
        self.max_line = max_line
        self._report: ChainReport | None = None
        self._good_end = 0

    @property
    def report(self) -> ChainReport:
        if self._report is None:
            raise RuntimeError("the journal has not been read to its end yet")
        return self._report

    @property
    def good_end(self) -> int:
        if self._report is None:
            raise RuntimeError("the journal has not been read to its end yet")
        return self._good_end

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        self._report = None
        with open(self.path, "rb") as fh:
            yield from self._records(fh)

    def _records(self, fh: BinaryIO) -> Iterator[tuple[int, dict[str, Any]]]:
        prev, last_seq, offset, n = ZERO_HASH, -1, 0, 0

        def stop(reason: str, truncated: bool = False) -> None:
            self._report = ChainReport(False, n, n + 1, reason, truncated, last_seq, prev)
            self._good_end = offset

        loads, sha256, dumps = json.loads, hashlib.sha256, json.dumps
        readline, limit = fh.readline, self.max_line
        raw = readline(limit + 1)
        if not raw:
            self._report = ChainReport(False, 0, 1, "truncated final record (empty journal)",
                                       True)
            self._good_end = 0
            return
        while raw:
            if not raw.endswith(b"\n"):
                if len(raw) <= limit:  # the end of the file: a torn final line
                    return stop("truncated final record", truncated=True)
                ended, nuls = _skip_line(fh, raw)
                if not ended:
                    return stop("truncated final record", truncated=True)
                if nuls and _rest_is_nuls(fh):
                    return stop("truncated final record", truncated=True)
                return stop(f"line longer than {limit} bytes")
            line = raw[:-1]
            try:
                rec = loads(line)
            except (ValueError, RecursionError):
                # A final run of NULs: space allocated, data never written (a crash).
                if not line.strip(b"\0") and _rest_is_nuls(fh):
                    return stop("truncated final record", truncated=True)
                return stop("not a JSON line")
            if not isinstance(rec, dict):
                return stop("not a JSON object")
            h = rec.pop("hash", None)
            if not isinstance(h, str):
                return stop("missing field: hash")
            bad = _check_fields(rec)
            if bad:
                return stop(bad)
            if rec["prev"] != prev:
                return stop("prev does not match the previous record's hash"
                            if n else "the first record's prev is not 64 zeros")
            if not _raw_hash_ok(line, h) and sha256(
                    dumps(rec, sort_keys=True, separators=(",", ":")).encode()).hexdigest() != h:
                return stop("hash does not match the record's content")
            seq = rec["seq"]
            if n == 0 and (rec["type"] != HEADER or seq != 0):
                return stop("the first record is not a header with seq 0")
            if n and seq <= last_seq:
                return stop(f"seq {seq} does not increase (previous {last_seq})")
            rec["hash"] = h
            prev, last_seq, n = h, seq, n + 1
            offset += len(raw)
            yield n, rec
            raw = readline(limit + 1)
        self._report = ChainReport(True, n, None, "chain intact", False, last_seq, prev)
        self._good_end = offset


def _scan(path: Path, *, keep: bool = True) -> tuple[ChainReport, list[dict[str, Any]], int]:
    """Verify the chain; return the report, the good records (if ``keep``) and the byte
    offset where the good records end. Raises OSError if the file cannot be read."""
    reader = JournalReader(path)
    records: list[dict[str, Any]] = []
    if keep:
        records.extend(rec for _, rec in reader)
    else:
        for _ in reader:
            pass
    return reader.report, records, reader.good_end


def verify_chain(path: str | os.PathLike[str]) -> ChainReport:
    """Check a journal's hash chain (streaming); the first bad line (1-based) if broken."""
    reader = JournalReader(path)
    for _ in reader:
        pass
    return reader.report


def read_journal(path: str | os.PathLike[str]) -> tuple[ChainReport, list[dict[str, Any]]]:
    """The chain report and the records that verified (header first), as a list: for
    small journals; stream a large one with :class:`JournalReader`."""
    report, records, _ = _scan(Path(path))
    return report, records


# ------------------------------------------------------------------------- recovery


@dataclass(frozen=True)
class Recovery:
    """In which state a controller restarts on a journal, and why that is safe.

    The decision is the spec's: the journal is replayed through the generated controller
    (every record must be a step the spec allows, with the phase and generations it
    names), and the restart step whose guard holds in the replayed state is taken
    (``restart_ready`` only with nothing in flight and the engine known to run the
    committed generation; ``restart_tainted`` otherwise). A journal that cannot be
    trusted (broken chain, a record the spec does not allow) restarts TAINTED in a new
    segment that names the last good hash of the old one.
    """

    control: ControlState  # the state the replay ended in (before the restart step)
    trigger: Trigger  # the restart step
    next_seq: int  # sequence number of the restart record
    reason: str
    from_phase: str | None
    chain: ChainReport | None = None
    trusted: bool = True  # False: the journal is moved aside, a new segment begins
    identity: str | None = None  # of the committed generation's weights, as journalled

    @property
    def tainted(self) -> bool:
        return self.trigger == Trigger.RESTART_TAINTED


def apply_record(ctl: Controller, rec: Mapping[str, Any]) -> None:
    """Take the step a journal record names on ``ctl`` (no sink attached): raises
    :class:`IllegalTransition` if the spec does not allow it, or if the controller ends
    in another phase or generation than the record says."""
    step, param = rec.get("step"), rec.get("param")
    if not isinstance(step, str) or not (param is None or isinstance(param, str)):
        raise IllegalTransition(str(step), ctl.phase, "malformed step or param")
    if step == Trigger.ADMIT:
        ctl.admit(param or "")
    elif step == Trigger.RELEASE:
        ctl.release(param or "")
    elif step == Trigger.RELEASE_ABORTED:
        ctl.abort(param or "")
    elif step in RESTARTS:
        ctl.restart(step)
    else:
        ctl.fire(step, param)
    identity = _committed_identity(step, rec)
    if identity is not None:  # what later bindings are bound to
        ctl.identity = identity
    c = ctl.control
    if (c.phase.value, c.committed, c.target, c.pending) != (
            rec.get("phase"), rec.get("committed"), rec.get("target"), rec.get("pending")):
        raise IllegalTransition(step, c.phase, f"the record says {rec.get('phase')} "
                                f"(committed {rec.get('committed')}, target "
                                f"{rec.get('target')}, pending {rec.get('pending')}); the "
                                f"spec's controller is in {c.phase.value} (committed "
                                f"{c.committed}, target {c.target}, pending {c.pending})")


def _committed_identity(step: str, rec: Mapping[str, Any]) -> str | None:
    """The identity of the weights a step commits, as the journal names it: a publish's
    detail, or the expected target of the verified bootstrap or re-admission."""
    if step == Trigger.PUBLISH:
        d = rec.get("detail")
        v = d.get("identity") if isinstance(d, Mapping) else None
    elif step in (Trigger.BOOTSTRAP_OK, Trigger.READMIT_OK):
        ev = rec.get("evidence")
        exp = ev.get("expected") if isinstance(ev, Mapping) else None
        v = exp.get("identity") if isinstance(exp, Mapping) else None
    else:
        return None
    return v if isinstance(v, str) else None


def restart_step(ctl: Controller) -> Trigger:
    """The restart step the spec allows in ``ctl``'s state (exactly one holds)."""
    allowed = [t for t in RESTARTS if ctl.enabled(t) is None]
    if len(allowed) != 1:
        raise AssertionError(f"the spec allows {allowed} on restart from {ctl.control}")
    return allowed[0]


def recover(path: str | os.PathLike[str], spec: Spec = SPEC) -> Recovery:
    """Replay the journal at ``path`` and decide the restart step (see :class:`Recovery`).
    Raises OSError if the file cannot be read."""
    reader = JournalReader(path)
    ctl = Controller(spec=spec)
    last: Mapping[str, Any] | None = None
    bad: str | None = None
    for line, rec in reader:
        if rec.get("type") == HEADER:
            if rec.get("schema") != SCHEMA:
                bad = f"line {line}: journal schema {rec.get('schema')!r} (this is {SCHEMA})"
                break
            continue
        if last is None and rec.get("step") in RESTARTS:
            # A segment that continues a broken one: its restart set the state.
            ctl.restore(ControlState(Phase(str(rec["phase"])), int(rec["committed"]),
                                     int(rec["target"]), NO_OP, frozenset(), frozenset()))
            last = rec
            continue
        try:
            apply_record(ctl, rec)
        except (IllegalTransition, ValueError) as e:
            bad = f"line {line}: the journal does not replay through the spec: {e}"
            break
        last = rec
    report = reader.report
    next_seq = max(report.last_seq, 0) + 1
    from_phase = str(last["phase"]) if last else None
    if bad is None and not report.ok and not report.truncated:
        bad = f"journal chain broken at line {report.first_bad_line}: {report.reason}"
    if bad is not None:
        c = ctl.control
        return Recovery(ControlState(Phase.TAINTED, c.committed, c.target, NO_OP, frozenset(),
                                     frozenset()), Trigger.RESTART_TAINTED, 1,
                        f"{bad}: fail closed", from_phase, report, trusted=False)
    torn = " (a torn final record was ignored: that step did not happen)" \
        if report.truncated and report.records else ""
    trigger = restart_step(ctl)
    return Recovery(ctl.control, trigger, next_seq, spec.action(trigger).doc + torn,
                    from_phase, report, identity=ctl.identity)


def open_controller(
    path: str | os.PathLike[str], spec: Spec = SPEC, *, fsync: bool = True,
    clock: Callable[[], float] = time.time,
) -> tuple[Controller, Journal, Recovery]:
    """A controller whose trace sink is the journal at ``path``.

    A new (or empty) journal starts fresh. An existing one is recovered: the restart step
    the spec allows is journalled and taken. A journal that cannot be trusted is moved
    aside (``<name>.broken``, kept as evidence) and a new segment, whose header names
    the last good hash of the old one, starts with the restart to TAINTED.
    """
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        journal = Journal(p, fsync=fsync, clock=clock, spec=spec)
        ctl = Controller(spec=spec, trace=journal)
        return ctl, journal, Recovery(INITIAL_CONTROL, Trigger.RESTART_UNINITIALIZED, 1,
                                      "new journal", None)
    rec = recover(p, spec)
    continues: str | None = None
    if not rec.trusted:
        aside = p.with_name(p.name + ".broken")
        n = 1
        while aside.exists():
            n += 1
            aside = p.with_name(f"{p.name}.broken{n}")
        p.rename(aside)
        continues = rec.chain.last_hash if rec.chain is not None else ZERO_HASH
        rec = replace(rec, reason=f"{rec.reason} (moved to {aside.name})")
    journal = Journal(p, fsync=fsync, clock=clock, spec=spec, continues=continues)
    ctl = Controller(spec=spec, trace=journal, identity=rec.identity)
    ctl.restore(rec.control, next_seq=rec.next_seq)
    ctl.restart(rec.trigger, {"reason": rec.reason, **(
        {"from_phase": rec.from_phase} if rec.from_phase is not None else {})})
    return ctl, journal, rec
