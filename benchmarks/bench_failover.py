"""Controller failover on etcd: takeover time against the lease, and whether one etcd
cluster can hold the journal of a large fleet. Real etcd (a 3-member cluster on loopback,
started and stopped here), simulated engines (in-process SimEngines and SimAdapters).

1. Takeover. Controller A wins leadership (``Leadership``, lease 1, 2 or 5 s), builds
   a fleet of N = 2 or 8 engines on the etcd journal (``EtcdJournalStore``), bootstraps it
   (``sim_target(1, "ckpt-1")``) and publishes two updates; standby B campaigns (blocking)
   in another thread. A freezes right after a lease refresh was acknowledged (the worst
   moment: the whole lease still to run): its keep-alive stops
   (``suspend_keepalive``), nothing more is done with its fleet, it does not resign.
   Measured: (i) A frozen -> B elected (the lease expiring on the server, etcd noticing,
   B's watch and its campaign transaction); (ii) B elected -> B's first verified action:
   its ``Fleet`` built (the journal read and replayed, every engine fenced with B's
   epoch, ``fleet_takeover`` and the members' restarts journalled); (iii) the total, and
   the total / lease. Each case ``--repeats`` times (3), the median. Checked every time:
   B's fleet is READY on A's committed generation and every engine's fence is B's epoch.
   Also reported: when A stood down by its own clock (before B was elected: no overlap)
   and B's first admission after (ii).
2. Sizing: can one etcd cluster hold the journal of 512 engines behind several gateways
   at 10,000 admissions/s? Measured here: etcd's append rate (3 members, 4, 16 and 64
   writers, group commit; bench_control_store.py's measurement) and the file journal's
   (64 writers); and, on a simulated fleet of 512 engines (``--sizing-engines``; on
   etcd and on the file journal, both with group commit as the gateway sets it), the
   records one update cycle writes per engine, one audit per engine, one admission
   (admit + release), the records per transaction, and the time a whole update cycle
   of the fleet takes on etcd, each measured at that size. With a smaller fleet
   (``--quick``: 16) the counts are extrapolated linearly to 512 engines (records per
   cycle grow with the engines; the cycle's time is taken as 512/n x the measured one).
   They give the write
   rate the store needs with an update every T = 10 or 60 s and every engine audited
   every ``--watchdog`` s (the gateway's default, 10 s), if (i) everything goes to etcd,
   or (ii) only lifecycle decisions, leadership and what each engine verified (audits)
   go to etcd while admissions and releases stay in per-gateway local journals (not
   implemented: arithmetic only). Printed: required records/s and transactions/s
   against the measured capacity, two shares of it and the headroom. Records: of the
   64-writer records/s. Transaction time: group commit keeps one transaction in flight
   per journal (one chain), so the journal is busy for each transaction's time, fitted
   as a + b x records from the runs at 4, 16 and 64 writers; each kind of record counts
   with the records per transaction measured for it (the 64-engine fleet's batches: a
   larger fleet batches more, so this errs high). A case fits if both shares are at most
   20%. Leadership counts one write per refresh (every lease / 3), an upper bound (etcd
   serves lease renewals on its leader, outside consensus).

Run: ``.venv/bin/python benchmarks/bench_failover.py [--quick] [--repeats N] [--json]``
(about two minutes on the 2-core machine; ``--quick``: one takeover case, a 16-engine
sizing fleet; exit 3 if etcd is missing).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_control_store import run_store

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_target
from rolloutcore.conformance.fixtures.etcd_server import EtcdCluster, EtcdError, etcd_binary
from rolloutcore.control import EtcdJournal, EtcdStore, Leadership
from rolloutcore.control.journal import MAX_TXN_LINES
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet
from rolloutcore.fleet.store import EtcdJournalStore
from rolloutcore.journal import read_journal
from rolloutcore.spec.fleet import FleetPhase

LEASES = (1.0, 2.0, 5.0)
SIZES = (2, 8)
REPEATS = 3
HISTORY = 2  # updates A publishes before it freezes
TARGET_ENGINES = 512
SIZING_ENGINES = TARGET_ENGINES  # the simulated fleet whose records are counted
SIZING_CYCLES = 3
ADMISSIONS_PER_S = 10_000
PERIODS = (10.0, 60.0)  # an update every T seconds
WATCHDOG_S = 10.0  # the gateway's default audit period
LEASE_S = 5.0  # the fleet file's default lease (leadership writes in the sizing)
BUDGET = 0.20  # the share of etcd's measured capacity a design may use
CAPACITY_WRITERS = 64
FIT_WRITERS = (4, 16, CAPACITY_WRITERS)  # a transaction's time against its size
CAPACITY_RECORDS = {4: 1_000, 16: 2_000, CAPACITY_WRITERS: 4_000}
BOUND = 60.0  # against a hang, never a measurement
#: Generous deadlines (nothing is slow here), no retry backoff.
FAST = RunnerPolicy(step_timeout_s=30.0, pause_timeout_s=30.0, retry_backoff_s=0.0,
                    mutation_base_s=30.0)


def target(generation: int) -> WeightTarget:
    return sim_target(generation, f"ckpt-{generation}")


def target_of(source: str, generation: int, label: str) -> WeightTarget:
    return sim_target(generation, source, label=label)


def members(engines: Sequence[SimEngine]) -> list[tuple[str, SimAdapter, str | None]]:
    """A controller's own adapters to the shared engines (each controller has its own
    connection; the engine, and its fence, is one)."""
    return [(f"e{i:03d}", SimAdapter(e), None) for i, e in enumerate(engines)]


def granted_ttl(store: EtcdStore, lead: Leadership) -> int:
    """The TTL etcd granted the leader key's lease (it may raise a short one)."""
    kv = store.get(lead.key)
    if kv is None or not kv.lease:
        return 0
    body = store.request("/lease/timetolive", {"ID": kv.lease}, idempotent=True)
    return int(body.get("grantedTTL", 0))


# --------------------------------------------------------------------- 1. takeover


def takeover(cluster: EtcdCluster, lease: float, n: int, tag: str) -> dict[str, Any]:
    """One failover: A leads a fleet of ``n``, freezes after a refresh, B takes over."""
    store = EtcdStore(cluster.endpoints, prefix=f"/bench/failover/{tag}", timeout_s=2.0)
    engines = [SimEngine("ckpt-1", label="rc-1") for _ in range(n)]
    lead_a = Leadership(store, "A", ttl_s=lease)
    lead_b = Leadership(store, "B", ttl_s=lease)
    fleet_a: Fleet | None = None
    got: dict[str, Any] = {}
    try:
        lead_a.campaign(timeout_s=10.0)
        fleet_a = Fleet(members(engines), journal=EtcdJournalStore(store, lead_a, "A"),
                        policy=FAST, target_of=target_of)
        fleet_a.journal.use_group_commit()  # as the gateway runs it
        fleet_a.bootstrap(target(1))
        for g in range(2, HISTORY + 2):
            if not fleet_a.update(target(g)).published:
                raise SystemExit(f"A's update to generation {g} did not publish")
        records = fleet_a.journal.last_seq + 1
        ttl = granted_ttl(store, lead_a)
        lead_a.on_lost(lambda: got.setdefault("a_stood_down", time.monotonic()))

        def standby() -> None:
            try:
                got["epoch_b"] = lead_b.campaign(timeout_s=lease * 4 + BOUND)
                got["elected"] = time.monotonic()
                fleet_b = Fleet(members(engines), journal=EtcdJournalStore(store, lead_b, "B"),
                                policy=FAST, target_of=target_of)
                got["ready"] = time.monotonic()
                got["fleet_b"] = fleet_b
                first = fleet_b.admit("first-after-takeover")
                got["admitted"] = time.monotonic()
                fleet_b.release(first)
            except BaseException as e:  # reported by the caller
                got["error"] = e

        thread = threading.Thread(target=standby, name="standby-B", daemon=True)
        thread.start()
        time.sleep(0.1)  # B finds A's key and watches it
        seen = lead_a.refreshes
        deadline = time.monotonic() + lease + 5.0
        while lead_a.refreshes == seen and time.monotonic() < deadline:
            time.sleep(0.0005)
        frozen = time.monotonic()
        lead_a.suspend_keepalive()  # A freezes: no refresh, no resign, its fleet unused
        thread.join(lease * 4 + BOUND)
        if thread.is_alive() or "error" in got:
            raise SystemExit(f"takeover (lease {lease:g} s, {n} engines) failed: "
                             f"{got.get('error', 'B not elected in time')!r}")
        fleet_b = got["fleet_b"]
        epoch_b = got["epoch_b"]
        fences = {e.gate.seen for e in engines}
        if (fleet_b.phase != FleetPhase.READY or fleet_b.committed != HISTORY + 1
                or fleet_b.unfenced or fences != {epoch_b} or epoch_b <= lead_a.epoch):
            raise SystemExit(f"B's takeover is not verified: phase {fleet_b.phase}, "
                             f"committed {fleet_b.committed}, unfenced {fleet_b.unfenced}, "
                             f"fences {fences} (B's epoch {epoch_b})")
        elect, ready = got["elected"] - frozen, got["ready"] - got["elected"]
        return {"lease_s": lease, "granted_ttl_s": ttl, "engines": n,
                "journal_records": records, "elect_s": elect, "first_action_s": ready,
                "total_s": elect + ready, "total_over_lease": (elect + ready) / lease,
                "a_stood_down_s": got.get("a_stood_down", math.nan) - frozen,
                "first_admit_s": got["admitted"] - got["ready"],
                "epochs": [lead_a.epoch, epoch_b]}
    finally:
        if "fleet_b" in got:
            got["fleet_b"].close()
        if fleet_a is not None:
            fleet_a.close()
        lead_b.resign()
        lead_a.resign()
        store.close()


def takeovers(cluster: EtcdCluster, leases: Sequence[float], sizes: Sequence[int],
              repeats: int) -> list[dict[str, Any]]:
    rows = []
    for lease in leases:
        for n in sizes:
            runs = [takeover(cluster, lease, n, f"l{lease:g}-n{n}-r{r}")
                    for r in range(repeats)]
            med = {k: statistics.median(r[k] for r in runs)
                   for k in ("elect_s", "first_action_s", "total_s", "total_over_lease",
                             "a_stood_down_s", "first_admit_s")}
            rows.append({"lease_s": lease, "engines": n, "repeats": repeats,
                         "granted_ttl_s": max(r["granted_ttl_s"] for r in runs),
                         "journal_records": runs[0]["journal_records"], **med,
                         "total_max_s": max(r["total_s"] for r in runs), "runs": runs})
    return rows


# ----------------------------------------------------------------------- 2. sizing


def fleet_costs(n: int, cycles: int, root: Path, cluster: EtcdCluster | None
                ) -> dict[str, Any]:
    """A fleet of ``n`` simulated engines on etcd (``cluster``) or on a file journal
    (fsync), group commit on: per update cycle, audit and admission, the records written,
    the flushes (transactions or fsyncs) and the time."""
    engines = [SimEngine("ckpt-1", label="rc-1") for _ in range(n)]
    store = lead = None
    if cluster is not None:
        store = EtcdStore(cluster.endpoints, prefix=f"/bench/sizing/n{n}", timeout_s=5.0)
        lead = Leadership(store, "sizing", ttl_s=10.0)
        lead.campaign(timeout_s=10.0)
        journal: Any = EtcdJournalStore(store, lead, "sizing")
    else:
        journal = root / f"sizing-{n}.jsonl"
    fleet = Fleet(members(engines), journal=journal, policy=FAST, target_of=target_of,
                  fsync=True)
    j = fleet.journal
    j.use_group_commit()

    def flushes() -> int:
        return j.txns if isinstance(j, EtcdJournal) else j.fsyncs

    spans: dict[str, list[tuple[int, int]]] = {"cycle": [], "audit": [], "admission": []}
    out: dict[str, Any] = {"store": "etcd-3" if cluster is not None else "file",
                           "engines": n}

    def timed(kind: str, fn: Callable[[], None]) -> tuple[float, int, int]:
        seq0, f0 = j.last_seq, flushes()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        spans[kind].append((seq0 + 1, j.last_seq))
        return dt, j.last_seq - seq0, flushes() - f0

    try:
        fleet.bootstrap(target(1))
        if not fleet.update(target(2)).published:  # warm-up
            raise SystemExit(f"warm-up update of {n} engines did not publish")
        cyc = []
        for _ in range(cycles):
            g = fleet.committed + 1

            def update(g: int = g) -> None:
                if not fleet.update(target(g)).published:
                    raise SystemExit(f"update of {n} engines to {g} did not publish")
            cyc.append(timed("cycle", update))

        def audit() -> None:
            if len(fleet.audit(why="watchdog")) != n:
                raise SystemExit(f"the audit did not read all {n} engines")
        aud = timed("audit", audit)
        admissions = 100 if cluster is not None else 400

        def admit_release() -> None:
            for k in range(admissions):
                fleet.release(fleet.admit(f"r{k}"))
        adm = timed("admission", admit_release)
    finally:
        fleet.close()
        if lead is not None:
            lead.resign()
        if store is not None:
            store.close()
    out.update({
        "cycles": cycles, "cycle_s": statistics.median(c[0] for c in cyc),
        "records_per_cycle": statistics.median(c[1] for c in cyc),
        "flushes_per_cycle": statistics.median(c[2] for c in cyc),
        "audit_s": aud[0], "records_per_audit": aud[1], "flushes_per_audit": aud[2],
        "admissions": admissions, "records_per_admission": adm[1] / admissions,
        "flushes_per_admission": adm[2] / admissions,
        "admission_ms": adm[0] / admissions * 1e3})
    if cluster is None:  # the file says which records are the members' and the fleet's
        _report, recs = read_journal(root / f"sizing-{n}.jsonl")
        by_seq = {r["seq"]: r for r in recs}
        for kind, ranges in spans.items():
            count: Counter[str] = Counter()
            for lo, hi in ranges:
                for s in range(lo, hi + 1):
                    count["member" if by_seq[s].get("engine") else "fleet"] += 1
                    count["bytes"] += len(json.dumps(by_seq[s], sort_keys=True,
                                                     separators=(",", ":")))
            out[f"{kind}_member_records"] = count["member"] / len(ranges)
            out[f"{kind}_fleet_records"] = count["fleet"] / len(ranges)
            out[f"{kind}_bytes_per_record"] = count["bytes"] / max(
                count["member"] + count["fleet"], 1)
    return out


def sizing(cluster: EtcdCluster, root: Path, n: int, cycles: int, scale_records: float,
           rounds: int, watchdog_s: float) -> dict[str, Any]:
    """Capacity of the etcd journal and of the file journal, the records a fleet of ``n``
    writes, and the write rate 512 engines need under each design."""
    records = {w: max(2 * w, int(r * scale_records)) for w, r in CAPACITY_RECORDS.items()}
    fit_rows = run_store("etcd-3", FIT_WRITERS, records, rounds, root, cluster)
    file_cap = run_store("file", [CAPACITY_WRITERS], records, rounds, root)[0]
    for r in [*fit_rows, file_cap]:
        r.pop("latencies", None)
    cap = fit_rows[-1]  # CAPACITY_WRITERS
    # Group commit keeps one transaction in flight per journal (one chain): with writers
    # waiting, the next starts as the last ends, so 1 / (txns/s) is a transaction's time.
    slope, intercept = statistics.linear_regression(
        [r["records_per_flush"] for r in fit_rows], [1 / r["flushes_per_s"] for r in fit_rows])

    def txn_s(k: float) -> float:
        return intercept + slope * k

    etcd = fleet_costs(n, cycles, root, cluster)
    file = fleet_costs(n, cycles, root, None)
    if etcd["records_per_cycle"] != file["records_per_cycle"]:
        raise SystemExit(f"records per cycle differ: etcd {etcd['records_per_cycle']}, "
                         f"file {file['records_per_cycle']}")
    per_engine = file["cycle_member_records"] / n  # lifecycle records per engine per cycle
    fleet_per_cycle = file["cycle_fleet_records"]
    per_audit = file["records_per_audit"] / n
    per_admission = file["records_per_admission"]
    b_life = etcd["records_per_cycle"] / etcd["flushes_per_cycle"]
    b_audit = etcd["records_per_audit"] / max(etcd["flushes_per_audit"], 1)
    b_adm = cap["records_per_flush"]
    cap_rec = cap["records_per_s"]
    scale = TARGET_ENGINES / n
    adm_rec = ADMISSIONS_PER_S * per_admission
    audit_rec = TARGET_ENGINES * per_audit / watchdog_s
    lead_w = 3.0 / LEASE_S
    cases = []
    for design in ("all", "split"):
        for period in PERIODS:
            life_rec = (TARGET_ENGINES * per_engine + fleet_per_cycle) / period
            # (records/s, records per transaction) of each kind of write
            parts = [(life_rec, b_life), (audit_rec, b_audit), (lead_w, 1.0)]
            if design == "all":
                parts.append((adm_rec, b_adm))
            rec = sum(r for r, _ in parts)
            txn = sum(r / k for r, k in parts)
            busy = sum(r / k * txn_s(k) for r, k in parts)
            share = max(rec / cap_rec, busy)
            cases.append({"design": design, "period_s": period, "records_per_s": rec,
                          "txns_per_s": txn, "lifecycle_records_per_s": life_rec,
                          "audit_records_per_s": audit_rec,
                          "admission_records_per_s": adm_rec if design == "all" else 0.0,
                          "leadership_writes_per_s": lead_w,
                          "share_of_records": rec / cap_rec, "share_of_txn_time": busy,
                          "headroom": 1 / share, "fits": share <= BUDGET})
    return {
        "engines_measured": n, "engines_target": TARGET_ENGINES,
        "admissions_per_s": ADMISSIONS_PER_S, "watchdog_s": watchdog_s, "lease_s": LEASE_S,
        "budget": BUDGET, "capacity": {"etcd-3": cap, "file": file_cap, "fit_runs": fit_rows},
        "txn_ms_intercept": intercept * 1e3, "txn_ms_per_record": slope * 1e3,
        "one_chain_ceiling_records_per_s": MAX_TXN_LINES / txn_s(MAX_TXN_LINES),
        "fleet_etcd": etcd, "fleet_file": file,
        "lifecycle_records_per_engine_per_cycle": per_engine,
        "fleet_records_per_cycle": fleet_per_cycle,
        "records_per_engine_per_audit": per_audit, "records_per_admission": per_admission,
        "records_per_txn": {"lifecycle": b_life, "audit": b_audit, "admission": b_adm},
        "cycle_s_extrapolated": {"etcd-3": etcd["cycle_s"] * scale,
                                 "file": file["cycle_s"] * scale},
        "records_per_cycle_extrapolated": TARGET_ENGINES * per_engine + fleet_per_cycle,
        "gateways_for_budget": math.ceil(adm_rec / (BUDGET * file_cap["records_per_s"])),
        "cases": cases}


# ------------------------------------------------------------------------- output


def print_takeovers(rows: list[dict[str, Any]], repeats: int) -> None:
    print(f"takeover: A frozen right after a lease refresh, standby B campaigning; etcd "
          f"3 members; medians of {repeats}")
    print(f"  {'lease':>5} {'engines':>7} {'journal':>7}  {'(i) elected':>11} "
          f"{'(ii) fleet':>10} {'(iii) total':>11} {'total/lease':>11}  {'max':>6}  "
          f"{'A stood down':>12} {'1st admit':>9}")
    for r in rows:
        granted = "" if r["granted_ttl_s"] <= r["lease_s"] else f" (granted {r['granted_ttl_s']})"
        print(f"  {r['lease_s']:>4g}s {r['engines']:>7} {r['journal_records']:>7}  "
              f"{r['elect_s']:>10.3f}s {r['first_action_s']:>9.3f}s {r['total_s']:>10.3f}s "
              f"{r['total_over_lease']:>10.2f}x  {r['total_max_s']:>5.2f}s  "
              f"{r['a_stood_down_s']:>11.3f}s {r['first_admit_s'] * 1e3:>7.1f}ms{granted}")
    print("  (i) A frozen -> B elected; (ii) B elected -> its Fleet built (journal replayed, "
          "every engine fenced with B's epoch,")
    print("  fleet_takeover journalled); A stood down: A's own clock ended its term, this "
          "long after the freeze (before B's election);")
    print("  (i) exceeds the lease by etcd's sweep of expired leases (every 0.5 s), B's watch "
          "and its campaign transaction")


def print_sizing(s: dict[str, Any]) -> None:
    n, big = s["engines_measured"], s["engines_target"]
    e, f = s["fleet_etcd"], s["fleet_file"]
    ce, cf = s["capacity"]["etcd-3"], s["capacity"]["file"]
    b = s["records_per_txn"]
    print(f"sizing: {big} engines, {s['admissions_per_s']:,} admissions/s, every engine "
          f"audited every {s['watchdog_s']:g} s, lease {s['lease_s']:g} s")
    print(f"  capacity here ({CAPACITY_WRITERS} writers, group commit): etcd 3 members "
          f"{ce['records_per_s']:,.0f} records/s in {ce['flushes_per_s']:,.0f} txns/s "
          f"({ce['records_per_flush']:.1f} records/txn); file journal "
          f"{cf['records_per_s']:,.0f} records/s "
          f"(file/etcd {cf['records_per_s'] / ce['records_per_s']:.1f}x)")
    fit = ", ".join(f"{r['records_per_flush']:.1f} records in {1e3 / r['flushes_per_s']:.1f} ms"
                    for r in s["capacity"]["fit_runs"])
    print(f"  one journal transaction at a time (one chain): {s['txn_ms_intercept']:.2f} ms + "
          f"{s['txn_ms_per_record']:.3f} ms per record (fit over {fit}); at most "
          f"{s['one_chain_ceiling_records_per_s']:,.0f} records/s in full "
          f"{MAX_TXN_LINES}-record txns")
    print(f"  counted on a {n}-engine simulated fleet: per engine per update cycle "
          f"{s['lifecycle_records_per_engine_per_cycle']:.1f} records "
          f"(+{s['fleet_records_per_cycle']:.0f} fleet records per cycle), per engine per "
          f"audit {s['records_per_engine_per_audit']:.1f}, per admission "
          f"{s['records_per_admission']:.1f} (admit + release)")
    print(f"  {n}-engine update cycle: etcd {e['cycle_s']:.2f} s ({e['records_per_cycle']:,.0f} "
          f"records in {e['flushes_per_cycle']:.0f} txns: {b['lifecycle']:.1f} records/txn), "
          f"file {f['cycle_s']:.2f} s (etcd/file {e['cycle_s'] / f['cycle_s']:.1f}x); an "
          f"audit: {b['audit']:.1f} records/txn; an admission through the fleet: etcd "
          f"{e['admission_ms']:.1f} ms, file {f['admission_ms']:.2f} ms")
    x = s["cycle_s_extrapolated"]
    if n == big:
        print(f"  measured at {big} engines: the fleet's update cycle writes "
              f"{e['records_per_cycle']:,.0f} records to etcd in {e['cycle_s']:.1f} s "
              f"({e['records_per_cycle'] / e['cycle_s']:,.0f} records/s while it runs, "
              f"{e['records_per_cycle'] / e['cycle_s'] / ce['records_per_s']:.0%} of "
              f"the capacity above)")
    else:
        print(f"  extrapolated linearly to {big} engines: "
              f"{s['records_per_cycle_extrapolated']:,.0f} records per update cycle, about "
              f"{x['etcd-3']:.1f} s per cycle on etcd ({x['file']:.1f} s on the file journal)")
    print(f"  {'what goes to etcd':<36} {'T':>4} {'records/s':>10} {'txns/s':>8}  "
          f"{'share of capacity':>17} {'headroom':>9}  {'<=' + format(BUDGET, '.0%'):>5}")
    print(f"  {'':<36} {'':>4} {'':>10} {'':>8}  {'records':>8} {'txn time':>8}")
    names = {"all": "(i) everything", "split": "(ii) lifecycle, leadership, audits"}
    for c in s["cases"]:
        print(f"  {names[c['design']]:<36} {c['period_s']:>3g}s {c['records_per_s']:>10,.0f} "
              f"{c['txns_per_s']:>8,.1f}  {c['share_of_records']:>8.1%} "
              f"{c['share_of_txn_time']:>8.1%} {c['headroom']:>8.2f}x  "
              f"{'yes' if c['fits'] else 'no':>5}")
    print("  (txns/s: each kind's records / its records per txn as measured; records: of "
          "the records/s above; txn time: of the")
    print("  journal's one-at-a-time transactions, by the fit; headroom: capacity / "
          "required by the larger share)")
    adm = s["admissions_per_s"] * s["records_per_admission"]
    print(f"  (ii) leaves {adm:,.0f} admission records/s to per-gateway file journals "
          f"({cf['records_per_s']:,.0f} records/s each here): >= {s['gateways_for_budget']} "
          f"gateways keep each below {BUDGET:.0%}")
    fits = [c for c in s["cases"] if c["fits"]]
    worst = min(c["headroom"] for c in s["cases"] if c["design"] == "all")
    verdict = ("; ".join(f"{names[c['design']]} with T = {c['period_s']:g} s" for c in fits)
               or "neither design")
    print(f"  conclusion: below {BUDGET:.0%} of etcd's measured capacity: {verdict}. "
          f"Everything in etcd needs {1 / worst:.1f}x its capacity or more.")


def _on_sigterm(_sig: int, _frame: Any) -> None:
    raise SystemExit(143)  # unwinds the with-blocks: etcd is stopped on the way out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: one takeover case, a 16-engine sizing fleet")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="takeovers per case (median)")
    ap.add_argument("--watchdog", type=float, default=WATCHDOG_S,
                    help="the sizing's audit period per engine (s)")
    ap.add_argument("--sizing-engines", type=int, default=None,
                    help=f"the simulated fleet the sizing counts on (default "
                         f"{SIZING_ENGINES}, 16 with --quick)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.watchdog <= 0:
        ap.error("--repeats must be at least 1 and --watchdog positive")
    if args.sizing_engines is not None and not 1 <= args.sizing_engines <= TARGET_ENGINES:
        ap.error(f"--sizing-engines must be between 1 and {TARGET_ENGINES}")
    try:
        etcd_binary()
    except EtcdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A frozen leader's loss of its term is the point of the benchmark, not news.
    logging.getLogger("rolloutcore.control.leadership").setLevel(logging.ERROR)
    quick = args.quick
    leases, sizes = ((1.0,), (2,)) if quick else (LEASES, SIZES)
    repeats = 1 if quick else args.repeats
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as d, EtcdCluster(3) as cluster:
        rows = takeovers(cluster, leases, sizes, repeats)
        n = args.sizing_engines or (16 if quick else SIZING_ENGINES)
        sized = sizing(cluster, Path(d), n,
                       2 if quick else SIZING_CYCLES,
                       0.1 if quick else 1.0,
                       1 if quick else 3, args.watchdog)
    out = {"quick": quick, "takeover": rows, "sizing": sized,
           "seconds": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print_takeovers(rows, repeats)
    print_sizing(sized)
    print(f"  ({out['seconds']:.0f} s; one etcd cluster on loopback, sharing the CPUs with "
          "the controllers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
