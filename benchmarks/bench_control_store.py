"""The control store's journal against the local file journal: durable appends per second
and the latency of each, both with group commit, at 1, 4, 16 and 64 concurrent writers.

* Stores: the file journal (fsync on, group commit: one fsync per batch); etcd with one
  member and a 3-member cluster on loopback (real etcd processes, started and stopped
  here; :class:`~rolloutcore.control.EtcdJournal`, group commit: one transaction per
  batch, each guarded by the writer's leader key). Every data directory is on the same
  disk (the system's temporary directory).
* Records: what a gateway appends per rollout, an ``admit`` and a ``release`` (with the
  gateway's details), through member sinks (``Journal.member``) of 8 engines; each writer
  thread appends its own, one at a time, and an append returns once it is durable.
* Each writer count runs ``--rounds`` times (a fresh journal each time, under a key
  prefix of its own for etcd); records/s is the median round, the latencies are the
  p50 and p99 of every append of every round. Also: flushes (fsyncs or transactions) per
  record, and the CPU per record of this process (the writers, the chain, the HTTP
  client) and of the etcd processes, from /proc: on a 2-core machine the rate is bounded
  by CPU as much as by the disk.

Printed per writer count: each store's numbers and the ratio etcd / file (records/s and
p50). ``--json``: every number. About a minute on the 2-core machine; ``--quick``: a
smoke run (fewer records, one round).

Run: ``.venv/bin/python benchmarks/bench_control_store.py [--quick] [--rounds N] [--json]``
(exit 3 if etcd is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.conformance.fixtures.etcd_server import EtcdCluster, EtcdError, etcd_binary
from rolloutcore.control import EtcdJournal, EtcdStore, Leadership
from rolloutcore.engine.controller import TraceRecord
from rolloutcore.journal import Journal
from rolloutcore.spec.lifecycle import NO_OP, Phase

WRITERS = (1, 4, 16, 64)
#: Records appended per run at each writer count (about a second of etcd appends here).
RECORDS = {1: 500, 4: 1_000, 16: 2_000, 64: 4_000}
ENGINES = 8  # member sinks the records are spread over
FLEET_SPEC = "RolloutCoreFleet"
STORES = ("file", "etcd-1", "etcd-3")
LABEL = {"file": "file (fsync)", "etcd-1": "etcd, 1 member", "etcd-3": "etcd, 3 members"}


def rollout_records(writer: int, count: int) -> list[TraceRecord]:
    """``count`` records of writer ``writer``: admit, release, admit, ... (a gateway's)."""
    out = []
    for k in range(count):
        rid = f"w{writer}-r{k // 2}"
        if k % 2 == 0:
            out.append(TraceRecord(0, "admit", rid, Phase.READY, 1, 0, NO_OP,
                                   {"via": "gateway", "endpoint": "completions"}))
        else:
            out.append(TraceRecord(0, "release", rid, Phase.READY, 1, 0, NO_OP,
                                   {"status": 200}))
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (0 if unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass
class Opened:
    journal: Journal
    flushes: Callable[[], int]  # fsyncs or transactions so far
    close: Callable[[], None]


@dataclass
class Store:
    """Where the journals of one store kind are opened (a fresh one per run)."""

    kind: str  # one of STORES
    root: Path | None = None  # file: the directory
    cluster: EtcdCluster | None = None  # etcd: the running cluster
    runs: int = field(default=0)

    def server_cpu_s(self) -> float:
        if self.cluster is None:
            return 0.0
        return sum(_cpu_s(m.proc.pid) for m in self.cluster.members if m.proc is not None)

    def open(self) -> Opened:
        self.runs += 1
        if self.cluster is None:
            assert self.root is not None
            fj = Journal(self.root / f"run{self.runs}.jsonl", fsync=True,
                         spec_name=FLEET_SPEC, group_commit=True)
            return Opened(fj, lambda: fj.fsyncs, fj.close)
        store = EtcdStore(self.cluster.endpoints, prefix=f"/bench/{self.kind}/run{self.runs}",
                          timeout_s=5.0)
        lead = Leadership(store, "bench", ttl_s=10.0)
        lead.campaign(timeout_s=10.0)
        ej = EtcdJournal(store, lead, spec_name=FLEET_SPEC, group_commit=True)

        def close() -> None:
            ej.close()
            lead.resign()
            store.close()
        return Opened(ej, lambda: ej.txns, close)


def drive(opened: Opened, writers: int, per_writer: int,
          cpu_of_server: Callable[[], float]) -> dict[str, Any]:
    """``writers`` threads append ``per_writer`` records each to ``opened.journal``, started
    together; every append timed to its (durable) return."""
    sinks = [opened.journal.member(f"e{i % ENGINES}") for i in range(writers)]
    records = [rollout_records(i, per_writer) for i in range(writers)]
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []
    start = threading.Barrier(writers + 1)

    def write(i: int) -> None:
        sink, lat, perf = sinks[i], latencies[i], time.perf_counter
        start.wait()
        try:
            for r in records[i]:
                t0 = perf()
                sink(r)
                lat.append(perf() - t0)
        except BaseException as e:  # reported below: a failed append voids the run
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(writers)]
    for t in threads:
        t.start()
    flushes0, cpu0, server0 = opened.flushes(), time.process_time(), cpu_of_server()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    cpu, server = time.process_time() - cpu0, cpu_of_server() - server0
    if errors:
        raise RuntimeError(f"an append failed: {errors[0]!r}")
    n = writers * per_writer
    return {"records": n, "seconds": seconds, "records_per_s": n / seconds,
            "flushes": opened.flushes() - flushes0, "client_cpu_s": cpu,
            "server_cpu_s": server, "latencies": [x for lat in latencies for x in lat]}


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def measure(store: Store, writers: int, records: int, rounds: int) -> dict[str, Any]:
    """``rounds`` runs of ``records`` appends by ``writers`` threads, each on a fresh
    journal: the median round's rate, latency percentiles over every append."""
    per_writer = max(2, records // writers)
    runs = []
    for _ in range(rounds):
        opened = store.open()
        try:
            runs.append(drive(opened, writers, per_writer, store.server_cpu_s))
        finally:
            opened.close()
    lat = [x for r in runs for x in r["latencies"]]
    n = sum(r["records"] for r in runs)
    flushes = sum(r["flushes"] for r in runs)
    rates = [r["records_per_s"] for r in runs]
    return {"store": store.kind, "writers": writers, "rounds": rounds,
            "records_per_round": writers * per_writer,
            "records_per_s": statistics.median(rates), "records_per_s_rounds": rates,
            "p50_ms": _pct(lat, 0.50) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
            "max_ms": max(lat) * 1e3,
            "flushes_per_record": flushes / n, "records_per_flush": n / max(flushes, 1),
            "flushes_per_s": statistics.median(r["flushes"] / r["seconds"] for r in runs),
            "client_cpu_ms_per_record": sum(r["client_cpu_s"] for r in runs) / n * 1e3,
            "server_cpu_ms_per_record": sum(r["server_cpu_s"] for r in runs) / n * 1e3}


def bytes_per_record(root: Path) -> float:
    """Mean line length of the records (header excluded) in one file journal."""
    j = Journal(root / "size.jsonl", fsync=False, spec_name=FLEET_SPEC)
    start = j.path.stat().st_size
    sink = j.member("e0")
    recs = rollout_records(0, 200)
    for r in recs:
        sink(r)
    j.close()
    return (j.path.stat().st_size - start) / len(recs)


def run_store(kind: str, writers: Sequence[int], records: dict[int, int], rounds: int,
              root: Path, cluster: EtcdCluster | None = None) -> list[dict[str, Any]]:
    """Every writer count on one store (``cluster`` running for etcd), after a warm-up."""
    store = Store(kind, root=root if cluster is None else None, cluster=cluster)
    measure(store, 4, 100, 1)  # warm-up: connections, the leader key, the page cache
    return [measure(store, w, records[w], rounds) for w in writers]


def run_etcd(kind: str, writers: Sequence[int], records: dict[int, int], rounds: int,
             root: Path) -> list[dict[str, Any]]:
    """Start etcd (``etcd-1`` or ``etcd-3``), measure, stop it."""
    with EtcdCluster(int(kind.split("-")[1])) as cluster:
        return run_store(kind, writers, records, rounds, root, cluster)


def _ratios(rows: list[dict[str, Any]]) -> None:
    files = {r["writers"]: r for r in rows if r["store"] == "file"}
    for r in rows:
        f = files.get(r["writers"])
        if f is not None:
            r["rate_vs_file"] = r["records_per_s"] / f["records_per_s"]
            r["p50_vs_file"] = r["p50_ms"] / f["p50_ms"]


def print_table(rows: list[dict[str, Any]], size: float, rounds: int) -> None:
    print(f"journal appends with group commit: admit/release records ({size:.0f} bytes "
          f"each), each durable before it returns; median of {rounds} round(s)")
    print(f"  {'writers':>7}  {'store':<16} {'records/s':>10} {'p50 ms':>7} {'p99 ms':>7}  "
          f"{'flushes/rec':<11} {'rec/flush':>9} {'cpu ms/rec':>12}  {'etcd/file':>14}")
    print(f"  {'':>7}  {'':<16} {'':>10} {'':>7} {'':>7}  {'':<11} {'':>9} "
          f"{'client+etcd':>12}  {'rate, p50':>14}")
    for w in sorted({r["writers"] for r in rows}):
        for r in (x for x in rows if x["writers"] == w):
            file = r["store"] == "file"
            flushes = f"{r['flushes_per_record']:.3f} {'fsync' if file else 'txn'}"
            vs = "" if file else f"{r['rate_vs_file']:.3f}x, {r['p50_vs_file']:.1f}x"
            cpu = (f"{r['client_cpu_ms_per_record']:.2f}" if file else
                   f"{r['client_cpu_ms_per_record']:.2f}+{r['server_cpu_ms_per_record']:.2f}")
            print(f"  {w:>7}  {LABEL[r['store']]:<16} {r['records_per_s']:>10,.0f} "
                  f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}  {flushes:<11} "
                  f"{r['records_per_flush']:>9.1f} {cpu:>12}  {vs:>14}")


def _on_sigterm(_sig: int, _frame: Any) -> None:
    raise SystemExit(143)  # unwinds the with-blocks: etcd is stopped on the way out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a smoke run: fewer records, 1 round")
    ap.add_argument("--rounds", type=int, default=3, help="runs per writer count (median)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        etcd_binary()
    except EtcdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, _on_sigterm)
    rounds = 1 if args.quick else args.rounds
    records = {w: max(w * 2, n // 10) if args.quick else n for w, n in RECORDS.items()}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-control-store-") as d:
        root = Path(d)
        rows = run_store("file", WRITERS, records, rounds, root)
        for kind in ("etcd-1", "etcd-3"):
            rows += run_etcd(kind, WRITERS, records, rounds, root)
        size = bytes_per_record(root)
    _ratios(rows)
    for r in rows:
        r.pop("latencies", None)
    out = {"rounds": rounds, "quick": args.quick, "bytes_per_record": size,
           "cpus": os.cpu_count(), "seconds": time.perf_counter() - t0, "rows": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_table(rows, size, rounds)
    print(f"  ({out['seconds']:.0f} s; {os.cpu_count()} CPUs shared by the writers and "
          "etcd; the etcd members' data on the same disk as the file journal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
