"""Generate the spec review document (``spec/SPEC.md``) from a :class:`Spec` (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from rolloutcore.spec.failover import FailoverSpec
from rolloutcore.spec.failover import __doc__ as failover_doc
from rolloutcore.spec.fleet import JOURNAL_PROPERTIES, JOURNAL_PROPERTIES_IN_THE_MODEL, FleetSpec
from rolloutcore.spec.fleet import __doc__ as fleet_doc
from rolloutcore.spec.lifecycle import Action, Fairness, Kind, Phase, Spec
from rolloutcore.spec.mutants import (
    FAILOVER_LIVENESS_MUTANTS,
    FAILOVER_MUTANTS,
    FLEET_LIVENESS_MUTANTS,
    FLEET_MUTANTS,
    LIVENESS_FAILOVER,
    LIVENESS_MUTANTS,
    MUTANTS,
    ROLLING,
    ROLLING_CRASH,
)
from rolloutcore.spec.tla import tla_name, world_conjuncts


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _guard(a: Action) -> str:
    parts = [f"`{a.when_tla}`"] if a.when_tla != "TRUE" else []
    if a.truth_tla != "TRUE":
        parts.append(f"truth: `{a.truth_tla}`")
    if a.fault:
        parts.append("fault budget left")
    if a.needs_generation:
        parts.append("a generation left (model bound)")
    return "; ".join(parts) or "-"


def _effect(a: Action) -> str:
    parts = [f"`{v}' = {e}`" for v, e in a.control_tla.items()]
    parts += [f"world: `{c}`" for c in world_conjuncts(a.world_tla)]
    if a.in_flight:
        parts.append("world: the operation in flight may or may not have taken effect "
                     "(`InFlight`)")
    return "; ".join(parts) or "-"


def mermaid(spec: Spec) -> str:
    edges: dict[tuple[Phase, Phase], list[str]] = defaultdict(list)
    for a in spec.actions:
        if a.dest is None or a.kind in (Kind.ENVIRONMENT, Kind.RESTART):
            continue
        for src in a.sources - {a.dest}:
            name = a.trigger or a.name
            if name not in edges[(src, a.dest)]:
                edges[(src, a.dest)].append(name)
    lines = ["stateDiagram-v2", "    [*] --> UNINITIALIZED"]
    order = list(Phase)
    for (src, dst), names in sorted(edges.items(), key=lambda e: (order.index(e[0][0]),
                                                                 order.index(e[0][1]))):
        lines.append(f"    {src.value} --> {dst.value}: {', '.join(names)}")
    lines.append("    TAINTED --> [*]")
    return "\n".join(lines)


def fleet_section(fleet: FleetSpec, *, states: int, edges: int, rolling_states: int,
                  rolling_edges: int, crash_states: int = 0, crash_edges: int = 0) -> list[str]:
    b = fleet.bounds
    doc = (fleet_doc or "").split("Theory of operation\n-------------------\n", 1)[-1]
    out = ["", "## The fleet", "", "Generated from `spec/fleet.py` (its module and config: "
           "`spec/RolloutCoreFleet.tla`, `.cfg`).", ""]
    strict, rolling = doc.strip().split("\nRolling updates (", 1)
    rolling, rest = ("Rolling updates (" + rolling).split("\nNot modelled here:", 1)
    out += [*strict.splitlines(), "", "Not modelled here:" + rest.rstrip()]
    out += ["", "Member actions are the single-engine actions above, applied to one member; "
            "the fleet adds these guards to them:", "",
            "| member action | fleet guard |", "|---|---|"]
    for name, (_g, tla) in fleet.member_guards.items():
        if tla != "TRUE":
            out.append(f"| {name} | `{_cell(tla)}` |")
    out += ["", "Members' reset steps follow the tier order; during the fleet's update a "
            "member takes the steps of its own cycle once every member before it has settled "
            "(see `FleetSpec.scheduled` for why that loses no observable behaviour); giving "
            "up spends the fleet's fault budget.", "", "Fleet actions:", "",
            "| action | from | to | guard |", "|---|---|---|---|"]
    for fa in fleet.actions:
        out.append(f"| {fa.name} ({tla_name(fa.name)}) | {', '.join(sorted(fa.sources))} | "
                   f"{fa.dest} | {_cell(fa.doc)} |")
    out += ["", "Fleet invariants (every reachable state; every member's single-engine "
            "invariants too):", ""]
    out += [f"- **{i.name}**: {i.doc}" for i in fleet.invariants]
    out += ["", "Fleet action properties (every step; every member's too):", ""]
    out += [f"- **{p.name}**: {p.doc}" for p in fleet.action_properties]
    out += ["", "Fleet journal properties (the fleet trace checker checks them on every "
            "journal, and the forgery generator's cross-record forgeries show each caught; "
            "the model, which names a generation's weights by its number, a rollout by its "
            "slot and a takeover by a crash and its recovery, states each as the properties "
            "named after it, checked by the explorer and TLC, each broken by a mutant below):",
            ""]
    out += [f"- **{name}**: {doc} (model: "
            f"{', '.join(JOURNAL_PROPERTIES_IN_THE_MODEL[name])})"
            for name, doc in JOURNAL_PROPERTIES.items()]
    out += ["", f"Default bounds: {b.engines} members, min_serving {b.min_serving}, "
            f"{b.generations} generations, {b.rollouts} rollout slot(s) per member, "
            f"{b.faults} fault(s) across the fleet. Reachable: **{states} states, {edges} "
            "edges** (explorer and TLC agree edge for edge; CI also compares them at three "
            "members).", "", "Fleet mutants (each caught by the explorer and by TLC):", ""]
    out += [f"- **{m.name}**: {m.doc}" for m in FLEET_MUTANTS]
    mig = fleet.migration
    r = ROLLING
    out += ["", "### Rolling updates and in-flight migration", "", *rolling.strip().splitlines(),
            "", f"The migration, **{mig.name}** ({tla_name(mig.name)}, one step over two "
            f"members): {mig.doc} Guard: `{_cell(mig.when_tla)}`.", "",
            f"Rolling bounds CI explores first: {r.engines} members, max_live {r.max_live}, "
            f"min_admitting {r.min_admitting}, min_serving {r.min_serving}, {r.generations} "
            f"generations, {r.rollouts} rollout slot(s) per member, {r.faults} fault(s). "
            f"Reachable: **{rolling_states} states, {rolling_edges} edges** (explorer and TLC "
            "agree edge for edge; CI also compares three members, and two with a fault). "
            "The mutants above that name a rolling bug are checked at rolling bounds."]
    c = ROLLING_CRASH
    out += ["", "### The controller's crash and recovery", "",
            f"The crash (**{fleet.crash.name}**, {tla_name(fleet.crash.name)}): {fleet.crash.doc} "
            "Its recovery's member steps are the single-engine restarts "
            f"({', '.join(fleet.restarts)}), each member once; then fleet_recover or "
            "fleet_recover_closed (above). The default bounds explore no crash; CI explores "
            f"one over {c.engines} members with max_live {c.max_live}, min_admitting "
            f"{c.min_admitting}, min_serving {c.min_serving}, {c.generations} generations, "
            f"{c.rollouts} rollout slot(s), {c.faults} other fault(s): **{crash_states} states, "
            f"{crash_edges} edges** (explorer and TLC agree edge for edge; `make test` also "
            "compares a strict fleet of two members, both needed, crashing once)."]
    out += ["", "### Fleet liveness (under fairness)", "",
            "Checked by the explorer's fair-cycle search at the default, rolling and crash "
            "bounds above (member actions told apart by member) and by TLC under the "
            "module's `FairSpec` at the rolling bounds, one run per property (TLC's "
            "liveness check grows fast with states and fairness conjuncts: the default "
            "bounds are the explorer's alone); the verdicts must be equal. A property "
            "reads `([]<><<FiniteStep>>_vars) \\/ (P ~> Q)`: it speaks of behaviours "
            "in which the operator's steps and a member's leaving an update it was asked for ("
            f"{', '.join(sorted(fleet.finite))}) are finitely many; an update asks each member "
            "once (`fasked`), as the runtime does.", ""]
    for lp in fleet.liveness:
        each = " (for every member n)" if lp.member else ""
        out.append(f"- **{lp.name}**{each} (`{_cell(lp.when_tla)}` ~> "
                   f"`{_cell(lp.then_tla)}`): {lp.doc}")
    out += ["", "Fairness assumptions (the trainer's requests, the clients, faults, "
            "migration and the crash are not fair):", ""]
    out += [f"- **{f.name}** ({_strength(f)}; the fleet: {', '.join(sorted(f.actions))}): "
            f"{f.doc}" for f in fleet.fairness]
    out += [f"- **{f.name}** ({_strength(f)}; each member: "
            f"{', '.join(sorted(f.actions)) if len(f.actions) < 4 else f'{len(f.actions)} actions'}"
            f"{f' where `{_cell(f.when_tla)}`' if f.when_tla else ''}): {f.doc}"
            for f in fleet.member_fairness]
    out += ["", "Fleet liveness mutants (each passes every safety check of the fleet and "
            "breaks its property, found by the explorer):", ""]
    out += [f"- **{m.name}** (breaks {prop}): {m.doc}" for m, prop in FLEET_LIVENESS_MUTANTS]
    return out


def _strength(f: Fairness) -> str:
    return "strong" if f.strong else "weak"


def failover_section(fo: FailoverSpec, *, states: int, edges: int) -> list[str]:
    b = fo.bounds
    doc = (failover_doc or "").split("Theory of operation\n-------------------\n", 1)[-1]
    out = ["", "## Controller failover", "", "Generated from `spec/failover.py` (its module "
           "and config: `spec/RolloutCoreFailover.tla`, `.cfg`).", "",
           *doc.strip().splitlines(), "", "| action | what it does |", "|---|---|"]
    for a in fo.actions:
        append = " (a journal append: only under the live leader key of its epoch)" \
            if a.appends else ""
        out.append(f"| {a.name} ({tla_name(a.name)}) | {_cell(a.doc + append)} |")
    out += ["", "Invariants:", ""]
    out += [f"- **{i.name}**: {i.doc}" for i in fo.invariants]
    out += ["", "Action properties:", ""]
    out += [f"- **{p.name}**: {p.doc}" for p in fo.action_properties]
    out += ["", f"Default bounds: {b.controllers} controllers, {b.engines} engine(s), "
            f"{b.epochs} elections, {b.generations} generations. Reachable: **{states} "
            f"states, {edges} edges** (explorer and TLC agree edge for edge).", "",
            "Failover mutants (each caught by the explorer and by TLC):", ""]
    out += [f"- **{m.name}**: {m.doc}" for m in FAILOVER_MUTANTS]
    lb = LIVENESS_FAILOVER
    out += ["", "### Failover liveness (under fairness)", "",
            "Checked by the explorer's fair-cycle search at the default bounds (a "
            "controller's actions told apart by controller, a delivery by its epoch) and by "
            f"TLC under the module's `FairSpec` at {lb.controllers} controllers, "
            f"{lb.engines} engine, {lb.epochs} elections, {lb.generations} generation "
            "(TLC's liveness check at the default bounds does not finish in five minutes); "
            "the verdicts must be equal. A state with no step left (the election bound "
            "spent) stutters, as in the safety run.", ""]
    for lp in fo.liveness:
        each = " (for every controller c)" if lp.per_controller else ""
        out.append(f"- **{lp.name}**{each} (`{_cell(lp.when_tla)}` ~> "
                   f"`{_cell(lp.then_tla)}`): {lp.doc}")
    out += ["", "Fairness assumptions (freezes, crashes, clients, the operator and the "
            "trainer are not fair):", ""]
    out += [f"- **{f.name}** ({_strength(f)}; {scope}): {f.doc}"
            for scope, group in (("the store", fo.fairness), ("each epoch", fo.epoch_fairness),
                                 ("each controller", fo.controller_fairness))
            for f in group]
    out += ["", "Failover liveness mutants (each passes every safety check and breaks its "
            "property, caught by the explorer and by TLC):", ""]
    out += [f"- **{m.name}** (breaks {prop}): {m.doc}" for m, prop in FAILOVER_LIVENESS_MUTANTS]
    return out


class TableDoc(NamedTuple):
    """A table spec's section of the review document."""

    title: str
    source: str  # its Python file, e.g. spec/episodes.py
    doc: str  # its module docstring (the theory of operation)
    spec: Any  # its spec: name, actions, invariants, bounds, maybe properties
    states: int
    edges: int
    mutants: Sequence[Any]


def table_section(t: TableDoc) -> list[str]:
    theory = t.doc.split("Theory of operation\n-------------------\n", 1)[-1]
    out = ["", f"## {t.title}", "", f"Generated from `{t.source}` (its module and config: "
           f"`spec/{t.spec.name}.tla`, `.cfg`).", "", *theory.strip().splitlines(), "",
           "| action | what it does |", "|---|---|"]
    out += [f"| {a.name} ({tla_name(a.name)}) | {_cell(a.doc)} |" for a in t.spec.actions]
    out += ["", "Invariants:", ""]
    out += [f"- **{i.name}**: {i.doc}" for i in t.spec.invariants]
    props = getattr(t.spec, "properties", ())
    if props:
        out += ["", "Step properties:", ""]
        out += [f"- **{p.name}**: {p.doc}" for p in props]
    out += ["", f"Default bounds: {t.spec.bounds.describe()}. Reachable: **{t.states} states, "
            f"{t.edges} edges** (explorer and TLC agree edge for edge).", "",
            "Mutants (each caught by the explorer and by TLC):", ""]
    out += [f"- **{m.name}**: {m.doc}" for m in t.mutants]
    return out


def document(spec: Spec, *, states: int, edges: int, fleet: FleetSpec | None = None,
             fleet_states: int = 0, fleet_edges: int = 0, rolling_states: int = 0,
             rolling_edges: int = 0, crash_states: int = 0, crash_edges: int = 0,
             failover: FailoverSpec | None = None,
             failover_states: int = 0, failover_edges: int = 0,
             tables: Sequence[TableDoc] = ()) -> str:
    """The review document; ``states``/``edges`` come from exploring ``spec`` (and the
    fleet's from exploring ``fleet``)."""
    b = spec.bounds
    out = [
        "# RolloutCore lifecycle specification",
        "",
        "Generated from `spec/lifecycle.py` by `rolloutcore spec doc`; CI fails if it is "
        "stale. Do not edit by hand.",
        "",
        "## Phases",
        "",
        "```mermaid",
        mermaid(spec),
        "```",
        "",
        "Self-loops (steps that keep the phase: begin steps, failed outcomes, admission and "
        "release) are listed in the table below, not drawn. Restarts after a controller "
        "crash are not drawn either: " + "; ".join(
            f"{a.name} from {', '.join(p.value for p in Phase if p in a.sources)}"
            for a in spec.actions if a.kind is Kind.RESTART) + ".",
        "",
        "## Actions",
        "",
        "Kinds: *control* steps are taken by the controller, *outcome* steps are what it "
        "observes of an operation in flight, *environment* steps happen in the engine "
        "unseen, *restart* steps are the controller process restarting on its journal after "
        "a crash (what it may then assume). Each operation's actions have an explicit result: "
        "begin, ok, failed (unclassifiable: the only one retried), refused (proof of no "
        "effect), mismatch (definite evidence against) or ambiguous. A *truth* guard "
        "constrains which outcome the engine can produce; outcomes "
        "marked observed-as look identical to the controller.",
        "",
        "| action (TLA+) | kind | result | from | to | guard | effect | observed as |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in spec.actions:
        src = ", ".join(p.value for p in Phase if p in a.sources)
        if a.sources == frozenset(Phase):
            src = "any"
        dest = a.dest.value if a.dest else "(same)"
        head = a.name + (f"({a.param})" if a.param else "") + f" ({tla_name(a.name)})"
        obs = a.trigger if a.trigger and a.trigger != a.name else ""
        out.append(
            f"| {head} | {a.kind} | {a.result or ''} | {src} | {dest} | {_cell(_guard(a))} "
            f"| {_cell(_effect(a))} | {obs} |"
        )
    out += ["", "Each action in plain words:", ""]
    out += [f"- **{a.name}**: {_cell(a.doc)}" for a in spec.actions]
    out += ["", "## Invariants (every reachable state)", ""]
    out += [f"- **{i.name}**: {i.doc}" for i in spec.invariants]
    out += ["", "## Action properties (every step)", ""]
    out += [f"- **{p.name}**: {p.doc}" for p in spec.action_properties]
    out += ["", "## Liveness (under fairness)", "",
            "Checked by the explorer (a fair strongly connected set of states reachable "
            "without the goal: a lasso) and by TLC under the module's `FairSpec`, one run "
            "per property; the verdicts must be equal. Faults stay bounded by the fault "
            "budget (a run has finitely many, as the runner's retries are bounded); "
            "clients, the trainer and the operator are not assumed fair.", ""]
    out += [f"- **{lp.name}** (`{lp.when_tla}` ~> `{lp.then_tla}`): {lp.doc}"
            for lp in spec.liveness]
    out += ["", "Fairness assumptions:", ""]
    out += [f"- **{f.name}** ({_strength(f)}: "
            f"{', '.join(sorted(f.actions)) if len(f.actions) < 4 else 'every outcome'}): "
            f"{f.doc}" for f in spec.fairness]
    out += ["", "Liveness mutants (each passes every safety check, breaks its property, "
            "and is caught by the explorer and by TLC):", ""]
    out += [f"- **{m.name}** (breaks {prop}): {m.doc}" for m, prop in LIVENESS_MUTANTS]
    out += [
        "",
        "## Bounds and size",
        "",
        f"Default bounds: {b.rollouts} rollout slots, {b.generations} generations (the "
        f"initial one included), at most {b.faults} fault outcomes per behaviour. "
        + _terminal_words(spec),
        "",
        f"Reachable at these bounds: **{states} states, {edges} edges** (the Python explorer "
        "and TLC must agree edge for edge).",
        "",
        "## Mutants (negative controls)",
        "",
        "Each must be caught by the explorer, by TLC and by the property-based tests.",
        "",
    ]
    out += [f"- **{m.name}**: {m.doc}" for m in MUTANTS]
    if fleet is not None:
        out += fleet_section(fleet, states=fleet_states, edges=fleet_edges,
                             rolling_states=rolling_states, rolling_edges=rolling_edges,
                             crash_states=crash_states, crash_edges=crash_edges)
    if failover is not None:
        out += failover_section(failover, states=failover_states, edges=failover_edges)
    for t in tables:
        out += table_section(t)
    return "\n".join(out) + "\n"


def _terminal_words(spec: Spec) -> str:
    """What the deadlock check (explorer and TLC) allows as an end state."""
    if not spec.terminal_phases:
        return ("No terminal phase: every reachable state has a successor (the explorer and "
                "TLC both check for deadlocks).")
    return ("Terminal phases allowed: "
            f"{', '.join(sorted(p.value for p in spec.terminal_phases))}.")
