"""The journal in etcd: the file journal's chain, line for line, one key per record.

Line ``seq`` is stored under ``<prefix>/journal/<seq, 16 digits>`` (its value is the line
without its newline), so the keys sort in journal order and an export is the very file
the file journal would have written. Every append is one transaction that requires the
writer's leader key to be live (its create revision is the writer's epoch) and every
key it writes to be new: a deposed leader's append is refused by etcd (:class:`Deposed`)
and the journal never forks. After a refusal or a store failure the journal object
writes nothing more: an append that got no answer may or may not be in the store, and
only re-reading it (a restart) tells.

Group commit batches the records appended while a transaction is in flight into the
next one (the file journal's leader/waiter logic, with a transaction for an fsync).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rolloutcore import errors
from rolloutcore.control.etcd import (
    EtcdStore,
    StoreError,
    StoreRejected,
    cmp_create,
    cmp_version,
    is_store_url,
    op_put,
    op_range,
    parse_store_url,
    prefix_end,
)
from rolloutcore.control.leadership import Leadership, _parse_leader
from rolloutcore.journal.codec import ZERO_HASH
from rolloutcore.journal.reader import ChainReport, JournalReader
from rolloutcore.journal.writer import Journal, JournalError
from rolloutcore.spec.lifecycle import SPEC, Spec

JOURNAL_DIR = "journal"
SEQ_DIGITS = 16
#: Keys read per range request (a page), so that memory does not grow with the journal.
PAGE = 256
#: A transaction's share of etcd's limits (128 operations, 1.5 MiB per request by
#: default): a larger batch goes as several transactions, in order.
MAX_TXN_LINES = 100
MAX_TXN_BYTES = 1 << 20

_SEQ_KEY = re.compile(f"[0-9]{{{SEQ_DIGITS}}}")


class Deposed(JournalError, errors.Deposed):
    """The writer's epoch is no longer the leader's: the store refused the append."""


def journal_key(store: EtcdStore, seq: int) -> str:
    return f"{store.key(JOURNAL_DIR)}/{seq:0{SEQ_DIGITS}d}"


# ------------------------------------------------------------------------ reading


def _entries(store: EtcdStore, page: int = PAGE) -> Iterator[tuple[int, bytes]]:
    """(seq, line without newline) in key order, a page at a time, all at the revision of
    the first page (a consistent snapshot even while the leader appends)."""
    start = store.key(JOURNAL_DIR) + "/"
    end = prefix_end(start)
    revision = 0
    while True:
        kvs, more, rev = store.range(start, end, limit=page, revision=revision)
        revision = revision or rev
        for kv in kvs:
            name = kv.key[len(store.key(JOURNAL_DIR)) + 1:]
            if not _SEQ_KEY.fullmatch(name):
                raise JournalError(f"{store.url}: {kv.key}: not a journal key")
            yield int(name), kv.value
        if not more or not kvs:
            return
        start = kvs[-1].key + "\0"


def iter_journal_lines(store: EtcdStore, *, page: int = PAGE) -> Iterator[bytes]:
    """The journal's lines, newline included, in order, as a file would give them; read
    in pages of ``page`` keys. Raises :class:`StoreError` if the store fails midway."""
    for _seq, line in _entries(store, page):
        yield line + b"\n"


class _LineStream(io.RawIOBase):
    """A raw byte stream over an iterator of lines (for the file journal's reader)."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines = lines
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            nxt = next(self._lines, None)
            if nxt is None:
                return 0
            self._buf = nxt
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _StoreReader(JournalReader):
    """The file journal's streaming chain verification over the store's lines, also
    checking that each record sits under its own seq's key."""

    def __init__(self, store: EtcdStore) -> None:
        super().__init__(store.url)
        self.store = store

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        self._report = None
        keys: deque[int] = deque()  # seqs of the lines handed to the reader, not yet checked

        def lines() -> Iterator[bytes]:
            for seq, line in _entries(self.store):
                keys.append(seq)
                yield line + b"\n"

        with io.BufferedReader(_LineStream(lines())) as fh:
            for n, rec in self._records(fh):
                seq = keys.popleft()
                if rec["seq"] != seq:
                    self._report = ChainReport(False, n - 1, n, f"record seq {rec['seq']} "
                                               f"stored under key {seq}", False)
                    return
                yield n, rec


def verify_store_chain(store: EtcdStore) -> ChainReport:
    """The chain report of the journal in the store (streaming, like the file's)."""
    reader = _StoreReader(store)
    for _ in reader:
        pass
    return reader.report


def export_journal(store: EtcdStore, out_path: str | os.PathLike[str]) -> int:
    """Write the store's journal to ``out_path`` as the JSONL file the file journal would
    have written (atomically: a temporary file renamed). Returns the lines written."""
    out = Path(out_path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent or ".")
    n = 0
    try:
        with os.fdopen(fd, "wb") as fh:
            for line in iter_journal_lines(store):
                fh.write(line)
                n += 1
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


@contextmanager
def open_journal_source(source: str | os.PathLike[str] | EtcdStore, *,
                        default_prefix: str = "/rolloutcore",
                        timeout_s: float = 5.0) -> Iterator[Path]:
    """A local file with the journal: a path as it is; for an ``etcd://`` URL (or an
    :class:`EtcdStore`), the store's journal exported to a temporary file, deleted
    afterwards. Raises :class:`~rolloutcore.control.etcd.StoreUrlError`,
    :class:`StoreError` or, when the prefix holds no journal, :class:`JournalError`."""
    if isinstance(source, EtcdStore):
        with _exported(source) as out:
            yield out
        return
    if not is_store_url(str(source)):
        yield Path(source)
        return
    u = parse_store_url(str(source), default_prefix)
    with EtcdStore(u.endpoints, u.prefix, timeout_s) as store, _exported(store) as out:
        yield out


@contextmanager
def _exported(store: EtcdStore) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="rolloutcore-journal-") as d:
        out = Path(d) / "journal.jsonl"
        if export_journal(store, out) == 0:
            raise JournalError(f"{store.url}: no journal under {store.key(JOURNAL_DIR)}/")
        yield out


# ------------------------------------------------------------------------ writing


class EtcdJournal(Journal):
    """A :class:`~rolloutcore.journal.Journal` whose lines live in etcd, appended only
    while ``leadership`` holds the leader key of its epoch.

    Opening reads the existing lines (a page at a time, the chain verified as the file
    journal's is; a broken chain raises :class:`JournalError`) and continues the chain,
    or writes the header if there is none. Each append (or group-commit batch) is one
    transaction; its refusal raises :class:`Deposed`, its failure :class:`JournalError`,
    and either leaves the journal refusing every later append. ``path`` is the keys'
    prefix (for display: there is no file); ``url`` the store's URL.
    """

    writes_through = False  # under group commit a line waits in memory for its batch

    def __init__(self, store: EtcdStore, leadership: Leadership, *,
                 spec_name: str | None = None, clock: Callable[[], float] = time.time,
                 spec: Spec = SPEC, continues: str | None = None,
                 group_commit: bool = False) -> None:
        self.store = store
        self.leadership = leadership
        self.url = f"{store.url}/{JOURNAL_DIR}"
        self.path = Path(store.key(JOURNAL_DIR))
        self.fsync = True  # every acknowledged append is in the store (a quorum's disks)
        self._setup(clock, spec, spec_name, continues)
        self._fd = -1
        self._pending: list[tuple[int, bytes]] = []  # group commit: written, not sent
        self._failure: JournalError | None = None
        self.txns = 0  # append transactions sent
        self._refuse_unless_leader()
        reader = _StoreReader(store)
        try:
            for _ in reader:
                pass
        except StoreError as e:
            raise JournalError(f"{self.url}: cannot read the journal: {e}") from None
        report = reader.report
        if report.records == 0 and report.truncated:  # no lines at all: a new journal
            self._prev, self._seq = ZERO_HASH, -1
            self._write_header()
        elif not report.ok:
            raise JournalError(f"{self.url}: chain broken at line {report.first_bad_line}: "
                               f"{report.reason}")
        else:
            self._prev, self._seq = report.last_hash, report.last_seq
        if group_commit:  # after the header: that one is sent on its own
            self.use_group_commit()

    # ----------------------------------------------------------------- storage

    def _refuse_unless_leader(self) -> None:
        lead = self.leadership
        if not lead.holds():
            why = lead.lost_reason or ("not elected" if not lead.epoch else "lease lapsed")
            raise Deposed(f"{self.url}: {lead.controller_id} does not hold leadership "
                          f"(epoch {lead.epoch}: {why}); nothing is written")

    def _check_usable(self) -> None:
        failure = self._failure
        commit = self._commit
        if failure is None and commit is not None and commit.error is not None:
            failure = self._flush_failed(commit.error)
        if failure is not None:
            raise type(failure)(f"{failure}; nothing more is written")

    def _write(self, seq: int, data: bytes) -> None:
        self._check_usable()
        line = data[:-1]  # the key's value is the line without its newline
        commit = self._commit
        if commit is not None:
            self._pending.append((seq, line))
            commit.written()  # the caller waits (for a transaction) when it lets go
            return
        self._send([(seq, line)])

    def _flush(self) -> Callable[[], None]:
        batch, self._pending = self._pending, []
        return lambda: self._send(batch)

    def _flush_failed(self, error: Exception) -> JournalError:
        if isinstance(error, JournalError):
            return type(error)(str(error))
        return JournalError(f"{self.url}: append failed: {error}")

    def _send(self, batch: list[tuple[int, bytes]]) -> None:
        """Append ``batch`` in order, a transaction per :data:`MAX_TXN_LINES` lines."""
        start = 0
        while start < len(batch):
            end, size = start, 0
            while end < len(batch) and end - start < MAX_TXN_LINES and (
                    end == start or size + len(batch[end][1]) <= MAX_TXN_BYTES):
                size += len(batch[end][1])
                end += 1
            self._send_txn(batch[start:end])
            start = end

    def _send_txn(self, chunk: list[tuple[int, bytes]]) -> None:
        self._check_usable()
        lead = self.leadership
        try:
            self._refuse_unless_leader()
        except Deposed as e:
            self._failure = e
            raise
        leader = lead.key
        keys = [journal_key(self.store, seq) for seq, _ in chunk]
        first, last = chunk[0][0], chunk[-1][0]
        span = f"seq {first}" if first == last else f"seqs {first}..{last}"
        try:
            self.txns += 1
            res = self.store.txn([cmp_create(leader, lead.epoch),
                                  *(cmp_version(k, 0) for k in keys)],
                                 [op_put(k, line) for k, (_, line) in zip(keys, chunk,
                                                                           strict=True)],
                                 [op_range(leader), op_range(keys[0])])
        except StoreRejected as e:
            self._failure = JournalError(f"{self.url}: append of {span} refused: {e}")
            raise self._failure from None
        except (StoreError, ValueError, KeyError) as e:  # ValueError: a garbled answer
            self._failure = JournalError(f"{self.url}: append of {span} failed, outcome "
                                         f"unknown until the journal is read again: {e}")
            raise self._failure from None
        except BaseException as e:  # whatever it was, these lines' fate is unknown
            self._failure = JournalError(f"{self.url}: append of {span} interrupted "
                                         f"({type(e).__name__}), outcome unknown")
            raise
        if res.succeeded:
            return
        holder = res.kvs(0)
        if not holder or holder[0].create_revision != lead.epoch:
            who = ("no leader now" if not holder else "leader now " + _parse_leader(
                holder[0].value, holder[0].create_revision, 0).describe())
            self._failure = Deposed(f"{self.url}: append of {span} refused: "
                                    f"{lead.controller_id} (epoch {lead.epoch}) was deposed; "
                                    f"{who}")
        else:
            self._failure = JournalError(f"{self.url}: append of {span} refused: "
                                         f"{keys[0]} exists already (another writer in "
                                         f"epoch {lead.epoch})")
        raise self._failure

    def close(self) -> None:
        with self._lock:
            self._closed = True
