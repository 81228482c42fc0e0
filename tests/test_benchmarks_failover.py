"""Smoke runs of the control-store and failover benchmarks (``--quick --json``): they start
their own etcd, finish, and report what they measure. Numbers are printed by the
benchmarks, never asserted here (speed goals are theirs to report); only that a takeover
happened after the lease, and that the counts the sizing extrapolates from are the
fleet's (2 records per admission, one chain per member's update cycle).

etcd is required (as in test_etcd_store.py): a missing binary fails here, never skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rolloutcore.conformance.fixtures.etcd_server import EtcdError, etcd_binary

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(name: str) -> dict[str, Any]:
    try:
        etcd_binary()
    except EtcdError as e:
        pytest.fail(f"{e} (the etcd tests need a real etcd; `make install` installs it)")
    r = subprocess.run([sys.executable, str(BENCH / name), "--quick", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out: dict[str, Any] = json.loads(r.stdout)
    return out


@pytest.mark.deep
def test_control_store_benchmark_quick() -> None:
    out = _run("bench_control_store.py")
    rows = out["rows"]
    assert {(r["store"], r["writers"]) for r in rows} == {
        (s, w) for s in ("file", "etcd-1", "etcd-3") for w in (1, 4, 16, 64)}
    for r in rows:
        assert r["records_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
        if r["writers"] == 1:  # alone, every append is its own flush
            assert r["flushes_per_record"] == 1.0
        if r["store"] != "file":
            assert r["rate_vs_file"] > 0


@pytest.mark.deep
def test_failover_benchmark_quick() -> None:
    out = _run("bench_failover.py")
    (row,) = out["takeover"]
    assert row["lease_s"] == 1.0 and row["engines"] == 2
    # B cannot be elected before A's lease (restarted by its last refresh) has run out,
    # and A's own clock ends its term first.
    assert row["a_stood_down_s"] < row["elect_s"]
    assert row["elect_s"] > 0.9 * row["lease_s"] and row["first_action_s"] > 0
    s = out["sizing"]
    assert s["records_per_admission"] == 2.0
    assert s["lifecycle_records_per_engine_per_cycle"] > 5
    assert {(c["design"], c["period_s"]) for c in s["cases"]} == {
        (d, t) for d in ("all", "split") for t in (10.0, 60.0)}
