"""Journal and trace-checker benchmarks.

* journal append rate, with fsync and without, in the same run (the controller's step
  is durable before it returns only with fsync);
* the trace checker (hash chain + spec + history checks) on a 10,000- and a
  100,000-record journal: the per-record cost should not grow (linear time).

Run: ``.venv/bin/python benchmarks/bench_journal.py [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.make_traces import write_long_trace
from rolloutcore.controller import TraceRecord
from rolloutcore.journal import Journal, read_journal
from rolloutcore.spec.lifecycle import NO_OP, Phase
from rolloutcore.trace_check import check_trace


def append_rate(path: Path, records: int, *, fsync: bool, detail: bool = False) -> float:
    """Records per second appended through the sink (admit/release records)."""
    d = {"tokens_in": 512, "engine": "vllm-0", "Authorization": "Bearer x"} if detail else None
    recs = [TraceRecord(i + 1, "admit" if i % 2 == 0 else "release", f"r{i // 2}",
                        Phase.READY, 1, 0, NO_OP, d) for i in range(records)]
    with Journal(path, fsync=fsync) as j:
        t0 = time.perf_counter()
        for r in recs:
            j(r)
        seconds = time.perf_counter() - t0
    return records / seconds


def checker_time(path: Path, records: int) -> dict[str, float]:
    write_long_trace(path, records, seed=7)
    t0 = time.perf_counter()
    report, recs = read_journal(path)
    t1 = time.perf_counter()
    verdict = check_trace(recs)
    t2 = time.perf_counter()
    assert report.ok and verdict.accepted, verdict.message
    return {"records": len(recs) - 1, "chain_s": t1 - t0, "check_s": t2 - t1,
            "total_s": t2 - t0, "states_max": verdict.states_max}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller runs (CI smoke test)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        out["append_no_fsync_per_s"] = append_rate(d / "a.jsonl", 50_000 // scale, fsync=False)
        out["append_no_fsync_detail_per_s"] = append_rate(
            d / "b.jsonl", 50_000 // scale, fsync=False, detail=True)
        out["append_fsync_per_s"] = append_rate(d / "c.jsonl", 2_000 // scale, fsync=True)
        small = checker_time(d / "s.jsonl", 10_000 // scale)
        large = checker_time(d / "l.jsonl", 100_000 // scale)
    out["checker_small"], out["checker_large"] = small, large
    per_small = small["total_s"] / small["records"]
    per_large = large["total_s"] / large["records"]
    out["per_record_ratio_large_to_small"] = per_large / per_small
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    nf, nd, fs = (out["append_no_fsync_per_s"], out["append_no_fsync_detail_per_s"],
                  out["append_fsync_per_s"])
    print("journal append (through the trace sink)")
    print(f"  without fsync          {nf:10,.0f} records/s")
    print(f"  without fsync + detail {nd:10,.0f} records/s")
    print(f"  with fsync             {fs:10,.0f} records/s  ({nf / fs:,.0f}x slower: one "
          "fsync per step)")
    print("trace checker (hash chain + spec states + history)")
    for r in (small, large):
        print(f"  {r['records']:>7,.0f} records: chain {r['chain_s']:.2f} s + check "
              f"{r['check_s']:.2f} s = {r['total_s']:.2f} s "
              f"({r['total_s'] / r['records'] * 1e6:.1f} us/record, at most "
              f"{r['states_max']:.0f} spec states)")
    print(f"  per-record cost, large / small: {out['per_record_ratio_large_to_small']:.2f} "
          "(1.0 = linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
