"""``rolloutcore``: command-line entry point."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rolloutcore.spec.lifecycle import SPEC, Bounds

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[tuple[str, ...], Handler] = {}


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


# ------------------------------------------------------------------------------- spec


def _spec_check(args: argparse.Namespace) -> int:
    from rolloutcore.explore import explore

    bounds = Bounds(args.rollouts, args.generations, args.faults)
    ex = explore(SPEC.with_bounds(bounds))
    props = [(i.name, "invariant") for i in SPEC.invariants] + [
        (p.name, "action property") for p in SPEC.action_properties
    ] + [("Deadlock", "terminal states only in " + ", ".join(sorted(SPEC.terminal_phases)))]
    verdicts = {name: ("violated" if name in ex.violations else "holds") for name, _ in props}
    if args.json:
        _print_json({
            "bounds": vars(bounds), "states": ex.states, "edges": ex.edges,
            "seconds": round(ex.seconds, 3), "properties": verdicts,
            "unreachable_actions": list(ex.unreachable_actions), "ok": ex.ok,
            "counterexamples": {n: [s.label() for s in v.trace] for n, v in ex.violations.items()},
        })
    else:
        print(f"bounds: {bounds.rollouts} rollouts, {bounds.generations} generations, "
              f"{bounds.faults} faults")
        print(f"explored {ex.states} states, {ex.edges} edges in {ex.seconds:.2f} s")
        for name, kind in props:
            print(f"  {verdicts[name]:8s} {name} ({kind})")
        print(f"actions reachable: {len(SPEC.actions) - len(ex.unreachable_actions)}"
              f"/{len(SPEC.actions)}" + (f"; never: {', '.join(ex.unreachable_actions)}"
                                         if ex.unreachable_actions else ""))
        cex = ex.shortest_counterexample()
        if cex is not None:
            print(cex.describe())
    return 0 if ex.ok else 1


def _spec_mutants(args: argparse.Namespace) -> int:
    from rolloutcore import modelcheck

    why_not = modelcheck.tlc_available() if not args.no_tlc else "--no-tlc"
    verdicts = modelcheck.check_mutants(with_tlc=why_not is None)
    rows = [v.as_json() for v in verdicts]
    if args.json:
        _print_json({"tlc": why_not or "ran", "mutants": rows})
    else:
        if why_not:
            print(f"TLC not run: {why_not}")
        print(f"{'mutant':28s} {'verdict':7s} {'explorer (len)':40s} TLC (len)")
        for r in rows:
            ex = f"{r['explorer_violated']} ({r['explorer_counterexample_length']})"
            t = f"{r['tlc_violated']} ({r['tlc_counterexample_length']})" if r["tlc_ran"] else "-"
            print(f"{r['mutant']:28s} {'caught' if r['caught'] else 'MISSED':7s} {ex:40s} {t}")
    return 0 if all(v.caught for v in verdicts) else 1


def _write_or_check(check: bool, which: Sequence[str], as_json: bool) -> int:
    from rolloutcore import modelcheck

    files = {p: t for p, t in modelcheck.generated_files().items() if p.suffix[1:] in which}
    stale = modelcheck.stale_files(files)
    if check:
        if as_json:
            _print_json({"stale": [str(p) for p in stale]})
        for p in stale:
            print(f"stale: {p} (run `rolloutcore spec {'doc' if p.suffix == '.md' else 'tla'}`)",
                  file=sys.stderr)
        return 1 if stale else 0
    for p, text in files.items():
        p.write_text(text)
        print(f"wrote {p}")
    return 0


def _spec_tla(args: argparse.Namespace) -> int:
    return _write_or_check(args.check, ("tla", "cfg"), args.json)


def _spec_doc(args: argparse.Namespace) -> int:
    return _write_or_check(args.check, ("md",), args.json)


def _spec_tlc(args: argparse.Namespace) -> int:
    from rolloutcore import modelcheck

    why_not = modelcheck.tlc_available()
    if why_not:
        print(f"cannot run TLC: {why_not}", file=sys.stderr)
        return 2
    run = modelcheck.run_tlc()
    if args.json:
        _print_json(run.as_json())
    else:
        r = run.result
        print(f"TLC exit {r.exit_code} in {r.seconds:.1f} s"
              + (f": {r.violation} {r.violated_name}" if r.violation else ": no error"))
        print(f"python: {run.python_states} states, {run.python_edges} edges")
        print(f"TLC:    {run.tlc_states} states, {run.tlc_edges} edges")
        print(f"graphs equal edge for edge: {run.graphs_equal}")
        for line in run.only_python:
            print(f"  only in python: {line}")
        for line in run.only_tlc:
            print(f"  only in TLC: {line}")
    return 0 if run.result.exit_code == 0 and run.graphs_equal else 1


# ------------------------------------------------------------------- trace, journal


def _trace_check(args: argparse.Namespace) -> int:
    from rolloutcore.trace_check import TraceInputError, check_file

    try:
        v = check_file(args.file)
    except TraceInputError as e:
        if args.json:
            _print_json({"file": args.file, "error": str(e)})
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        _print_json({"file": args.file, **v.as_json()})
    elif v.accepted:
        print(f"{v.message} (at most {v.states_max} consistent spec states)")
    else:
        print(f"rejected at line {v.first_bad_line}: {v.violated}\n  {v.message}")
    return 0 if v.accepted else 1


def _journal_verify(args: argparse.Namespace) -> int:
    from rolloutcore.journal import verify_chain

    try:
        r = verify_chain(args.file)
    except OSError as e:
        if args.json:
            _print_json({"file": args.file, "error": f"cannot read: {e.strerror or e}"})
        print(f"error: {args.file}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.json:
        _print_json({"file": args.file, "ok": r.ok, "records": r.records,
                     "first_bad_line": r.first_bad_line, "reason": r.reason,
                     "truncated": r.truncated, "last_seq": r.last_seq})
    elif r.ok:
        print(f"chain intact: {r.records} records (last seq {r.last_seq})")
    else:
        print(f"broken at line {r.first_bad_line}: {r.reason}"
              + (" (a crash mid-write; recovery ignores that step)" if r.truncated else ""))
    return 0 if r.ok else 1


def _add_trace_journal_parsers(sub: Any) -> None:
    trace = sub.add_parser("trace", help="check journals against the spec")
    tsub = trace.add_subparsers(dest="cmd", required=True)
    tc = tsub.add_parser("check", help="conformance and history checks of a journal "
                         "(exit 0 accepted, 1 rejected, 2 unreadable)")
    tc.add_argument("file")
    tc.add_argument("--json", action="store_true")
    tc.set_defaults(func=_trace_check)
    journal = sub.add_parser("journal", help="the append-only step journal")
    jsub = journal.add_subparsers(dest="cmd", required=True)
    jv = jsub.add_parser("verify", help="check the hash chain (exit 0 intact, 1 broken, "
                         "2 unreadable)")
    jv.add_argument("file")
    jv.add_argument("--json", action="store_true")
    jv.set_defaults(func=_journal_verify)


# --------------------------------------------------------------------------- simulate


def _simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rolloutcore.simulate import simulate

    try:
        result = simulate(args.cycles, faults=args.faults,
                          journal=Path(args.journal) if args.journal else None)
    except ValueError as e:  # a malformed fault spec: say so, change nothing
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        _print_json(result.as_json())
    else:
        for n, c in enumerate(result.cycles, 1):
            verdict = "published" if c.published else "NOT published"
            print(f"cycle {n} -> {c.target.label}: {verdict}, {c.final_phase}, "
                  f"{c.total_s * 1e3:.2f} ms (drain {c.drain_wait_s * 1e3:.2f} ms)")
            for s in c.steps:
                print(f"    {s.step:18s} {s.outcome:18s} x{s.attempts} {s.seconds * 1e3:8.3f} ms")
        print(f"final: {result.final_phase}, committed generation {result.committed}; "
              f"{result.rollouts} rollouts, {result.crossings} crossed a mutation")
        if result.injected:
            print("faults injected: " + ", ".join(f"{o}={k}" for o, k in result.injected))
        print(f"journal: {result.journal} (chain {'intact' if result.chain_ok else 'BROKEN'}; "
              f"trace check: {result.trace.message})")
    return 0 if result.ok else 1


# ------------------------------------------------------------------ demo, conformance


def _demo(args: argparse.Namespace) -> int:
    from rolloutcore.conformance.demo import main as demo_main

    return demo_main(as_json=args.json)


def _conformance_run(args: argparse.Namespace) -> int:
    from rolloutcore.conformance.cli import cli_run

    return cli_run(args.engine, args.scenario, as_json=args.json)


def _add_demo_conformance_parsers(sub: Any) -> None:
    demo = sub.add_parser("demo", help="live updates of a real vLLM CPU server through "
                          "RolloutCore, verified end to end (exit 0 only if all checks pass)")
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_demo)
    conf = sub.add_parser("conformance", help="the scenario corpus against real vLLM and the "
                          "simulator")
    csub = conf.add_subparsers(dest="cmd", required=True)
    run = csub.add_parser("run", help="run scenarios; per scenario pass/fail, evidence and the "
                          "journal's trace-check verdict")
    run.add_argument("--engine", choices=("sim", "vllm", "both"), default="both",
                     help="both (default) also reports verdicts that differ between them")
    run.add_argument("--scenario", action="append", help="a scenario name (repeatable; "
                     "default: all)")
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=_conformance_run)


# ---------------------------------------------------------------------------- records


def _read_records(args: argparse.Namespace) -> list[Any] | None:
    """The records of ``args.file``, or None after reporting why they cannot be read."""
    from rolloutcore.records import RecordError, read_records

    try:
        return list(read_records(args.file))
    except (RecordError, OSError) as e:
        if args.json:
            _print_json({"file": args.file, "error": str(e)})
        print(f"error: {e}", file=sys.stderr)
        return None


def _records_show(args: argparse.Namespace) -> int:
    recs = _read_records(args)
    if recs is None:
        return 2
    if args.json:
        _print_json({"file": args.file, "records": [r.to_dict() for r in recs]})
        return 0
    print(f"{args.file}: {len(recs)} records")
    for r in recs:
        d = r.decoding
        print(f"  {r.rollout_id}: version {r.version} ({r.label}, identity "
              f"{(r.identity or '-')[:12]}), prompt {len(r.prompt_token_ids)} + response "
              f"{len(r.response_token_ids)} tokens, {r.finish_reason}; T={d.temperature} "
              f"top_p={d.top_p} max={d.max_tokens} seed={d.seed}; {r.timing.seconds:.3f} s")
    return 0


def _records_replay(args: argparse.Namespace) -> int:
    from rolloutcore.conformance.replay import replay

    recs = _read_records(args)
    if recs is None:
        return 2
    verdicts = replay(recs, args.engine, model=args.model, tolerance=args.tolerance)
    if args.json:
        _print_json({"file": args.file, "engine": args.engine, "tolerance": args.tolerance,
                     "verdicts": [v.as_json(per_token=args.per_token) for v in verdicts]})
    else:
        for v in verdicts:
            diff = "" if v.max_abs_diff is None else (
                f" max |d| {v.max_abs_diff:.3g}, seq d {v.seq_diff:+.4g}")
            print(f"  {v.rollout_id} (version {v.version}): {v.verdict}{diff}; {v.detail}")
    if any(v.verdict == "error" for v in verdicts):
        return 2
    return 0 if all(v.verdict in ("match", "unscorable") for v in verdicts) else 1


def _add_records_parsers(sub: Any) -> None:
    rec = sub.add_parser("records", help="trajectory records (JSON lines or Parquet)")
    rsub = rec.add_subparsers(dest="cmd", required=True)
    show = rsub.add_parser("show", help="print the records of a file (exit 2 if unreadable)")
    show.add_argument("file")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_records_show)
    rp = rsub.add_parser("replay", help="re-score each record on an engine (exit 0 all match, "
                         "1 some mismatch, 2 unreadable or engine error)")
    rp.add_argument("file")
    rp.add_argument("--engine", required=True, help="engine base URL, e.g. http://127.0.0.1:8000")
    rp.add_argument("--model", default="tiny", help="served model name (default: tiny)")
    rp.add_argument("--tolerance", type=float, default=1e-3,
                    help="max |logprob difference| per token, nats (default 1e-3)")
    rp.add_argument("--per-token", action="store_true", help="with --json: every token's diff")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_records_replay)


# ------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rolloutcore", description=__doc__)
    sub = p.add_subparsers(dest="group", required=True)

    spec = sub.add_parser("spec", help="the lifecycle spec: model checking and generated files")
    ssub = spec.add_subparsers(dest="cmd", required=True)
    c = ssub.add_parser("check", help="explore every reachable state, check every property")
    d = SPEC.bounds
    c.add_argument("--rollouts", type=int, default=d.rollouts)
    c.add_argument("--generations", type=int, default=d.generations)
    c.add_argument("--faults", type=int, default=d.faults)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_spec_check)
    m = ssub.add_parser("mutants", help="check that every broken spec variant is caught")
    m.add_argument("--json", action="store_true")
    m.add_argument("--no-tlc", action="store_true", help="explorer only")
    m.set_defaults(func=_spec_mutants)
    for name, func, what in (("tla", _spec_tla, "TLA+ module and TLC config"),
                             ("doc", _spec_doc, "review document spec/SPEC.md")):
        g = ssub.add_parser(name, help=f"write (or --check) the generated {what}")
        g.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
        g.add_argument("--json", action="store_true")
        g.set_defaults(func=func)
    t = ssub.add_parser("tlc", help="run TLC and compare its graph with the explorer's")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_spec_tlc)
    _add_trace_journal_parsers(sub)
    sim = sub.add_parser("simulate", help="update cycles against the simulated engine")
    sim.add_argument("--cycles", type=int, default=3)
    sim.add_argument("--faults", default="",
                     help="faults to inject, e.g. 'mutate=hang' or 'reset_prefix=fail_body'")
    sim.add_argument("--journal", help="journal file (default: a new file)")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=_simulate)
    _add_demo_conformance_parsers(sub)
    _add_records_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Handler = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
