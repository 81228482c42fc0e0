"""``rolloutcore conformance ...``: the command-line glue over the harness."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rolloutcore.conformance.harness import (
    ScenarioResult,
    compare,
    run_corpus,
    sim_factory,
    vllm_factory,
)


def artifacts_dir() -> Path:
    """Where runs write journals and logs: $ROLLOUTCORE_ARTIFACTS or the repo's
    git-ignored ``artifacts/``."""
    env = os.environ.get("ROLLOUTCORE_ARTIFACTS")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "artifacts"


def cli_run(engine: str, names: list[str] | None, *, as_json: bool,
            out_dir: Path | None = None) -> int:
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
    if "vllm" in kinds and importlib.util.find_spec("vllm") is None:
        print("error: vllm is not installed (pip install -e '.[vllm]')", file=sys.stderr)
        return 2
    out = out_dir or artifacts_dir() / time.strftime("conformance-%Y%m%d-%H%M%S")

    def printer(text: str) -> None:
        print(text, file=stream, flush=True)

    results: dict[str, list[ScenarioResult]] = {}
    for kind in kinds:
        factory = sim_factory() if kind == "sim" else vllm_factory(out)
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
