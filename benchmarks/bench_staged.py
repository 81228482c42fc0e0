"""Staged updates (issue 50): the closed window and the whole update, on a real vLLM CPU
server, in one run, on the same bytes (``models/large``, 55.6 MB; alternating with
``models/large_v2``):

A. vLLM's own unverified update: pause, vLLM's trainer-side weight transfer over gloo
   (``trainer_init`` + ``send_weights``, timed inside ``TransferAdapter.mutate``), resume.
   The window is pause + vLLM's own transfer + resume (RolloutCore's pre-checks inside
   mutate are subtracted).
B. Today's verified update, unstaged: the runner's cycle (drain, pause, ``rc_reload_weights``
   reading and digesting the checkpoint, cache resets verified, validation, probe, resume).
C. The verified update, staged: the same cycle, but the bytes are read and digested by a
   background thread of the worker while the engine serves; the window only installs.
D. A bare unverified staged install: staged as C, then pause, install, prefix-cache reset,
   resume (no verification): what the guarantees add to the window.
E. A delta: ``models/large`` with its two largest tensors changed (about 2% of the
   elements of a 55.6 MB model would be smaller; two whole tensors are what a delta of
   whole tensors carries), staged as a delta on the installed ``large``: bytes that
   travel against the full checkpoint's, the staging time against a full staging, and
   the staged identity against the full target's (a delta reads as the same weights).
F. Serving while staging: a steady greedy load (4 streams of 32 tokens), its tokens/s
   alone and while the same 55.6 MB stage back to back (staged, then discarded: a
   staging is about 0.1 s, too short to measure a rate over), for the same seconds each.

Goals (issue 50): C's window shorter than A's (the guarantees cost less than vLLM's own
unverified update); C <= 1.2x D; B >= 5x C (at 0.5-1 GB of weights: at 55.6 MB the
verification's fixed cost, about 0.1 s, is a large share of the window; the ratio is
printed for the size measured, and the size is stated).

Run: ``.venv/bin/python benchmarks/bench_staged.py [--repeat N] [--json FILE] [--model
large|huge]`` (builds ``models/large*`` or ``models/huge*``, about 0.5 GB, on first use;
about 2 minutes on the 2-core machine with ``large``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_UNDER_VLLM = 1.0
GOAL_OVER_BARE = 1.2
GOAL_UNSTAGED_OVER_STAGED = 5.0


def main(argv: list[str] | None = None) -> int:
    from rolloutcore.adapters.contract import PauseMode
    from rolloutcore.adapters.weight_transfer import CheckpointSource
    from rolloutcore.conformance.engines import checkpoint_target
    from rolloutcore.conformance.fixtures.tiny_model import (
        DEFAULT_OUT,
        build_models,
        changed_copy,
    )
    from rolloutcore.conformance.transfer_scenarios import GLOO, Session
    from rolloutcore.engine.controller import Controller
    from rolloutcore.engine.delta import write_delta
    from rolloutcore.engine.identity import checkpoint_identity, checkpoint_nbytes
    from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
    from rolloutcore.journal import Journal

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=4, help="updates per path (even)")
    ap.add_argument("--json", metavar="FILE", help="write the numbers to FILE")
    ap.add_argument("--model", choices=("large", "huge"), default="large",
                    help="large: 55.6 MB (default); huge: about 0.5 GB")
    args = ap.parse_args(argv)
    repeat = max(2, args.repeat + args.repeat % 2)
    base_name = args.model
    models = build_models(DEFAULT_OUT, large=base_name == "large", huge=base_name == "huge")
    nbytes = checkpoint_nbytes(models[base_name])
    versions = (f"{base_name}_v2", base_name)
    res: dict[str, Any] = {"nbytes": nbytes, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="rc-bench-staged-") as tmp:
        s = Session(GLOO, models, base_name, Path(tmp))
        try:
            s.start()
            assert s.adapter is not None and s.http is not None
            held = {str(models[v].resolve()): CheckpointSource(models[v].resolve(),
                                                               preload=True)
                    for v in versions}
            for src in held.values():
                _ = src.provenance
            s.source_override = lambda t: held[t.source]
            http = s.http

            def dl() -> float:
                return time.monotonic() + 60.0

            # A: vLLM's own update into a paused engine.
            window_a, own_a = [], []
            gen = 2
            for i in range(repeat):
                target = s.target(versions[i % 2], gen)
                gen += 1
                t0 = time.perf_counter()
                http.pause(PauseMode.WAIT, dl())
                m0 = time.perf_counter()
                ev = s.adapter.mutate(target, dl())
                mutate_s = time.perf_counter() - m0
                http.resume(dl())
                total = time.perf_counter() - t0
                if ev.outcome.value != "completed":
                    raise RuntimeError(f"vLLM's own transfer {i}: {ev}")
                p = s.adapter.last_timings
                own = p.get("init_s", 0.0) + p.get("send_s", 0.0)
                window_a.append(total)
                own_a.append(total - mutate_s + own)
            label = target.label  # the engine now holds models/large under this label

            # B and C, interleaved: one runner, staged or not per update.
            policy = RunnerPolicy(step_timeout_s=60.0, retries=1, drain_timeout_s=60.0)
            runner = LifecycleRunner(Controller(trace=Journal(Path(tmp) / "bc.jsonl",
                                                              fsync=False)), http, policy)
            boot = runner.bootstrap(checkpoint_target(models[base_name], 1, label))
            if boot.trigger != "bootstrap_ok":
                raise RuntimeError(f"bootstrap: {boot.reason}")
            rows: dict[str, list[dict[str, float]]] = {"unstaged": [], "staged": []}
            g = 2
            for i in range(2 * repeat):
                kind = ("unstaged", "staged")[i % 2]
                runner.policy = dataclasses.replace(policy, staged=kind == "staged")
                target = checkpoint_target(models[versions[(i // 1) % 2]], g, f"bc-{g}")
                rep = runner.update(target)
                if not rep.published or rep.staged != (kind == "staged"):
                    raise RuntimeError(f"{kind} update {g}: {rep.steps}")
                g += 1
                rows[kind].append({"window_s": rep.window_s, "total_s": rep.total_s,
                                   "staging_s": rep.staging_s,
                                   "mutate_s": rep.timings().get("mutate", 0.0)})

            # D: a bare staged install (no verification).
            window_d = []
            for i in range(repeat):
                target = checkpoint_target(models[versions[(i + g) % 2]], g, f"bare-{g}")
                g += 1
                st = http.stage(target, dl())
                if not all(x.identity == target.identity for x in st.stages):
                    raise RuntimeError(f"bare staging {i}: {st}")
                t0 = time.perf_counter()
                http.pause(PauseMode.WAIT, dl())
                ev = http.install(target, dl())
                http.reset_cache("prefix", dl())
                http.resume(dl())
                window_d.append(time.perf_counter() - t0)
                if ev.outcome.value != "completed":
                    raise RuntimeError(f"bare install {i}: {ev}")
            # E: a delta of two tensors, staged on the installed large.
            base = checkpoint_target(models[base_name], g, f"base-{g}")
            g += 1
            full_stage = http.stage(base, dl())
            t0 = time.perf_counter()
            http.pause(PauseMode.WAIT, dl())
            http.install(base, dl())
            http.resume(dl())
            changed = changed_copy(models[base_name], Path(tmp) / "changed")
            info = write_delta(models[base_name], changed, Path(tmp) / "delta")
            delta_target = checkpoint_target(Path(tmp) / "delta", g, f"delta-{g}")
            delta_stage = http.stage(delta_target, dl())
            res["delta"] = {
                "changed_tensors": info.changed, "tensors": info.tensors,
                "delta_bytes": info.nbytes, "full_bytes": nbytes,
                "full_staging_s": full_stage.seconds, "delta_staging_s": delta_stage.seconds,
                "identity_is_full_targets": all(
                    x.identity == checkpoint_identity(changed) for x in delta_stage.stages)}
            http.discard_stage(dl())

            # F: tokens/s kept while staging.
            res["serving"] = _serving_kept(s.srv.url, s.srv.served_model_name,
                                           lambda: http.stage(base, dl()),
                                           lambda: http.discard_stage(dl()))
        finally:
            s.stop()

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    a, a_own = med(window_a), med(own_a)
    b = med([r["window_s"] for r in rows["unstaged"]])
    c = med([r["window_s"] for r in rows["staged"]])
    d = med(window_d)
    res.update(window_vllm_own_s=a_own, window_vllm_transfer_s=a, window_unstaged_s=b,
               window_staged_s=c, window_bare_staged_s=d, rows=rows,
               ratio_staged_over_vllm_own=c / a_own, ratio_staged_over_bare=c / d,
               ratio_unstaged_over_staged=b / c)
    mb = nbytes / 1e6

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print(f"closed window per update, {mb:.1f} MB of weights, median of {repeat}:")
    print(f"  A vLLM's own unverified transfer (pause + trainer_init/send_weights + resume): "
          f"{a_own * 1e3:.0f} ms (with RolloutCore's pre-checks {a * 1e3:.0f} ms)")
    print(f"  B verified, unstaged (today):   {b * 1e3:.0f} ms   (update "
          f"{med([r['total_s'] for r in rows['unstaged']]) * 1e3:.0f} ms)")
    print(f"  C verified, staged:             {c * 1e3:.0f} ms   (update "
          f"{med([r['total_s'] for r in rows['staged']]) * 1e3:.0f} ms, staging while "
          f"serving {med([r['staging_s'] for r in rows['staged']]) * 1e3:.0f} ms)")
    print(f"  D bare staged install:          {d * 1e3:.0f} ms")
    print(f"C / A = {c / a_own:.2f}x (goal < {GOAL_UNDER_VLLM}: "
          f"{verdict(c / a_own < GOAL_UNDER_VLLM)})")
    print(f"C / D = {c / d:.2f}x (goal <= {GOAL_OVER_BARE}: {verdict(c / d <= GOAL_OVER_BARE)})")
    print(f"B / C = {b / c:.2f}x (goal >= {GOAL_UNSTAGED_OVER_STAGED} at 0.5-1 GB; this run "
          f"{mb:.1f} MB: {verdict(b / c >= GOAL_UNSTAGED_OVER_STAGED)})")
    dd = res["delta"]
    print(f"E delta of {dd['changed_tensors']} of {dd['tensors']} tensors: "
          f"{dd['delta_bytes'] / 1e6:.1f} MB travel instead of {dd['full_bytes'] / 1e6:.1f} MB "
          f"({dd['full_bytes'] / dd['delta_bytes']:.1f}x fewer bytes); staging "
          f"{dd['delta_staging_s'] * 1e3:.0f} ms vs {dd['full_staging_s'] * 1e3:.0f} ms in full; "
          f"the staged identity is the full target's: {dd['identity_is_full_targets']}")
    sv = res["serving"]
    print(f"F serving while staging: {sv['alone_tps']:.0f} tokens/s alone, "
          f"{sv['staging_tps']:.0f} while {sv['stagings']} stagings ran back to back "
          f"({sv['seconds']:.1f} s each): {sv['kept']:.2f}x kept")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
    return 0


def _serving_kept(url: str, model: str, stage: Any, discard: Any,
                  seconds: float = 4.0, streams: int = 4) -> dict[str, Any]:
    """Tokens/s of a steady load alone, then while ``stage``/``discard`` run back to back
    for the same time; each phase counts the tokens of requests completed inside it."""
    import threading

    import httpx

    body = {"model": model, "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 32,
            "min_tokens": 32, "temperature": 0}
    done: list[tuple[float, int]] = []  # (end time, tokens)
    stop = threading.Event()

    def stream() -> None:
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                r = c.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                done.append((time.perf_counter(), r.json()["usage"]["completion_tokens"]))

    workers = [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    for w in workers:
        w.start()
    time.sleep(1.0)  # warm: every stream has a request in flight

    def rate(t0: float, t1: float) -> float:
        return sum(n for t, n in done if t0 <= t < t1) / (t1 - t0)

    t0 = time.perf_counter()
    time.sleep(seconds)
    t1 = time.perf_counter()
    stagings = 0
    while time.perf_counter() < t1 + seconds:
        stage()
        discard()
        stagings += 1
    t2 = time.perf_counter()
    stop.set()
    for w in workers:
        w.join(60)
    alone, staging = rate(t0, t1), rate(t1, t2)
    return {"alone_tps": alone, "staging_tps": staging, "kept": staging / alone,
            "stagings": stagings, "seconds": seconds, "streams": streams}


if __name__ == "__main__":
    sys.exit(main())
