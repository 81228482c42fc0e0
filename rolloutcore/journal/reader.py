"""The journal reader: streams a journal's records while verifying its hash chain."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rolloutcore.journal.codec import (
    HEADER,
    HEADER_FIELDS,
    JEPSEN_TYPES,
    STEP_FIELDS,
    ZERO_HASH,
)

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


def scan(path: Path, *, keep: bool = True) -> tuple[ChainReport, list[dict[str, Any]], int]:
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
    report, records, _ = scan(Path(path))
    return report, records

