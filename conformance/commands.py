"""``rolloutcore conformance ...``: the command-line glue over the harness."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.engines import HarnessEngine, SimHarnessEngine, VllmHarnessEngine
from rolloutcore.conformance.harness import (
    EngineFactory,
    ScenarioResult,
    compare,
    run_corpus,
    sim_factory,
    vllm_factory,
)
from rolloutcore.conformance.remote import ExistingServer, PreflightError, preflight


class Remote:
    """``--url`` and friends: a server someone else operates, and the checkpoints it may
    load (paths it and this machine both read)."""

    def __init__(self, url: str, model: str, token: str | None,
                 checkpoints: dict[str, Path]) -> None:
        self.server = ExistingServer(url, model, token)
        self.checkpoints = checkpoints
        self.token = token

    def passes_preflight(self) -> bool:
        """Check the server before touching it; say in one line what it lacks."""
        import sys

        try:
            preflight(self.server, self.checkpoints)
        except PreflightError as e:
            print(f"error: preflight: {e}", file=sys.stderr)
            return False
        return True

    def factory(self, out: Path) -> EngineFactory:
        return lambda: VllmHarnessEngine.attach(self.server, self.checkpoints, out / "remote",
                                                token=self.token)


def artifacts_dir() -> Path:
    """Where runs write journals and logs: $ROLLOUTCORE_ARTIFACTS or the repo's
    git-ignored ``artifacts/``."""
    env = os.environ.get("ROLLOUTCORE_ARTIFACTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "artifacts"


def cli_run(engine: str, names: list[str] | None, *, as_json: bool,
            out_dir: Path | None = None, remote: Remote | None = None,
            safe: bool = False) -> int:
    """``rolloutcore conformance run``: exit 0 only if every scenario passed on every
    engine run and (with both) no verdict differs between them."""
    import importlib.util
    import sys

    from rolloutcore.conformance.scenarios import SCENARIOS

    stream = sys.stderr if as_json else sys.stdout
    unknown = [n for n in names or [] if n not in SCENARIOS]
    if unknown:
        print(f"error: unknown scenario(s) {', '.join(unknown)}; known: "
              f"{', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    kinds = ["sim", "vllm"] if engine == "both" else [engine]
    if remote is None and "vllm" in kinds and importlib.util.find_spec("vllm") is None:
        print("error: vllm is not installed (pip install -e '.[vllm]')", file=sys.stderr)
        return 2
    if safe:
        names = [n for n in (names or list(SCENARIOS)) if not SCENARIOS[n].destructive]
        print(f"--safe: leaving out {', '.join(n for n in SCENARIOS if n not in names)} "
              "(they kill the engine or load a broken checkpoint)", file=stream)
    out = out_dir or artifacts_dir() / time.strftime("conformance-%Y%m%d-%H%M%S")
    if remote is not None and not remote.passes_preflight():
        return 3

    def printer(text: str) -> None:
        print(text, file=stream, flush=True)

    results: dict[str, list[ScenarioResult]] = {}
    for kind in kinds:
        factory = (sim_factory() if kind == "sim" else remote.factory(out)
                   if remote is not None else vllm_factory(out))
        results[kind] = run_corpus(factory, out, names, printer=printer)
    discrepancies = compare(results["sim"], results["vllm"]) if len(kinds) == 2 else []
    passed = all(r.passed for rs in results.values() for r in rs) and not discrepancies
    if as_json:
        print(json.dumps({"passed": passed, "out_dir": str(out),
                          "engines": {k: [r.as_json() for r in rs] for k, rs in results.items()},
                          "discrepancies": [d.as_json() for d in discrepancies]},
                         indent=2, sort_keys=True, default=str))
        return 0 if passed else 1
    order = list(dict.fromkeys(r.name for rs in results.values() for r in rs))
    printer("")
    printer(f"{'scenario':<18}" + "".join(f" {k:>14}" for k in kinds) + "   journal trace check")
    for name in order:
        row = f"{name:<18}"
        traces = []
        for k in kinds:
            r = next((x for x in results[k] if x.name == name), None)
            row += f" {('PASS' if r.passed else 'FAIL') + f' {r.seconds:6.1f}s':>14}" if r \
                else f" {'-':>14}"
            if r is not None and r.trace is not None:
                traces.append(f"{k}: {'accepted' if r.trace.get('accepted') else 'REJECTED'}")
        printer(row + "   " + ", ".join(traces))
        for k in kinds:
            for r in results[k]:
                if r.name == name:
                    for f in r.failures():
                        printer(f"    [{k}] {f}")
    for d in discrepancies:
        printer(f"DISCREPANCY {d.scenario}: {d.what}: sim={d.sim!r} vllm={d.vllm!r}")
    printer(f"journals under {out}")
    printer("PASS" if passed else "FAIL")
    return 0 if passed else 1


def _table(report: Any, printer: Any) -> None:
    from rolloutcore.conformance.tour import class_name

    realised = report.realised
    printer("")
    printer(f"{'edge class (action@source phase)':<44} {report.engine}")
    for c in report.classes:
        verdict = ("realised" if c in realised else
                   f"not realisable: {report.unrealisable[c]}" if c in report.unrealisable
                   else "NOT REALISED")
        printer(f"{class_name(c):<44} {verdict}")


def cli_tour(engine: str, *, as_json: bool, walks: int, seed: int, safe: bool,
             walk: str | None = None, remote: Remote | None = None,
             out_dir: Path | None = None) -> int:
    """``rolloutcore conformance tour``: exit 0 only if every schedule (and walk) passed
    and every edge class the engine can realise was realised."""
    import importlib.util
    import sys

    from rolloutcore.conformance import tour as t

    stream = sys.stderr if as_json else sys.stdout

    def printer(text: str) -> None:
        print(text, file=stream, flush=True)

    choices: list[int] | None = None
    if walk is not None:
        try:
            choices = [int(x) for x in walk.split(",") if x.strip()]
        except ValueError:
            print(f"error: --walk takes comma-separated integers, got {walk!r}",
                  file=sys.stderr)
            return 2
        if not choices or min(choices) < 0:
            print("error: --walk needs at least one non-negative integer", file=sys.stderr)
            return 2
    if walks < 0:
        print("error: --walks must be >= 0", file=sys.stderr)
        return 2
    if engine == "vllm" and remote is None and importlib.util.find_spec("vllm") is None:
        print("error: vllm is not installed (pip install -e '.[vllm]'); or run against an "
              "existing server with --url", file=sys.stderr)
        return 3
    if remote is not None and not remote.passes_preflight():
        return 3
    out = out_dir or artifacts_dir() / time.strftime("tour-%Y%m%d-%H%M%S")
    graph = t.TourGraph()
    eng: HarnessEngine
    if engine == "sim":
        eng = SimHarnessEngine()
    elif remote is not None:
        eng = remote.factory(out)()
    else:
        eng = vllm_factory(out)()
    try:
        if choices is not None:
            cap = t.Capability(eng.kind, safe)
            sched = t.decode_walk(graph, cap, choices)
            printer(f"walk {walk}: {' '.join(sched.labels())}")
            res = t.TourRun(eng, sched, out / "walk", safe=safe).run()
            if as_json:
                print(json.dumps(res.as_json(), indent=2))
            else:
                printer("PASS" if res.passed else f"FAIL at step {res.diverged_at}: "
                        f"{res.message}")
            return 0 if res.passed else 1
        if safe:
            printer("--safe: no signals, no broken checkpoint; the classes that need one "
                    "are listed as not realisable")
        report = t.tour(eng, out, graph=graph, safe=safe, walks=walks, seed=seed,
                        printer=printer)
    finally:
        eng.restore()
        eng.close()
    if as_json:
        print(json.dumps(report.as_json(), indent=2, sort_keys=True))
        return 0 if report.passed else 1
    _table(report, printer)
    cov = report.as_json()["coverage"]
    printer(f"coverage: {cov['classes']} edge classes in the spec (tour bounds "
            f"{t.TOUR_BOUNDS}), {cov['realised']} realised on {report.engine}, "
            f"{cov['unrealisable']} not realisable there"
            + (f", {len(cov['missing'])} MISSED" if cov["missing"] else ""))
    failed = [r for r in report.schedules if not r.passed]
    printer(f"schedules: {len(report.schedules)} ({report.as_json()['steps']} steps), "
            f"{len(failed)} failed; random walks: {report.walks}"
            + (f", one failed, shrunk to: {report.walk_failure.command}"
               if report.walk_failure else ""))
    printer(f"journals under {out}")
    printer("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1
