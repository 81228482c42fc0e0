"""The parser of every ``rolloutcore`` command, and the single-engine commands (see
:mod:`rolloutcore.cli` for the exit codes and how errors are reported)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from rolloutcore.cli.exits import (
    BAD_INPUT,
    BROKEN_PIPE,
    CANNOT_RUN,
    INTERRUPTED,
    NEGATIVE,
    OK,
    exit_code,
)
from rolloutcore.errors import RolloutCoreError
from rolloutcore.inputs import file_problem, unreadable
from rolloutcore.spec.lifecycle import SPEC, Bounds

Handler = Callable[[argparse.Namespace], int]

_MAX_MESSAGE = 2000  # an error line is one line, and a readable one


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= _MAX_MESSAGE else line[:_MAX_MESSAGE] + "..."


def _error(message: str) -> None:
    print(f"error: {_one_line(message)}", file=sys.stderr)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _bad_input(args: argparse.Namespace, message: str, **fields: Any) -> int:
    """Report bad input (one stderr line; with --json also a JSON object) and return 2."""
    return _stop(args, BAD_INPUT, message, **fields)


def _cannot_run(args: argparse.Namespace, message: str, **fields: Any) -> int:
    """Report what keeps the command from running (a store down) and return 3."""
    return _stop(args, CANNOT_RUN, message, **fields)


def _stop(args: argparse.Namespace, code: int, message: str, **fields: Any) -> int:
    message = _unalias(args, message)  # a store's journal is named as its URL, not a copy
    fields = {k: _unalias(args, v) if isinstance(v, str) else v for k, v in fields.items()}
    if getattr(args, "json", False):
        _print_json({**fields, "error": _one_line(message)})
    _error(message)
    return code


def _unalias(args: argparse.Namespace, text: str) -> str:
    """``text`` with every temporary copy of a store's journal named as its URL."""
    for path, source in getattr(args, "aliases", {}).items():
        text = text.replace(path, source)
    return text


def _shown(args: argparse.Namespace, attr: str) -> str:
    """What to call input ``attr``: the URL it came from, or the path given."""
    value: str = getattr(args, attr)
    return _unalias(args, value)


class _JsonStream:
    """A JSON object printed while it is built, so that its one list can be of any
    length: the head fields, the list's items one per line, then the tail fields. An
    error after the list began closes it and adds an ``error`` field: the output stays
    one valid JSON object."""

    def __init__(self, head: dict[str, Any], key: str) -> None:
        self.head, self.key, self.items = head, key, 0
        self._open = False

    def _start(self) -> None:
        if not self._open:
            body = json.dumps(self.head, sort_keys=True, default=str)[:-1]
            print(body + (", " if self.head else "") + json.dumps(self.key) + ": [")
            self._open = True

    def item(self, obj: Any) -> None:
        self._start()
        print(("," if self.items else "") + json.dumps(obj, sort_keys=True, default=str))
        self.items += 1

    def end(self, **tail: Any) -> None:
        self._start()
        rest = json.dumps(tail, sort_keys=True, default=str)[1:]
        print("]" + (", " + rest if tail else "}"))


# ------------------------------------------------------------------- argument types


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error convention: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"error: {self.prog}: {_one_line(message)}\n")


# ------------------------------------------------------------------------------- spec


def _spec_check(args: argparse.Namespace) -> int:
    from rolloutcore.proof.explore import explore

    bounds = Bounds(args.rollouts, args.generations, args.faults)
    ex = explore(SPEC.with_bounds(bounds))
    props = [(i.name, "invariant") for i in SPEC.invariants] + [
        (p.name, "action property") for p in SPEC.action_properties
    ] + [("Deadlock", "every reachable state has a successor" if not SPEC.terminal_phases
          else "terminal states only in " + ", ".join(sorted(SPEC.terminal_phases)))]
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
    from rolloutcore.proof import modelcheck

    why_not = modelcheck.tlc_available() if not args.no_tlc else "--no-tlc"
    verdicts: list[Any] = [*modelcheck.check_mutants(with_tlc=why_not is None),
                           *modelcheck.check_fleet_mutants(with_tlc=why_not is None),
                           *modelcheck.check_failover_mutants(with_tlc=why_not is None),
                           *(v for m in modelcheck.TABLE_MODELS
                             for v in m.check_mutants(with_tlc=why_not is None))]
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
    from rolloutcore.proof import modelcheck

    generated = modelcheck.generated_files(with_doc="md" in which)  # only the doc explores
    files = {p: t for p, t in generated.items() if p.suffix[1:] in which}
    stale = modelcheck.stale_files(files)
    if check:  # the stale files are the verdict: stdout
        if as_json:
            _print_json({"stale": [str(p) for p in stale]})
        else:
            for p in stale:
                print(f"stale: {p} (run `rolloutcore spec "
                      f"{'doc' if p.suffix == '.md' else 'tla'}`)")
        return 1 if stale else 0
    for p, text in files.items():
        p.write_text(text)
        print(f"wrote {p}")
    return 0


def _spec_tla(args: argparse.Namespace) -> int:
    return _write_or_check(args.check, ("tla", "cfg", "py"), args.json)


def _spec_doc(args: argparse.Namespace) -> int:
    return _write_or_check(args.check, ("md",), args.json)


def _spec_tlc(args: argparse.Namespace) -> int:
    from rolloutcore.proof import modelcheck

    why_not = modelcheck.tlc_available()
    if why_not:  # not bad input: the environment lacks a tool
        if args.json:
            _print_json({"error": _one_line(f"cannot run TLC: {why_not}")})
        _error(f"cannot run TLC: {why_not}")
        return CANNOT_RUN
    runs = {"lifecycle": modelcheck.run_tlc(), "fleet": modelcheck.run_fleet_tlc(),
            "failover": modelcheck.run_failover_tlc(),
            **{m.key: m.run_tlc() for m in modelcheck.TABLE_MODELS}}
    if args.json:
        _print_json({name: run.as_json() for name, run in runs.items()})
    else:
        for name, run in runs.items():
            r = run.result
            print(f"{name}: TLC exit {r.exit_code} in {r.seconds:.1f} s"
                  + (f": {r.violation} {r.violated_name}" if r.violation else ": no error"))
            print(f"  python: {run.python_states} states, {run.python_edges} edges")
            print(f"  TLC:    {run.tlc_states} states, {run.tlc_edges} edges")
            print(f"  graphs equal edge for edge: {run.graphs_equal}")
            for line in run.only_python:
                print(f"    only in python: {line}")
            for line in run.only_tlc:
                print(f"    only in TLC: {line}")
    return 0 if all(r.result.exit_code == 0 and r.graphs_equal for r in runs.values()) else 1


# ------------------------------------------------------------------- trace, journal


def _trace_check(args: argparse.Namespace) -> int:
    from rolloutcore.check.fleet_trace import check_fleet_file, is_fleet_journal
    from rolloutcore.check.trace import TraceInputError, check_file

    try:
        if is_fleet_journal(args.file):  # a fleet's journal: checked against the fleet spec
            if args.after:
                raise TraceInputError("--after applies to single-engine journals")
            v = check_fleet_file(args.file, strict=args.strict)
        else:
            v = check_file(args.file, after=args.after, strict=args.strict)
    except TraceInputError as e:
        return _bad_input(args, str(e), file=args.file)
    if args.json:
        _print_json({"file": _shown(args, "file"), **v.as_json()})
    elif v.accepted:
        print(_unalias(args, f"{v.message} (at most {v.states_max} consistent spec states)"))
        for w in v.warnings:  # said, never passed silently: a torn final record
            print(_unalias(args, f"warning: {w}"))
    else:
        print(_unalias(args, f"rejected at line {v.first_bad_line}: {v.violated}\n  "
                       f"{v.message}"))
    return OK if v.accepted else NEGATIVE


def _trace_join(args: argparse.Namespace) -> int:
    from rolloutcore.check.gateway_join import check_join
    from rolloutcore.check.trace import TraceInputError

    gateways: dict[str, str] = {}
    for item in args.gateway:
        name, sep, path = item.partition("=")
        if not sep or not name or not path or name in gateways:
            return _bad_input(args, f"{item!r}: expected NAME=PATH, one per gateway",
                              file=args.fleet_journal)
        gateways[name] = path
    try:
        v = check_join(args.fleet_journal, gateways)
    except TraceInputError as e:
        return _bad_input(args, str(e), file=args.fleet_journal)
    if args.json:
        _print_json({"file": args.fleet_journal, **v.as_json()})
    elif v.accepted:
        print(v.message)
    else:
        print(f"rejected: {v.violated}\n  {v.message}")
    return OK if v.accepted else NEGATIVE


def _journal_verify(args: argparse.Namespace) -> int:
    from rolloutcore.journal import not_a_journal, verify_chain

    try:
        r = verify_chain(args.file)  # streams: memory does not grow with the journal
    except OSError as e:
        return _bad_input(args, unreadable(args.file, e), file=args.file)
    if r.records == 0:  # not even a header verified: not a journal (as trace check says)
        return _bad_input(args, not_a_journal(args.file, r), file=args.file)
    if args.json:
        _print_json({"file": _shown(args, "file"), "ok": r.ok, "records": r.records,
                     "first_bad_line": r.first_bad_line, "reason": r.reason,
                     "truncated": r.truncated, "last_seq": r.last_seq})
    elif r.ok:
        print(f"chain intact: {r.records} records (last seq {r.last_seq})")
    else:
        print(f"broken at line {r.first_bad_line}: {r.reason}"
              + (" (a crash mid-write; recovery ignores that step)" if r.truncated else ""))
    return OK if r.ok else NEGATIVE


#: Each call to a control store a command reads a journal from takes at most this long.
_STORE_TIMEOUT_S = 5.0
_JOURNAL_SOURCE = ("a journal file, or an etcd:// URL: a fleet's journal on its control "
                   "store (the fleet file's [control] store)")


def _is_store_url(source: str) -> bool:
    # rolloutcore.control.is_store_url's test, without importing the store's client
    # (a third of a second) for every file.
    return source.lower().startswith("etcd://")


def _from_store(args: argparse.Namespace, attr: str, run: Handler) -> int:
    """Run ``run`` on input ``args.<attr>``: a journal file as it is; an ``etcd://`` URL's
    journal exported first to a temporary file (deleted afterwards), which every line
    then names as the URL. A bad URL or a prefix without a journal: 2; a store that
    cannot be read: 3."""
    source = getattr(args, attr)
    if not _is_store_url(source):
        return run(args)
    from rolloutcore.control import StoreError, StoreUrlError, open_journal_source
    from rolloutcore.journal import JournalError

    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(open_journal_source(source,
                                                           timeout_s=_STORE_TIMEOUT_S))
        except StoreUrlError as e:
            return _bad_input(args, str(e), **{attr: source})
        except StoreError as e:
            return _cannot_run(args, f"{source}: control store unavailable: {e}",
                               **{attr: source})
        except JournalError as e:  # the prefix holds no journal
            return _bad_input(args, str(e), **{attr: source})
        inner = argparse.Namespace(**vars(args))
        setattr(inner, attr, str(path))
        inner.aliases = {**getattr(args, "aliases", {}), str(path): source}
        return run(inner)
    raise AssertionError("unreachable")  # for mypy: the with block always returns


def _trace_check_source(args: argparse.Namespace) -> int:
    return _from_store(args, "file", _trace_check)


def _journal_verify_source(args: argparse.Namespace) -> int:
    return _from_store(args, "file", _journal_verify)


def _journal_export(args: argparse.Namespace) -> int:
    from rolloutcore.control import (
        EtcdStore,
        StoreError,
        StoreUrlError,
        export_journal,
        iter_journal_lines,
        parse_store_url,
    )

    source, out = args.source, Path(args.out)
    fields = {"source": source, "out": args.out}
    if not _is_store_url(source):
        return _bad_input(args, f"{source}: not an etcd:// URL (journal export reads a "
                          "fleet's journal from its control store; a file is one already)",
                          **fields)
    try:
        url = parse_store_url(source)
    except StoreUrlError as e:
        return _bad_input(args, str(e), **fields)
    if out.is_dir():
        return _bad_input(args, f"{out}: is a directory", **fields)
    if not out.parent.is_dir():
        return _bad_input(args, f"{out.parent}: no such directory", **fields)
    with EtcdStore(url.endpoints, url.prefix, _STORE_TIMEOUT_S) as store:
        try:
            if next(iter(iter_journal_lines(store, page=1)), None) is None:  # nothing written
                return _bad_input(args, f"{store.url}: no journal under "
                                  f"{store.key('journal')}/", **fields)
            n = export_journal(store, out)  # atomic: a temporary file renamed
        except StoreError as e:
            return _cannot_run(args, f"{source}: control store unavailable: {e}", **fields)
        except OSError as e:
            return _bad_input(args, f"{e.filename or out}: cannot write: {e.strerror or e}",
                              **fields)
    if args.json:
        _print_json({"source": store.url, "out": str(out), "records": n})
    else:
        print(f"exported {n} records from {store.url} to {out}")
    return OK


def _add_trace_journal_parsers(sub: Any) -> None:
    trace = sub.add_parser("trace", help="check journals against the spec")
    tsub = trace.add_subparsers(dest="cmd", required=True)
    tc = tsub.add_parser("check", help="conformance and history checks of a journal "
                         "(exit 0 accepted, 1 rejected, 2 unreadable, 3 its store "
                         "unavailable)")
    tc.add_argument("file", help=_JOURNAL_SOURCE)
    tc.add_argument("--after", metavar="PREVIOUS",
                    help="the journal segment FILE continues (its link is verified)")
    tc.add_argument("--strict", action="store_true",
                    help="reject a torn final record (a crash in mid-write) instead of "
                    "warning of it")
    tc.add_argument("--json", action="store_true")
    tc.set_defaults(func=_trace_check_source)
    tj = tsub.add_parser("join", help="check remote gateways' journals joined to the "
                         "fleet's journal (exit 0 accepted, 1 rejected, 2 unreadable)")
    tj.add_argument("fleet_journal", help="the fleet's journal (a file)")
    tj.add_argument("gateway", nargs="+", metavar="NAME=PATH",
                    help="a gateway's name and its own journal (serve --gateway-journal)")
    tj.add_argument("--json", action="store_true")
    tj.set_defaults(func=_trace_join)
    journal = sub.add_parser("journal", help="the append-only step journal")
    jsub = journal.add_subparsers(dest="cmd", required=True)
    jv = jsub.add_parser("verify", help="check the hash chain, streaming (exit 0 intact, "
                         "1 broken, 2 unreadable or not a journal, 3 its store "
                         "unavailable)")
    jv.add_argument("file", help=_JOURNAL_SOURCE)
    jv.add_argument("--json", action="store_true")
    jv.set_defaults(func=_journal_verify_source)
    je = jsub.add_parser("export", help="write a fleet's journal from its control store to "
                         "a file, the very JSONL file a local journal would be (exit 0 "
                         "written, 2 bad URL or no journal there, 3 store unavailable)")
    je.add_argument("source", help="the fleet file's [control] store URL: etcd://host:port"
                    "[,host:port...][/prefix] (no prefix: /rolloutcore, as the fleet's)")
    je.add_argument("out", help="the file to write (replaced whole, atomically)")
    je.add_argument("--json", action="store_true")
    je.set_defaults(func=_journal_export)


# --------------------------------------------------------------------------- simulate


def _journal_path_problem(path: Path) -> str | None:
    """Why ``simulate`` cannot start a new journal at ``path`` (None if it can)."""
    if path.is_dir():
        return f"{path}: is a directory"
    if path.exists() and (not path.is_file() or path.stat().st_size > 0):
        return f"{path}: exists and is not empty (simulate starts a new journal)"
    if not path.parent.is_dir():
        return f"{path.parent}: no such directory"
    return None


def _simulate(args: argparse.Namespace) -> int:
    from rolloutcore.adapters.sim import FaultPlan
    from rolloutcore.engine.simulate import simulate

    try:  # validate everything before anything is written
        FaultPlan.parse(args.faults)
    except ValueError as e:
        return _bad_input(args, f"--faults: {e}")
    journal = Path(args.journal) if args.journal else None
    problem = _journal_path_problem(journal) if journal is not None else None
    if problem:
        return _bad_input(args, f"--journal {problem}")
    result = simulate(args.cycles, faults=args.faults, journal=journal)
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
    return OK if result.ok else NEGATIVE


# ------------------------------------------------------------------ demo, conformance


def _demo(args: argparse.Namespace) -> int:
    if sum([args.fleet is not None, args.lifecycle, args.trl, args.single_turn]) > 1:
        return _bad_input(args, "--fleet, --lifecycle, --trl and --single-turn are different "
                          "demos: pick one")
    if args.fleet is not None:
        if args.fleet < 2:
            return _bad_input(args, f"--fleet needs at least 2 servers, got {args.fleet}")
        from rolloutcore.conformance.demos.fleet_story import main as fleet_demo_main

        return fleet_demo_main(args.fleet, as_json=args.json)
    if args.lifecycle:
        from rolloutcore.conformance.demos.lifecycle_story import main as demo_main

        return demo_main(as_json=args.json)
    if args.steps is not None and args.steps < 4:
        return _bad_input(args, f"--steps must be at least 4, got {args.steps}")
    import dataclasses

    from rolloutcore.conformance.demos.rl_run import RLConfig

    cfg = None if args.steps is None else RLConfig(steps=args.steps, fault_step=args.steps // 2)
    if not (args.trl or args.single_turn):
        from rolloutcore.conformance.demos.agentic_run import AGENTIC
        from rolloutcore.conformance.demos.agentic_run import main as agentic_main

        return agentic_main(as_json=args.json, cfg=None if args.steps is None else
                            dataclasses.replace(AGENTIC, steps=args.steps,
                                                fault_step=args.steps // 2))
    if args.trl:
        try:
            import trl  # noqa: F401
        except ImportError:
            return _cannot_run(args, "cannot run the TRL demo: TRL is not installed "
                               "(make demo and make test install it)")
        from rolloutcore.conformance.demos.trl_run import main as trl_demo_main

        return trl_demo_main(as_json=args.json, cfg=cfg)
    from rolloutcore.conformance.demos.rl_run import main as rl_demo_main

    return rl_demo_main(as_json=args.json, cfg=cfg)


def _remote(args: argparse.Namespace) -> Any:
    """The ``--url`` server (None: the harness starts its own); raises ValueError on bad
    options."""
    from rolloutcore.conformance.commands import Remote
    from rolloutcore.conformance.remote import parse_checkpoints

    if args.url is None:
        if args.checkpoint or args.token:
            raise ValueError("--checkpoint and --token go with --url")
        return None
    return Remote(args.url, args.model, args.token, parse_checkpoints(args.checkpoint))


def _conformance_run(args: argparse.Namespace) -> int:
    from rolloutcore.conformance.commands import cli_run

    try:
        remote = _remote(args)
    except ValueError as e:
        return _bad_input(args, str(e))
    if remote is not None and args.engine != "vllm":
        return _bad_input(args, "--url runs on the real engine: use --engine vllm")
    return cli_run(args.engine, args.scenario, as_json=args.json, remote=remote,
                   safe=args.safe)


def _conformance_tour(args: argparse.Namespace) -> int:
    from rolloutcore.conformance.commands import cli_tour

    try:
        remote = _remote(args)
    except ValueError as e:
        return _bad_input(args, str(e))
    engine = "vllm" if remote is not None else args.engine
    return cli_tour(engine, as_json=args.json, walks=args.walks, seed=args.seed,
                    safe=args.safe, walk=args.walk, remote=remote)


def _add_remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="run against this existing vLLM server instead of starting "
                   "one (it must run in dev mode with the RolloutCore worker extension, on "
                   "checkpoint v1)")
    p.add_argument("--model", default="tiny", help="the served model name (with --url)")
    p.add_argument("--token", help="bearer token of the server (with --url)")
    p.add_argument("--checkpoint", action="append", metavar="NAME=PATH",
                   help="a checkpoint the server may load, v1, v2 and v1neg (with --url; "
                   "paths both the server and this machine read)")
    p.add_argument("--safe", action="store_true", help="only what leaves the server as it "
                   "found it: no signals, no broken checkpoint")


def _add_demo_conformance_parsers(sub: Any) -> None:
    demo = sub.add_parser("demo", help="an agentic online-RL run (episodes: a tool call, a "
                          "slow tool, the answer) that learns through RolloutCore on two real "
                          "vLLM CPU servers, verified end to end, with pictures (exit 0 only "
                          "if all checks pass)")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--steps", type=int, metavar="N", help="training steps of the RL run "
                      "(default 40, single-turn 30; the member is killed at step N/2)")
    demo.add_argument("--lifecycle", action="store_true", help="instead: live updates of one "
                      "server, step by step")
    demo.add_argument("--fleet", type=int, metavar="N", help="a fleet of N servers (about "
                      "2 GiB each): one transactional update, a failing server quarantined "
                      "and re-admitted")
    demo.add_argument("--trl", action="store_true", help="the RL run with TRL's own "
                      "GRPOTrainer, generating and publishing through RolloutCore")
    demo.add_argument("--single-turn", action="store_true", help="the single-turn RL run "
                      "(groups of samples of one prompt) instead of episodes")
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
    _add_remote_args(run)
    run.set_defaults(func=_conformance_run)
    tour = csub.add_parser("tour", help="spec-generated schedules covering every edge class "
                           "(action x source phase), each replayed with the faults its "
                           "outcomes need; coverage per class; seeded random walks")
    tour.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    tour.add_argument("--walks", type=int, default=10, help="random walks after the cover "
                      "(default 10; a failing one is shrunk and printed as a command)")
    tour.add_argument("--seed", type=int, default=0)
    tour.add_argument("--walk", help="replay one walk: its comma-separated choices")
    tour.add_argument("--json", action="store_true")
    _add_remote_args(tour)
    tour.set_defaults(func=_conformance_tour)


# ---------------------------------------------------------------------------- records


def _records_unit(path: str) -> str:
    from rolloutcore.trajectories.format import is_parquet

    return "row" if is_parquet(path) else "line"


def _where(path: str, unit: str, position: int) -> str:
    return f"{path}:{position}" if unit == "line" else f"{path}: row {position}"


def _show_line(r: Any) -> str:
    d = r.decoding
    return (f"  {r.rollout_id}{f' sample {r.sample}' if r.sample else ''}: version "
            f"{r.version} ({r.label}, identity "
            f"{(r.identity or '-')[:12]}), prompt {len(r.prompt_token_ids)} + response "
            f"{len(r.response_token_ids)} tokens, {r.finish_reason}"
            f"{' (ABORTED by the drain: partial output)' if r.binding.aborted else ''}; "
            + (f"migrated: {', '.join(f'{x.engine} {x.start}..{x.end}' for x in r.segments)}"
               "; " if r.segments else "")
            + f"T={d.temperature} "
            f"top_p={d.top_p} max={d.max_tokens} seed={d.seed}; {r.timing.seconds:.3f} s")


def _records_show(args: argparse.Namespace) -> int:
    from rolloutcore.trajectories.format import RecordError, iter_records

    problem = file_problem(args.file)
    if problem:
        return _bad_input(args, problem, file=args.file)
    out = _JsonStream({"file": args.file}, "records") if args.json else None
    n = 0
    try:
        for r in iter_records(args.file):  # streamed: each record printed as it is read
            if out is not None:
                out.item(r.to_dict())
            else:
                print(_show_line(r))
            n += 1
    except BrokenPipeError:  # our reader went away, not the file: main() handles it
        raise
    except (RecordError, OSError) as e:
        msg = str(e) if isinstance(e, RecordError) else unreadable(args.file, e)
        return _stream_failed(out, args, msg)
    if n == 0:
        return _stream_failed(out, args, f"{args.file}: no records (empty file)")
    if out is not None:
        out.end(count=n)
    else:
        print(f"{args.file}: {n} records")
    return OK


def _stream_failed(out: _JsonStream | None, args: argparse.Namespace, message: str) -> int:
    """Bad input met while streaming: close the JSON (if any) with the error, say it."""
    if out is not None and out.items:
        out.end(error=_one_line(message), count=out.items)
        _error(message)
        return BAD_INPUT
    return _bad_input(args, message, file=args.file)


def _engine_url_problem(url: str) -> str | None:
    """Why ``url`` is not an engine URL replay may send to (the HTTP adapter's rule: http
    only to loopback)."""
    import httpx

    from rolloutcore.adapters.http import check_url

    try:
        u = check_url(url)
    except (ValueError, httpx.InvalidURL) as e:
        return f"--engine {url!r}: {e}"
    if u.port is not None and not 0 < u.port < 65536:
        return f"--engine {url!r}: port {u.port} out of range"
    return None


def _connect_watch() -> Any:
    """An httpx transport that remembers a failure to connect (``.error``), so that replay
    stops at the first one instead of trying every record against an absent engine."""
    import httpx

    class ConnectWatch(httpx.HTTPTransport):
        error: Exception | None = None

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            try:
                return super().handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                self.error = e
                raise

    return ConnectWatch()


def _records_replay(args: argparse.Namespace) -> int:
    import httpx

    from rolloutcore.conformance.replay import replay_record
    from rolloutcore.trajectories.format import RecordError, iter_records

    problem = _engine_url_problem(args.engine) or file_problem(args.file)
    if problem:
        return _bad_input(args, problem, file=args.file, engine=args.engine)
    out = _JsonStream({"file": args.file, "engine": args.engine,
                       "tolerance": args.tolerance}, "verdicts") if args.json else None
    counts: dict[str, int] = {}
    watch = _connect_watch()
    with httpx.Client(base_url=args.engine, trust_env=False, timeout=120.0,
                      transport=watch) as client:
        try:
            for rec in iter_records(args.file):
                v = replay_record(client, rec, model=args.model, tolerance=args.tolerance)
                if watch.error is not None:  # fail fast: the engine is not there
                    return _stream_failed(out, args, f"--engine {args.engine}: cannot "
                                          f"connect: {watch.error}")
                counts[v.verdict] = counts.get(v.verdict, 0) + 1
                if out is not None:
                    out.item(v.as_json(per_token=args.per_token))
                else:
                    diff = "" if v.max_abs_diff is None else (
                        f" max |d| {v.max_abs_diff:.3g}, seq d {v.seq_diff:+.4g}")
                    print(f"  {v.rollout_id} (version {v.version}): {v.verdict}{diff}; "
                          f"{v.detail}")
        except BrokenPipeError:
            raise
        except (RecordError, OSError) as e:
            msg = str(e) if isinstance(e, RecordError) else unreadable(args.file, e)
            return _stream_failed(out, args, msg)
    n = sum(counts.values())
    if n == 0:
        return _stream_failed(out, args, f"{args.file}: no records (empty file)")
    if out is not None:
        out.end(counts=counts)
    else:
        print(f"{n} records: " + ", ".join(f"{c} {k}" for k, c in sorted(counts.items())))
    if counts.get("error"):
        _error(f"--engine {args.engine}: {counts['error']} of {n} records could not be "
               "scored (see the verdicts)")
        return BAD_INPUT
    return OK if set(counts) <= {"match", "unscorable"} else NEGATIVE


def _records_verify_source(args: argparse.Namespace) -> int:
    """The records file is checked first: the store is read only for readable records."""
    problem = file_problem(args.file)
    if problem:
        return _bad_input(args, problem, file=args.file, journal=args.journal)
    return _from_store(args, "journal", _records_verify)


def _records_verify(args: argparse.Namespace) -> int:
    from rolloutcore.trajectories.format import RecordError, iter_records_at
    from rolloutcore.trajectories.provenance import (
        CONSISTENT,
        REJECTED,
        UNVERIFIABLE,
        JournalIndex,
        ProvenanceInputError,
    )

    problem = file_problem(args.file) or file_problem(args.journal)
    if problem:
        return _bad_input(args, problem, file=args.file, journal=args.journal)
    try:
        index = JournalIndex(args.journal)  # one streamed pass, compact index
    except OSError as e:
        return _bad_input(args, unreadable(args.journal, e), file=args.file,
                          journal=args.journal)
    except ProvenanceInputError as e:
        return _bad_input(args, str(e), file=args.file, journal=args.journal)
    chain = index.chain
    chain_broken = not chain.ok and not chain.truncated
    chain_note = ("chain intact" if chain.ok else
                  f"line {chain.first_bad_line} is a torn final record (ignored)"
                  if chain.truncated else
                  f"chain BROKEN at line {chain.first_bad_line}: {chain.reason}")
    journal_json = {"file": _shown(args, "journal"), "records": chain.records,
                    "ok": chain.ok,
                    "truncated": chain.truncated, "first_bad_line": chain.first_bad_line,
                    "reason": chain.reason, "admissions": index.admissions}
    out = _JsonStream({"file": args.file, "journal": journal_json}, "verdicts") \
        if args.json else None
    if out is None:
        print(f"journal {_shown(args, 'journal')}: {chain.records} records, {chain_note}; "
              f"{index.admissions} admissions")
    unit = _records_unit(args.file)
    counts = {CONSISTENT: 0, REJECTED: 0, UNVERIFIABLE: 0}
    try:
        for pos, rec in iter_records_at(args.file):
            v = index.check(pos, rec, unit=unit)
            counts[v.verdict] += 1
            if out is not None:
                out.item(v.as_json())
            elif v.verdict != CONSISTENT:
                print(f"{_where(args.file, unit, pos)}: rollout {v.rollout_id!r} (seq "
                      f"{v.seq}, generation {v.generation}): {v.verdict}: "
                      + "; ".join(v.reasons))
    except BrokenPipeError:  # our reader went away, not the file: main() handles it
        raise
    except (RecordError, OSError) as e:
        msg = str(e) if isinstance(e, RecordError) else unreadable(args.file, e)
        return _stream_failed(out, args, msg)
    n = sum(counts.values())
    if n == 0:
        return _stream_failed(out, args, f"{args.file}: no records (empty file)")
    ok = counts[CONSISTENT] == n and not chain_broken
    if out is not None:
        out.end(counts=counts, ok=ok)
    else:
        print(f"{n} records: {counts[CONSISTENT]} consistent, {counts[REJECTED]} rejected, "
              f"{counts[UNVERIFIABLE]} unverifiable"
              + ("; the journal's chain is broken: its evidence ends there"
                 if chain_broken else ""))
    return OK if ok else NEGATIVE


def _add_records_parsers(sub: Any) -> None:
    rec = sub.add_parser("records", help="trajectory records (JSON lines or Parquet)")
    rsub = rec.add_subparsers(dest="cmd", required=True)
    show = rsub.add_parser("show", help="print the records of a file, streaming (exit 2 if "
                           "unreadable)")
    show.add_argument("file")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_records_show)
    rp = rsub.add_parser("replay", help="re-score each record on an engine (exit 0 all match, "
                         "1 some mismatch, 2 unreadable, engine unreachable or engine error)")
    rp.add_argument("file")
    rp.add_argument("--engine", required=True, help="engine base URL, e.g. "
                    "http://127.0.0.1:8000 (plain http only to loopback)")
    rp.add_argument("--model", default="tiny", help="served model name (default: tiny)")
    rp.add_argument("--tolerance", type=_nonneg_float, default=1e-3,
                    help="max |logprob difference| per token, nats (default 1e-3)")
    rp.add_argument("--per-token", action="store_true", help="with --json: every token's diff")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_records_replay)
    ver = rsub.add_parser("verify", help="check each record's binding (rollout, generation, "
                          "identity, admission seq) against the journal (exit 0 all "
                          "consistent, 1 any rejected or unverifiable, 2 unreadable)")
    ver.add_argument("file")
    ver.add_argument("--journal", required=True, help="the journal the rollouts ran under: "
                     + _JOURNAL_SOURCE)
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=_records_verify_source)


# ----------------------------------------------------------------------------- report


def _report(args: argparse.Namespace) -> int:
    from rolloutcore import report

    for f in (args.journal, args.records, args.steps):  # every input, before any work
        problem = file_problem(f) if f is not None else None
        if problem:
            return _bad_input(args, problem, file=args.journal)
    out = Path(args.out) if args.out else report.default_out_dir(args.journal)
    if out.exists() and not out.is_dir():
        return _bad_input(args, f"--out {out}: exists and is not a directory",
                          file=args.journal)
    why = report.drawing_unavailable()
    if why:  # not bad input: the environment lacks a tool
        if args.json:
            _print_json({"error": _one_line(f"cannot draw: {why}")})
        _error(f"cannot draw: {why}")
        return CANNOT_RUN
    try:
        steps = report.read_steps(args.steps) if args.steps is not None else None
        rep = report.build_report(Path(args.journal), out, steps=steps,
                                  records=Path(args.records) if args.records else None)
    except report.ReportInputError as e:
        return _bad_input(args, str(e), file=args.journal)
    except report.JournalFailsVerification as e:  # a verdict, as journal verify gives it
        if args.json:
            _print_json({"out": None, "chain_ok": False, "first_bad_line":
                         e.chain.first_bad_line, "reason": e.chain.reason})
        else:
            print(f"not drawn: {e}")
        return NEGATIVE
    except OSError as e:  # the inputs were read (their errors are ReportInputError): out
        return _bad_input(args, f"{e.filename or out}: cannot write: {e.strerror or e}",
                          file=args.journal)
    if args.json:
        _print_json({"out": str(out), **rep.as_json()})
    else:
        for f in rep.files:
            print(f"wrote {f}")
        for line in rep.timeline.summary():
            print(f"  {line}")
    return OK


def _add_report_parser(sub: Any) -> None:
    rp = sub.add_parser("report", help="pictures of a run: the journal's timeline (a lane "
                        "per engine, its phases, every rollout from admission to release); "
                        "with RECORDS their staleness, with --steps the reward; PNGs and one "
                        "self-contained index.html (exit 1, nothing drawn, if the journal's chain "
                        "breaks before a torn final record; 2 unreadable; 3 without matplotlib)")
    rp.add_argument("journal", help="an engine or fleet journal")
    rp.add_argument("records", nargs="?", help="trajectory records (JSON lines or Parquet) "
                    "of rollouts the journal bound")
    rp.add_argument("--out", metavar="DIR", help="where to write (default: <journal "
                    "stem>-report/ next to the journal)")
    rp.add_argument("--steps", metavar="STEPS.jsonl", help="training steps, one JSON object "
                    "a line: step, mean_reward and optionally generation")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=_report)


# ------------------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rolloutcore", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="group", required=True)

    spec = sub.add_parser("spec", help="the lifecycle spec: model checking and generated files")
    ssub = spec.add_subparsers(dest="cmd", required=True)
    c = ssub.add_parser("check", help="explore every reachable state, check every property")
    d = SPEC.bounds
    c.add_argument("--rollouts", type=_int_at_least(1), default=d.rollouts)
    c.add_argument("--generations", type=_int_at_least(1), default=d.generations)
    c.add_argument("--faults", type=_int_at_least(0), default=d.faults)
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
    t = ssub.add_parser("tlc", help="run TLC and compare its graph with the explorer's "
                        "(exit 3 if TLC cannot run here)")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=_spec_tlc)
    _add_trace_journal_parsers(sub)
    sim = sub.add_parser("simulate", help="update cycles against the simulated engine")
    sim.add_argument("--cycles", type=_int_at_least(1), default=3)
    sim.add_argument("--faults", default="",
                     help="faults to inject, e.g. 'mutate=hang' or 'reset_prefix=fail_body'")
    sim.add_argument("--journal", help="a new journal file (default: one in a new temp dir)")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=_simulate)
    _add_demo_conformance_parsers(sub)
    _add_records_parsers(sub)
    _add_report_parser(sub)
    from rolloutcore.cli.fleet_commands import add_fleet_parsers
    from rolloutcore.cli.serve import add_serve_parser

    add_fleet_parsers(sub, _int_at_least)
    add_serve_parser(sub)
    return p


def commands(parser: argparse.ArgumentParser | None = None) -> list[tuple[str, ...]]:
    """Every command of the parser (the leaves of its subcommand tree), e.g.
    ``("records", "show")``: derived from the parser, so none is forgotten."""
    out: list[tuple[str, ...]] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append(path)
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*path, name))

    walk(parser or build_parser(), ())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (one line, 2) and --help (0)
        return e.code if isinstance(e.code, int) else BAD_INPUT
    func: Handler = args.func
    try:
        rc = func(args)
        sys.stdout.flush()  # inside the guard: a closed pipe surfaces here
        return rc
    except KeyboardInterrupt:
        _error("interrupted")
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head`): say nothing more, and let the interpreter's
        # final flush go to /dev/null instead of raising again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return BROKEN_PIPE
    except RolloutCoreError as e:  # one the handler did not word itself: its kind decides
        code = exit_code(e)
        if code is not None:
            _error(" ".join(str(e).split()) or type(e).__name__)
            return code
        _error(f"internal error in `rolloutcore {args.group} {getattr(args, 'cmd', '')}`"
               f": {type(e).__name__}: {e} (a bug: please report it)")
        return CANNOT_RUN
    except Exception as e:  # last resort: a bug, reported in one line, never a traceback
        _error(f"internal error in `rolloutcore {args.group} {getattr(args, 'cmd', '')}`"
               f": {type(e).__name__}: {e} (a bug: please report it)")
        return CANNOT_RUN

