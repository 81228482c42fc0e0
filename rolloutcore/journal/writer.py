"""The journal writer: appends records to the chain, durable before a step returns
(one fsync per record, or per batch under group commit)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from types import TracebackType
from typing import Any

from rolloutcore.engine.controller import TraceRecord
from rolloutcore.errors import JournalError as JournalError  # re-exported: its home before
from rolloutcore.journal.codec import (
    CONTINUES,
    DECISION,
    HEADER,
    SCHEMA,
    ZERO_HASH,
    canonical,
    dumps_line,
    jepsen_types,
    redact,
    seal,
)
from rolloutcore.journal.reader import scan
from rolloutcore.spec.lifecycle import NO_OP, SPEC, Spec


class Journal:
    """An append-only journal file; call it with a :class:`TraceRecord` to append one.

    Opening an existing file verifies its chain and continues it (a torn final line is
    cut off first: that step did not happen); a broken chain raises
    :class:`JournalError`. ``fsync=False`` only flushes to the OS (benchmarks, tests).
    ``group_commit=True``: one fsync covers every record written while it runs, and a
    record is acknowledged once its batch is durable (see :class:`_GroupCommit`).

    The storage is behind :meth:`_write` (one line, under the lock) and :meth:`_flush`
    (make every line written so far durable); another store (an etcd journal) overrides
    those two and the opening, and keeps the chain, the encoding and group commit.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = True,
        clock: Callable[[], float] = time.time, spec: Spec = SPEC,
        continues: str | None = None, spec_name: str | None = None,
        group_commit: bool = False,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._setup(clock, spec, spec_name, continues)
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
        report, _recs, good_end = scan(self.path, keep=False)
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

    def _setup(self, clock: Callable[[], float], spec: Spec, spec_name: str | None,
               continues: str | None) -> None:
        """The state every journal has, whatever stores its lines."""
        self._clock = clock
        self._lock: threading.Lock | _GroupCommit = threading.Lock()
        self._commit: _GroupCommit | None = None
        self._closed = False
        # Per trigger: (type, the JSON text of its op and of its step name), precomputed.
        self._steps = {
            step: (typ, "null" if op is None else _json_str(op), _json_str(step))
            for step, (typ, op) in jepsen_types(spec).items()
        }
        self._strs: dict[str, str] = {}  # JSON text of phases and pendings seen
        self._spec_name = spec_name or spec.name  # a fleet's journal names the fleet spec
        self._continues = continues

    # ---------------------------------------------------------------------- writing

    def _write_header(self) -> None:
        rec: dict[str, Any] = {"seq": 0, "type": HEADER, "schema": SCHEMA,
                               "spec": self._spec_name, "t": float(self._clock()),
                               "prev": ZERO_HASH}
        if self._continues is not None:  # a new segment after a broken one
            rec[CONTINUES] = self._continues
        rec["hash"] = seal(rec)
        self._write(0, dumps_line(rec).encode())
        self._prev, self._seq = rec["hash"], 0

    def _write(self, seq: int, data: bytes) -> None:
        """Store line ``seq`` (``data``, its newline included), under the lock: durable
        when this returns, or, under group commit, once a flush has covered its ticket."""
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

    #: Whether a line reaches the store (readers) as it is written, before its flush:
    #: only then may a writer skip waiting for it (:meth:`unawaited`).
    writes_through = True

    @contextmanager
    def unawaited(self) -> Iterator[None]:
        """Records this thread appends inside the block are not waited for: the next
        flush anyone waits for covers them (a flush covers every line written before it,
        so a later durable record implies them). For records whose loss in a crash is
        conservative (a release: recovery counts the rollout as ended with the crash).
        Under the block they are written in order as ever; a journal whose lines wait in
        memory for their flush (not ``writes_through``) waits as :meth:`deferred` does."""
        commit = self._commit
        if commit is None or not self.writes_through:
            with self.deferred():
                yield
            return
        local = commit.local
        outer = getattr(local, "deferred", 0)  # an enclosing deferred block's, if any
        local.depth = getattr(local, "depth", 0) + 1
        try:
            yield
        finally:
            local.depth -= 1
            local.deferred = outer  # this block's tickets are dropped, not awaited

    def sync(self) -> None:
        """Make every line written so far durable, whoever wrote it: for a writer that
        batches durability itself (a remote gateway writes on its event loop and one
        flusher thread syncs, :mod:`rolloutcore.gateway.follower`)."""
        with self._lock:
            if self._closed:
                raise JournalError(f"{self.path}: journal is closed")
            flush = self._flush()
        flush()

    @property
    def fsyncs(self) -> int:
        """Batches fsynced by group commit so far (0 without it)."""
        return self._commit.fsyncs if self._commit is not None else 0

    def _flush(self) -> Callable[[], None]:
        """Group commit's flush, in two halves: this one runs under the journal's lock and
        captures everything written so far; the function it returns runs outside the lock
        and makes that durable (raising OSError or JournalError if it cannot). The fd is
        duplicated so that a concurrent close cannot pull it away."""
        fd = os.dup(self._fd) if self._fd >= 0 else os.open(self.path, os.O_RDONLY)

        def sync() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return sync

    def _flush_failed(self, error: Exception) -> JournalError:
        """What every waiter a failed flush should have covered raises."""
        return JournalError(f"{self.path}: fsync failed: {error}")

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
            if self._closed:
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
            self._write(seq, f'{head},"hash":"{h}"{tail}\n'.encode())
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
            self._closed = True
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
    what reached the disk is unknown, so nothing more is acknowledged. The journal's
    :meth:`Journal._flush` says what a flush is (an fsync; one transaction for an etcd
    journal).
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._inner = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self.local = threading.local()  # ticket (held), depth and deferred (deferred())
        self._written = 0  # tickets handed out (lines written)
        self._synced = 0  # tickets covered by a completed fsync
        self._flushing = False
        self.error: OSError | JournalError | None = None
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
                    raise self._journal._flush_failed(self.error)
                if self._flushing:
                    self._cond.wait()
                    continue
                self._flushing = True
                self._cond.release()
                upto, error = 0, None
                try:
                    upto = self._flush()
                except (OSError, JournalError) as e:
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
        """Make every line written so far durable; returns the last ticket it covers."""
        with self._inner:
            upto = self._written
            sync = self._journal._flush()
        sync()
        return upto


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

