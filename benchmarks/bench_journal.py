"""Journal and trace-checker benchmarks.

* journal append rate, with fsync and without, in the same run (the controller's step
  is durable before it returns only with fsync);
* the trace checker (``check_file``: hash chain + spec + evidence, streaming) on a
  10,000- and a 100,000-record journal with 10 rollouts bound: the per-record cost should
  not grow (linear time). Journals and measurement are bench_trace_check.py's (same
  builder, a fresh process per check, the fastest of 3), so the figures agree; the chain
  alone (``verify_chain``) is timed the same way to split chain from checks. For the
  scaling in bound rollouts (K up to 1,000) and memory, run bench_trace_check.py.

Run: ``.venv/bin/python benchmarks/bench_journal.py [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_trace_check import build_journal, measure

from rolloutcore.engine.controller import TraceRecord
from rolloutcore.journal import Journal
from rolloutcore.spec.lifecycle import NO_OP, Phase

K = 10  # rollouts bound at once (bench_trace_check's smallest K)


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


def checker_time(path: Path, records: int, repeat: int = 3) -> dict[str, float]:
    """Chain alone and the whole check, each the fastest of ``repeat`` fresh processes."""
    built = build_journal(path, K, records)
    chain = min(float(measure(path, "chain")["seconds"]) for _ in range(repeat))
    runs = [measure(path) for _ in range(repeat)]
    for r in runs:
        assert r["accepted"], r["message"]  # a rejected journal invalidates the timing
    best = min(runs, key=lambda r: float(r["seconds"]))
    return {"records": built["records"], "chain_s": chain,
            "check_s": best["seconds"] - chain, "total_s": best["seconds"],
            "states_max": best["states_max"], "peak_rss_mb": best["peak_rss_mb"]}


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
    print(f"trace checker (check_file: hash chain + spec states + evidence; {K} rollouts "
          "bound; bench_trace_check.py for K up to 1,000)")
    for r in (small, large):
        print(f"  {r['records']:>7,.0f} records: chain {r['chain_s']:.2f} s + check "
              f"{r['check_s']:.2f} s = {r['total_s']:.2f} s "
              f"({r['total_s'] / r['records'] * 1e6:.1f} us/record, at most "
              f"{r['states_max']:.0f} spec states, peak RSS {r['peak_rss_mb']:.0f} MB)")
    print(f"  per-record cost, large / small: {out['per_record_ratio_large_to_small']:.2f} "
          "(1.0 = linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
