"""Streaming benchmark: do the file-reading commands run in memory that does not grow
with the file?

Builds in a temp dir a chain-valid journal of about ``--size-mb`` MB (default 1024:
header, a bootstrap that names the weights' identity, then admit/release pairs, sealed
with the journal's own ``seal``/``dumps_line``), and records files (JSON lines and
Parquet) of about ``--records-mb`` MB bound to some of its admissions. Then runs, each as
its own process, ``rolloutcore journal verify``, ``records show`` (JSON lines, Parquet)
and ``records verify`` (both), and prints one line per command: file size, records,
seconds, peak RSS (that process's, from ``wait4`` in a small launcher) and peak RSS /
file size. The
interpreter's fixed cost (the same imports, no file) is printed first for reference.

Goal: a 1 GB journal verified in under 300 MB. With ``--json``, progress goes to stderr
and stdout is one JSON object (rows and goal). Exits 0 unless a measured command itself
failed (then its figures measure nothing).

Run: ``.venv/bin/python benchmarks/bench_streaming.py [--size-mb N] [--records-mb N]
[--keep DIR] [--json]`` (about 13 minutes at the defaults on the 2-core machine, most
of it building the files and the two ``records verify`` runs; ``--size-mb 100
--records-mb 30`` for a quick look).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import GenerationResult
from rolloutcore.engine.controller import Binding
from rolloutcore.journal import HEADER, SCHEMA, ZERO_HASH, dumps_line, seal
from rolloutcore.trajectories.format import (
    Decoding,
    Timing,
    TrajectoryRecord,
    dumps,
    record_from,
    write_parquet,
)

IDENTITY = "sha256:" + "5e" * 32
PROMPT, RESPONSE = 1024, 512  # tokens per record: about 20 kB of JSON


def write_journal(path: Path, size: int) -> tuple[int, list[tuple[str, int]]]:
    """A chain-valid journal of about ``size`` bytes; returns its record count and the
    (rollout id, admission seq) of every admission."""
    admissions: list[tuple[str, int]] = []
    prev, seq, written = ZERO_HASH, 0, 0
    with open(path, "w", buffering=1 << 20) as fh:

        def put(rec: dict[str, Any]) -> None:
            nonlocal prev, written
            rec["prev"] = prev
            rec["hash"] = prev = seal(rec)
            line = dumps_line(rec)
            fh.write(line)
            written += len(line)

        put({"seq": 0, "type": HEADER, "schema": SCHEMA, "spec": "RolloutCore", "t": 0.0})

        def step(step: str, typ: str, param: str | None, committed: int, phase: str,
                 pending: str, op: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
            nonlocal seq
            seq += 1
            rec: dict[str, Any] = {
                "seq": seq, "type": typ, "op": op, "step": step, "param": param,
                "phase": phase, "committed": committed, "target": 0, "pending": pending,
                "t": 1.7e9 + seq / 4}
            if detail is not None:
                rec["detail"] = detail
            put(rec)

        step("bootstrap_begin", "invoke", None, 0, "UNINITIALIZED", "bootstrap", "bootstrap")
        step("bootstrap_ok", "ok", None, 1, "READY", "none", "bootstrap",
             {"label": "gen-1", "identity": IDENTITY})
        n = 0
        while written < size:
            n += 1
            rid = f"rollout-{n:09d}"
            step("admit", "step", rid, 1, "READY", "none", detail={"worker": n % 8})
            admissions.append((rid, seq))
            step("release", "step", rid, 1, "READY", "none",
                 detail={"tokens": PROMPT + RESPONSE, "finish_reason": "length"})
    return seq + 1, admissions


def records(admissions: list[tuple[str, int]], size: int) -> Iterator[TrajectoryRecord]:
    """Records bound to evenly spread admissions, about ``size`` bytes of JSON lines."""
    per = len(dumps(_record("r", 1, 0)))
    count = max(1, min(len(admissions), size // per))
    step = len(admissions) // count
    for i in range(count):
        rid, seq = admissions[i * step]
        yield _record(rid, seq, i)


def _record(rid: str, seq: int, i: int) -> TrajectoryRecord:
    prompt = tuple((i * 7919 + k * 104729) % 50_000 for k in range(PROMPT))
    response = tuple((i * 31 + k * 7) % 50_000 for k in range(RESPONSE))
    logprobs = tuple(-((k * 2654435761) % 10_000) / 997.0 for k in range(RESPONSE))
    return record_from(Binding(rid, 1, IDENTITY, seq), "gen-1", prompt,
                       GenerationResult(prompt, response, "length", logprobs),
                       Decoding(0.7, 0.95, RESPONSE, 0, (), seed=i), Timing(1.7e9 + i, 1.5))


# Linux carries a process's peak RSS across exec: a child forked straight from this
# (large) process would report at least our own peak. Each command is therefore started
# by a small launcher process, whose own footprint (~10 MB) is the floor of the figure.
_LAUNCHER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read().decode()
_pid, status, usage = os.wait4(p.pid, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "err": err,
                  "seconds": time.perf_counter() - t0, "maxrss_kb": usage.ru_maxrss}))
"""


def measure(argv: list[str]) -> tuple[int, float, float]:
    """Run one command in its own process: (exit status, seconds, peak RSS in MB)."""
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], capture_output=True,
                         text=True, check=True).stdout
    r = json.loads(out)
    if r["err"].strip():
        print(f"    stderr: {r['err'].strip()}", file=sys.stderr)
    return int(r["rc"]), float(r["seconds"]), r["maxrss_kb"] / 1024  # kB on Linux


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024, help="journal size (default 1024)")
    ap.add_argument("--records-mb", type=float, default=300,
                    help="records file size, JSON lines (default 300)")
    ap.add_argument("--keep", type=Path, help="build the files here and keep them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = None
    if args.keep:
        root = args.keep
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench-streaming-")
        root = Path(tmp.name)
    try:
        journal, rj, rp = root / "journal.jsonl", root / "records.jsonl", root / "records.parquet"
        t0 = time.perf_counter()
        n_journal, admissions = write_journal(journal, int(args.size_mb * 2**20))
        t1 = time.perf_counter()
        with open(rj, "w", buffering=1 << 20) as fh:
            n_records = 0
            for r in records(admissions, int(args.records_mb * 2**20)):
                fh.write(dumps(r) + "\n")
                n_records += 1
        write_parquet(rp, records(admissions, int(args.records_mb * 2**20)))
        del admissions
        t2 = time.perf_counter()
        log = sys.stderr if args.json else sys.stdout
        print(f"built: journal {journal.stat().st_size / 2**20:.0f} MB ({n_journal:,} records) "
              f"in {t1 - t0:.0f} s; records {n_records:,} in {t2 - t1:.0f} s", file=log,
              flush=True)

        exe = [sys.executable, "-m", "rolloutcore.cli"]
        runs = [
            ("interpreter + imports (no file)", [sys.executable, "-c", "import rolloutcore.cli, "
             "rolloutcore.trajectories.provenance, rolloutcore.trajectories.format, "
             "pyarrow.parquet"], None, 0, 0),
            ("journal verify", [*exe, "journal", "verify", str(journal)], journal, n_journal, 0),
            ("records show (jsonl)", [*exe, "records", "show", str(rj)], rj, n_records, 0),
            ("records show (parquet)", [*exe, "records", "show", str(rp)], rp, n_records, 0),
            ("records verify (jsonl)", [*exe, "records", "verify", str(rj), "--journal",
                                        str(journal)], rj, n_records, 0),
            ("records verify (parquet)", [*exe, "records", "verify", str(rp), "--journal",
                                          str(journal)], rp, n_records, 0),
        ]
        rows: list[dict[str, Any]] = []
        for name, argv, path, count, want in runs:
            rc, seconds, rss = measure(argv)
            size = path.stat().st_size / 2**20 if path is not None else 0.0
            row = {"command": name, "size_mb": round(size, 1), "records": count,
                   "seconds": round(seconds, 2), "peak_rss_mb": round(rss, 1),
                   "rss_per_size": round(rss / size, 4) if size else None, "exit": rc}
            rows.append(row)
            if not args.json:
                ratio = f"{rss / size:.3f}" if size else "-"
                print(f"{name:32s} {size:8.1f} MB {count:>11,} records {seconds:8.1f} s "
                      f"peak RSS {rss:7.1f} MB  RSS/size {ratio}  exit {rc}"
                      + ("" if rc == want else "  UNEXPECTED EXIT"), flush=True)
        journal_row = rows[1]
        goal = journal_row["peak_rss_mb"] < 300
        if args.json:
            print(json.dumps({"rows": rows, "goal": {
                "journal_mb": journal_row["size_mb"], "peak_rss_mb": journal_row["peak_rss_mb"],
                "goal_peak_rss_mb": 300, "met": goal}}, indent=2))
        else:
            print(f"goal (1 GB journal verified in < 300 MB): peak {journal_row['peak_rss_mb']} "
                  f"MB for {journal_row['size_mb']} MB: {'met' if goal else 'NOT met'}")
        return 0 if all(r["exit"] == 0 for r in rows) else 1
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
