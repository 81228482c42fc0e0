"""``rolloutcore demo --fleet N``: one transactional update across N real vLLM servers.

Starts N vLLM CPU servers (the tiny models, the RolloutCore worker extension), adopts
them as one fleet at generation 1, and runs two fleet scenarios, printing every check as
it is made: a clean update of every server while a rollout runs on each (each finishes on
the generation it was bound to, every later one runs on the new one); then an update in
which the last server's load dies halfway: the others publish, the broken one is
quarantined and fenced and gets no rollout, the operator restarts it, and a verified
re-admission (label, identity, probe) brings it back at the committed generation. Each
fleet journal is checked against the fleet spec. Exit 0 only if every check passed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from rolloutcore.conformance.fleet_scenarios import FleetResult, FleetRig, run_fleet_scenario

DEMO_SCENARIOS = ("clean_update_live", "dies_halfway_quorum")


def run_fleet_demo(n: int, artifacts: Path, say: Any) -> list[FleetResult]:
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    work = artifacts / time.strftime("fleet-demo-%Y%m%d-%H%M%S")
    say(f"== building the tiny models and starting {n} vLLM servers (under {work})")
    t0 = time.perf_counter()
    rig = FleetRig.vllm(build_models(DEFAULT_OUT), work, n)
    say(f"   {n} servers up in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{name}={url}" for name, url in rig.urls().items()))
    results = []
    try:
        for name in DEMO_SCENARIOS:
            say(f"\n== {name}")
            r = run_fleet_scenario(name, rig, printer=say, narrate=True)
            for key, ev in r.evidence.items():
                if isinstance(ev, dict) and "members" in ev:
                    say(f"   {key}: published={ev['published']} on {ev['committed_on']}, "
                        f"quarantined={ev['quarantined']}, {ev['total_s'] * 1000:.0f} ms")
                    for member, steps in ev["members"].items():
                        say(f"     {member}: {' '.join(steps)}")
            say(f"   journal {r.journal}: {r.trace}")
            results.append(r)
    finally:
        rig.close()
    return results


def main(n: int, *, as_json: bool = False, artifacts: Path | None = None) -> int:
    from rolloutcore.conformance.demos.lifecycle_story import DEFAULT_ARTIFACTS

    stream = sys.stderr if as_json else sys.stdout

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    try:
        results = run_fleet_demo(n, artifacts or DEFAULT_ARTIFACTS, say)
    except Exception as e:
        if as_json:
            print(json.dumps({"passed": False, "error": f"{type(e).__name__}: {e}"}))
        print(f"fleet demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    passed = all(r.passed for r in results)
    if as_json:
        print(json.dumps({"passed": passed, "scenarios": [r.as_json() for r in results]},
                         indent=2, sort_keys=True, default=str))
    else:
        say("\nPASS" if passed else "\nFAIL")
    return 0 if passed else 1
