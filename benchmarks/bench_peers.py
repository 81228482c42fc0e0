"""Trainer egress per update at three real vLLM CPU servers (issue 50): the bytes that
leave the trainer's checkpoint for one staged fleet update, with and without a delta and
with and without peer sources, in one run on the same bytes (``models/large``, 55.6 MB,
alternating with a copy whose two largest tensors changed: ``changed_copy``, the lowest
mantissa bit of every element, so a delta of whole tensors carries those two).

Each update is staged (every member stages while it serves, then installs in the closed
window). Without peer sources every member reads the trainer's checkpoint (full or
delta); with them one member does and the other two stage from its verified staging
(``rc_peer_serve``: bytes from one engine to another, digested as they arrive). Counted
from each member's staging evidence: bytes from the trainer, bytes from a peer. Also per
row: the whole update's time and the slowest member's closed window (a peer adds a
staging in series; the window is unchanged).

Goal (issue 50): one delta's worth of bytes from the trainer per update at 3 members.

Run: ``.venv/bin/python benchmarks/bench_peers.py [--repeat N] [--json FILE]`` (three
server starts, about a minute, then a few seconds per update).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

MEMBERS = 3


def main(argv: list[str] | None = None) -> int:
    from rolloutcore.adapters.http import HttpAdapter
    from rolloutcore.adapters.vllm_worker import SERVER_ARGS
    from rolloutcore.check.fleet_trace import check_fleet_file
    from rolloutcore.conformance.engines import checkpoint_target
    from rolloutcore.conformance.fixtures.tiny_model import (
        DEFAULT_OUT,
        build_models,
        changed_copy,
    )
    from rolloutcore.conformance.fixtures.vllm_server import VllmServer
    from rolloutcore.engine.delta import write_delta
    from rolloutcore.engine.identity import checkpoint_nbytes
    from rolloutcore.engine.runner import RunnerPolicy
    from rolloutcore.fleet import Fleet

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="updates per row")
    ap.add_argument("--json", metavar="FILE", help="write the numbers to FILE")
    args = ap.parse_args(argv)
    models = build_models(DEFAULT_OUT, large=True)
    full = checkpoint_nbytes(models["large"])
    with tempfile.TemporaryDirectory(prefix="rc-bench-peers-") as tmp:
        root = Path(tmp)
        versions = {"a": models["large"], "b": changed_copy(models["large"], root / "b")}
        # A delta of whole tensors each way (the two tensors that differ).
        deltas = {"a": write_delta(versions["b"], versions["a"], root / "da"),
                  "b": write_delta(versions["a"], versions["b"], root / "db")}
        servers = [VllmServer(Path(models["large"]).resolve(), extra_args=SERVER_ARGS,
                              log_path=root / f"vllm-{i}.log") for i in range(MEMBERS)]
        starts = [threading.Thread(target=s.start) for s in servers]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        adapters = [HttpAdapter(s.url) for s in servers]
        policy = RunnerPolicy(step_timeout_s=60.0, retries=1, drain_timeout_s=60.0,
                              staged=True)
        fleet = Fleet([(f"e{i}", a, s.url) for i, (a, s) in enumerate(
            zip(adapters, servers, strict=True))], journal=root / "f.jsonl", policy=policy,
            fsync=False, peer_sources=True)
        rows: dict[str, list[dict[str, float]]] = {}
        try:
            fleet.bootstrap(checkpoint_target(models["large"], 1, "default"))
            version, gen = "a", 2
            # A first full update without peers: every member holds a staged base after.
            plan = [("full", False, False)] + [
                (name, delta, peers) for _ in range(args.repeat) for name, delta, peers in (
                    ("full", False, False), ("delta", True, False),
                    ("full + peers", False, True), ("delta + peers", True, True))]
            for k, (name, delta, peers) in enumerate(plan):
                version = "b" if version == "a" else "a"
                src = root / f"d{version}" if delta else versions[version]
                target = checkpoint_target(src, gen, f"g{gen}")
                fleet.peer_sources = peers  # the token was handed out at construction
                rep = fleet.update(target)
                if not rep.published or len(rep.committed_on) != MEMBERS:
                    raise RuntimeError(f"{name} update {gen}: {rep.as_json()}")
                gen += 1
                if k == 0:
                    continue  # the warm-up that gives every member a staged base
                trainer = sum(r.staged_bytes for r in rep.members.values() if r.peer is None)
                peer = sum(r.staged_bytes for r in rep.members.values() if r.peer)
                window = max(r.window_s for r in rep.members.values())
                rows.setdefault(name, []).append({"trainer_bytes": trainer,
                                                  "peer_bytes": peer,
                                                  "update_s": rep.total_s,
                                                  "window_s": window})
            verdict = check_fleet_file(root / "f.jsonl")
            if not verdict.accepted:
                raise RuntimeError(f"the fleet journal: {verdict.message}")
        finally:
            fleet.close()
            for a in adapters:
                a.close()
            for s in servers:
                s.stop()
    delta_bytes = max(d.nbytes for d in deltas.values())
    res: dict[str, Any] = {"members": MEMBERS, "full_bytes": full, "delta_bytes": {
        k: d.nbytes for k, d in deltas.items()}, "rows": {}}
    print(f"{MEMBERS} members, {full / 1e6:.1f} MB of weights, a delta of "
          f"{delta_bytes / 1e6:.1f} MB ({delta_bytes / full:.1%}); medians over "
          f"{args.repeat} update(s) per row")
    print(f"{'row':<15}{'trainer MB':>11}{'x one full':>11}{'x one delta':>12}{'peer MB':>9}"
          f"{'update s':>9}{'window s':>9}")
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        res["rows"][name] = med
        print(f"{name:<15}{med['trainer_bytes'] / 1e6:>11.1f}"
              f"{med['trainer_bytes'] / full:>11.2f}"
              f"{med['trainer_bytes'] / delta_bytes:>12.2f}{med['peer_bytes'] / 1e6:>9.1f}"
              f"{med['update_s']:>9.2f}{med['window_s']:>9.3f}")
    best = res["rows"]["delta + peers"]["trainer_bytes"]
    print(f"goal: one delta's worth from the trainer per update: {best / delta_bytes:.2f}x "
          f"one delta ({'met' if best <= delta_bytes else 'not met'})")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
