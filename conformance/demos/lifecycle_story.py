"""``rolloutcore demo``: live weight updates of a real vLLM CPU server, end to end.

Builds the tiny models, starts vLLM (dev mode, with the RolloutCore worker extension),
adopts it as generation 1, runs rollouts, and performs two live updates (v1 -> v2 ->
v1neg) each requested while a 256-token rollout is in flight. It prints the lifecycle
as it goes (phases, drain wait, per-step timings), every rollout's binding (rollout ->
generation -> label -> identity) and whether its tokens equal the greedy reference of
the checkpoint it was bound to, then verifies the journal (hash chain and trace check)
and stops the server. Exit 0 only if every check passed.

v1neg has the same manifest (names, dtypes, shapes) as v1 and different content: the
content identity, not the manifest or the label, is what tells them apart.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ARTIFACTS = REPO_ROOT / "artifacts"
ROLLOUT_PROBES = ("short", "medium", "long", "numbers")  # 16-token probes of each version


@dataclass
class DemoCheck:
    description: str
    ok: bool
    observed: Any = None


@dataclass
class RolloutRecord:
    rollout_id: str
    generation: int
    label: str
    identity: str
    prompt: str
    tokens: int
    matches_reference: bool
    seconds: float


@dataclass
class Demo:
    """State and output of one demo run."""

    out: TextIO
    artifacts: Path
    checks: list[DemoCheck] = field(default_factory=list)
    rollouts: list[RolloutRecord] = field(default_factory=list)
    cycles: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, text: str = "") -> None:
        with self._lock:
            print(text, file=self.out, flush=True)

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.checks.append(DemoCheck(description, bool(ok), observed))
        self.say(f"  [{'ok' if ok else 'FAIL'}] {description}"
                 + ("" if observed is None else f": {observed}"))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "checks": [{"description": c.description, "ok": c.ok, "observed": c.observed}
                       for c in self.checks],
            "rollouts": [vars(r) for r in self.rollouts],
            "cycles": self.cycles,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
            **self.info,
        }


def _refs(path: Path) -> dict[str, dict[str, Any]]:
    from rolloutcore.engine.targets import load_references

    return {p["name"]: p for p in load_references(path)["probes"]}


def run_demo(out: TextIO = sys.stdout, artifacts: Path | None = None) -> Demo:
    from rolloutcore.adapters.http import SERVER_ARGS, HttpAdapter
    from rolloutcore.check.trace import check_file
    from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
    from rolloutcore.conformance.fixtures.vllm_server import VllmServer
    from rolloutcore.journal import open_controller, verify_chain

    run_dir = (artifacts or DEFAULT_ARTIFACTS) / time.strftime("demo-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    demo = Demo(out, run_dir)
    journal_path = run_dir / "journal.jsonl"
    demo.info.update(journal=str(journal_path), artifacts=str(run_dir))
    t_all = time.perf_counter()

    demo.say("== 1. tiny models (built offline, idempotent)")
    t0 = time.perf_counter()
    models = build_models(DEFAULT_OUT)
    demo.timings["build_models"] = time.perf_counter() - t0
    versions = ("v1", "v2", "v1neg")
    refs = {v: _refs(models[v]) for v in versions}
    labels = {"v1": INITIAL_LABEL, "v2": "v2-gen2", "v1neg": "v1neg-gen3"}
    targets = {v: checkpoint_target(models[v], g, labels[v]) for g, v in
               enumerate(versions, start=1)}
    for v in versions:
        demo.say(f"  {v:6s} {models[v]}  identity {targets[v].identity[:16]}  "
                 f"{targets[v].nbytes} bytes")
    demo.say(f"  built or reused in {demo.timings['build_models']:.1f} s")

    demo.say("\n== 2. vLLM CPU server (dev mode, RolloutCore worker extension)")
    srv = VllmServer(models["v1"].resolve(), extra_args=list(SERVER_ARGS),
                     log_path=run_dir / "vllm.log")
    t0 = time.perf_counter()
    srv.start()
    demo.timings["server_startup"] = time.perf_counter() - t0
    pid = srv.pid
    demo.info.update(server_pid=pid, server_url=srv.url, server_log=str(srv.log_path))
    demo.say(f"  healthy after {demo.timings['server_startup']:.1f} s: {srv.url} pid {pid} "
             f"log {srv.log_path}")
    adapter = HttpAdapter(srv.url, model=srv.served_model_name)
    try:
        controller, journal, _rec = open_controller(journal_path)

        def on_step(step: str, outcome: str, seconds: float) -> None:
            demo.say(f"    {step:<16} -> {outcome:<18} {seconds * 1000:8.1f} ms   "
                     f"phase {controller.phase.value}")

        runner = LifecycleRunner(controller, adapter, RunnerPolicy(
            step_timeout_s=60.0, drain_timeout_s=120.0), on_step=on_step)
        try:
            _run(demo, runner, targets, refs, adapter)
        finally:
            journal.close()
        demo.check("the same server process served throughout (no restart)",
                   srv.is_running() and srv.pid == pid, pid)
    finally:
        adapter.close()
        t0 = time.perf_counter()
        rc = srv.stop()
        demo.timings["server_stop"] = time.perf_counter() - t0
        demo.say(f"\n  server stopped (exit {rc}) in {demo.timings['server_stop']:.1f} s")

    demo.say("\n== 6. journal verification")
    chain = verify_chain(journal_path)
    demo.check("journal hash chain intact", chain.ok,
               f"{chain.records} records, last seq {chain.last_seq}")
    verdict = check_file(journal_path)
    demo.check("journal accepted by the trace checker (spec + history properties)",
               verdict.accepted, verdict.message)
    demo.info["trace"] = verdict.as_json()
    demo.timings["total"] = time.perf_counter() - t_all
    demo.say(f"\n  journal: {journal_path}")
    demo.say(f"  {sum(c.ok for c in demo.checks)}/{len(demo.checks)} checks passed in "
             f"{demo.timings['total']:.1f} s: {'PASS' if demo.passed else 'FAIL'}")
    return demo


def _run(demo: Demo, runner: LifecycleRunner, targets: dict[str, Any],
         refs: dict[str, dict[str, dict[str, Any]]], adapter: Any) -> None:
    from rolloutcore.spec.lifecycle import Phase

    versions = list(targets)
    by_gen = {t.generation: v for v, t in targets.items()}
    demo.say("\n== 3. bootstrap: adopt the running engine as generation 1")
    t0 = time.perf_counter()
    outcome = runner.bootstrap(targets["v1"])
    demo.timings["bootstrap"] = time.perf_counter() - t0
    demo.check("bootstrap: label, identity and greedy probe verified",
               outcome.trigger == "bootstrap_ok", outcome.reason)
    if outcome.trigger != "bootstrap_ok":
        return

    def rollout(rid: str, probe: str) -> None:
        t0 = time.perf_counter()
        binding, res = None, None
        try:
            entry = refs["v1"][probe]  # every version has the same probe prompts
            binding, res = runner.generate(rid, tuple(entry["prompt_token_ids"]),
                                           int(entry["max_tokens"]))
        except Exception as e:
            demo.check(f"rollout {rid} completed", False, f"{type(e).__name__}: {e}")
            return
        bound_version = by_gen[binding.generation]
        ref = refs[bound_version][probe]["output_token_ids"]
        rec = RolloutRecord(rid, binding.generation, targets[bound_version].label,
                            (binding.identity or "")[:16], probe, len(res.tokens),
                            list(res.tokens) == ref, time.perf_counter() - t0)
        with demo._lock:
            demo.rollouts.append(rec)

    def batch(tag: str) -> None:
        threads = [threading.Thread(target=rollout, args=(f"{tag}-{p}", p)) for p in
                   ROLLOUT_PROBES]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        demo.say(f"  {len(threads)} concurrent rollouts on generation "
                 f"{runner.controller.control.committed} in {time.perf_counter() - t0:.2f} s")

    def live_update(version: str) -> CycleReport:
        target = targets[version]
        rid = f"live-before-gen{target.generation}"
        th = threading.Thread(target=rollout, args=(rid, "short_rollout256"))
        th.start()
        deadline = time.monotonic() + 60.0
        while (runner.controller.bound_count() == 0 or not (adapter.running_requests() or 0)) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        demo.say(f"  update to {target.label} (generation {target.generation}) requested while "
                 f"{rid} (256 tokens) is in flight; admissions close, drain starts")
        report = runner.update(target)
        th.join()
        demo.cycles.append(_cycle_json(report))
        _print_cycle(demo, report)
        rec = next((r for r in demo.rollouts if r.rollout_id == rid), None)
        demo.check(f"{rid} was bound to generation {target.generation - 1} and its 256 tokens "
                   "equal that generation's reference",
                   rec is not None and rec.generation == target.generation - 1
                   and rec.matches_reference, None if rec is None else
                   {"generation": rec.generation, "matches": rec.matches_reference})
        demo.check(f"update to {target.label} published (drain held "
                   f"{report.drain_wait_s * 1000:.0f} ms for the in-flight rollout)",
                   report.published and report.final_phase is Phase.READY,
                   report.final_phase.value)
        return report

    demo.say("\n== 4. rollouts on generation 1")
    batch("gen1")
    for i, version in enumerate(versions[1:], start=1):
        demo.say(f"\n== 5.{i} live update {by_gen[i]} -> {version}")
        report = live_update(version)
        if not report.published:
            return
        batch(f"gen{targets[version].generation}")

    demo.say("\n== trajectory bindings (rollout -> generation -> label -> identity)")
    demo.say(f"  {'rollout':<24} {'gen':>3}  {'label':<12} {'identity':<16}  "
             f"{'prompt':<17} {'tokens':>6}  reference")
    for r in sorted(demo.rollouts, key=lambda r: (r.generation, r.rollout_id)):
        demo.say(f"  {r.rollout_id:<24} {r.generation:>3}  {r.label:<12} {r.identity:<16}  "
                 f"{r.prompt:<17} {r.tokens:>6}  {'equal' if r.matches_reference else 'DIFFERS'}")
    demo.check("every rollout's tokens equal the reference of the generation it was bound to",
               bool(demo.rollouts) and all(r.matches_reference for r in demo.rollouts),
               f"{sum(r.matches_reference for r in demo.rollouts)}/{len(demo.rollouts)}")
    demo.check("every identity a rollout was bound to is its generation's checkpoint digest",
               all(r.identity == targets[by_gen[r.generation]].identity[:16]
                   for r in demo.rollouts), None)


def _cycle_json(report: CycleReport) -> dict[str, Any]:
    from rolloutcore.conformance.harness import cycle_json

    return cycle_json(report)


def _print_cycle(demo: Demo, report: CycleReport) -> None:
    other = report.total_s - report.drain_wait_s - report.timings().get("mutate", 0.0)
    demo.say(f"  cycle total {report.total_s * 1000:.0f} ms = drain wait "
             f"{report.drain_wait_s * 1000:.0f} ms + mutation "
             f"{report.timings().get('mutate', 0.0) * 1000:.0f} ms + control plane "
             f"{other * 1000:.0f} ms")


def main(as_json: bool = False, artifacts: Path | None = None) -> int:
    stream = sys.stderr if as_json else sys.stdout
    try:
        demo = run_demo(stream, artifacts)
    except Exception as e:
        if as_json:
            print(json.dumps({"passed": False, "error": f"{type(e).__name__}: {e}"}, indent=2))
        print(f"demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(demo.as_json(), indent=2, sort_keys=True, default=str))
    return 0 if demo.passed else 1
