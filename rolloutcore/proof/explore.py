"""Exhaustive breadth-first model checking of a :class:`~rolloutcore.spec.lifecycle.Spec`.

Every reachable state is visited once; every invariant is checked in every state and
every action property on every edge. Breadth-first order makes the first violation
found for a property a shortest counterexample.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import networkx as nx

from rolloutcore.spec.failover import FailoverSpec, FoExploration
from rolloutcore.spec.fleet import FleetExploration, FleetSpec
from rolloutcore.spec.lifecycle import Fairness, Param, Spec, State


@dataclass(frozen=True)
class Step:
    action: str
    param: Param
    state: State

    def label(self) -> str:
        return self.action if self.param is None else f"{self.action}({self.param})"


@dataclass(frozen=True)
class Violation:
    prop: str
    kind: str  # "invariant", "action property" or "deadlock"
    trace: tuple[Step, ...]  # from the initial state (action "init") to the violating state

    def describe(self) -> str:
        lines = [f"{self.kind} {self.prop} violated after {len(self.trace) - 1} steps:"]
        for n, step in enumerate(self.trace):
            lines.append(f"  {n:2d}. {step.label()}")
        lines.append(f"  final state: {format_state(self.trace[-1].state)}")
        return "\n".join(lines)


@dataclass
class Exploration:
    spec: Spec
    initial: tuple[State, ...]
    graph: nx.MultiDiGraph  # nodes: State; edges keyed (action name, param)
    violations: dict[str, Violation] = field(default_factory=dict)
    unreachable_actions: tuple[str, ...] = ()
    seconds: float = 0.0
    complete: bool = True  # False: stopped at the shortest counterexample (a partial graph)

    @property
    def states(self) -> int:
        return int(self.graph.number_of_nodes())

    @property
    def edges(self) -> int:
        return int(self.graph.number_of_edges())

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unreachable_actions

    def labelled_edges(self) -> set[tuple[State, str, State]]:
        """Edges as (state, action name, state): the granularity TLC's dump has."""
        return {(u, k[0], v) for u, v, k in self.graph.edges(keys=True)}

    def shortest_counterexample(self) -> Violation | None:
        if not self.violations:
            return None
        return min(self.violations.values(), key=lambda v: len(v.trace))


def format_state(s: State) -> str:
    parts = []
    for name, value in s._asdict().items():
        if isinstance(value, frozenset):
            value = "{" + ", ".join(sorted(map(str, value))) + "}"
        elif isinstance(value, tuple) and value and isinstance(value[0], frozenset):
            value = "(" + ", ".join("{" + ",".join(map(str, sorted(c))) + "}" for c in value) + ")"
        parts.append(f"{name}={value}")
    return " ".join(parts)


def explore(spec: Spec, *, max_states: int = 2_000_000,
            stop_at_violation: bool = False) -> Exploration:
    """Visit every reachable state of ``spec`` within its bounds; with
    ``stop_at_violation``, only until the shortest counterexample is certain (every state
    that could start a shorter one has been expanded: the mutants' negative controls)."""
    t0 = time.perf_counter()
    init = spec.initial_states()
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(init)
    parent: dict[State, tuple[State, str, Param] | None] = dict.fromkeys(init)
    depth: dict[State, int] = dict.fromkeys(init, 0)
    queue: deque[State] = deque(init)
    violations: dict[str, Violation] = {}
    fired: set[str] = set()

    def trace_to(s: State) -> tuple[Step, ...]:
        steps: list[Step] = []
        cur: State | None = s
        while cur is not None:
            link = parent[cur]
            if link is None:
                steps.append(Step("init", None, cur))
                cur = None
            else:
                prev, name, param = link
                steps.append(Step(name, param, cur))
                cur = prev
        return tuple(reversed(steps))

    def check_state(s: State) -> None:
        for inv in spec.invariants:
            if inv.name not in violations and not inv.holds(s):
                violations[inv.name] = Violation(inv.name, "invariant", trace_to(s))

    for s0 in init:
        check_state(s0)
    stopped = False
    while queue:
        s = queue.popleft()
        # Expanding s yields counterexamples of at least depth[s] + 1 steps (a deadlock at
        # s; an invariant or action property one step on): none shorter is left to find.
        if stop_at_violation and violations and depth[s] + 1 > min(
                len(v.trace) for v in violations.values()):
            stopped = True
            break
        succ = spec.successors(s)
        if not succ and s.phase not in spec.terminal_phases and "Deadlock" not in violations:
            violations["Deadlock"] = Violation("Deadlock", "deadlock", trace_to(s))
        for action, param, t in succ:
            fired.add(action.name)
            graph.add_edge(s, t, key=(action.name, param))
            for prop in spec.action_properties:
                if prop.name not in violations and not prop.holds(s, t):
                    tr = (*trace_to(s), Step(action.name, param, t))
                    violations[prop.name] = Violation(prop.name, "action property", tr)
            if t not in parent:
                parent[t] = (s, action.name, param)
                depth[t] = depth[s] + 1
                check_state(t)
                queue.append(t)
                if len(parent) > max_states:
                    raise RuntimeError(f"more than {max_states} states: bounds too large")
    # unknown when the search stopped early: say nothing rather than something untrue
    unreachable = () if stopped else tuple(a.name for a in spec.actions if a.name not in fired)
    return Exploration(
        spec=spec, initial=init, graph=graph, violations=violations,
        unreachable_actions=unreachable, seconds=time.perf_counter() - t0,
        complete=not stopped,
    )


# ------------------------------------------------------------------------ liveness


@dataclass(frozen=True)
class Lasso:
    """A behaviour that violates a liveness property under the spec's fairness: the
    ``prefix`` from an initial state to the cycle's first state, then the ``cycle`` (steps
    back to that state, repeated for ever; empty: the behaviour stutters there, no fair
    step being enabled)."""

    prop: str
    prefix: tuple[Step, ...]
    cycle: tuple[Step, ...]

    def describe(self) -> str:
        lines = [f"liveness {self.prop} violated: a lasso of {len(self.prefix) - 1} steps, "
                 f"then a cycle of {len(self.cycle)} (0: stuttering) for ever:"]
        lines += [f"  {n:2d}. {s.label()}" for n, s in enumerate(self.prefix)]
        lines += [f"   ↻  {s.label()}" for s in self.cycle]
        lines.append(f"  cycle state: {format_state(self.prefix[-1].state)}")
        return "\n".join(lines)


def check_liveness(ex: Exploration) -> dict[str, Lasso | None]:
    """Each liveness property of the explored spec: None if it holds, else a lasso."""
    b = ex.spec.bounds
    return fair_lassos(ex.graph, ex.initial, ex.spec.fairness,
                       {p.name: (partial(_over, p.when, b), partial(_over, p.then, b))
                        for p in ex.spec.liveness})


def _over(pred: Callable[[Any, Any], bool], b: Any, s: Any) -> bool:
    return pred(s, b)


#: A liveness property for :func:`fair_lassos`: (``when``, ``then``) over graph nodes.
Leads = tuple[Callable[[Any], bool], Callable[[Any], bool]]


def fair_lassos(g: nx.MultiDiGraph, initial: Iterable[Any], fairness: Sequence[Fairness],
                props: Mapping[str, Leads], *, finite: Callable[[str], bool] | None = None
                ) -> dict[str, Lasso | None]:
    """Each ``when ~> then`` property of ``props`` on the state graph ``g`` (edges keyed
    (action label, parameter)) under ``fairness`` (classes of action labels): None if it
    holds, else a lasso. Actions whose label ``finite`` accepts are taken only finitely
    often by the behaviours the properties speak of: no cycle takes one.

    ``P ~> Q`` fails iff from a reachable state where P holds and Q does not, a path that
    stays out of Q reaches a *fair* strongly connected set of states: one that, for every
    fairness assumption, either takes one of its actions on an edge inside the set or has
    a state where none of them is enabled (weak fairness; a single state counts, since a
    behaviour may stutter there, exactly when no fair action is enabled in it). Under
    weak fairness a maximal strongly connected component is fair whenever any part of it
    is, so the components suffice."""
    classes = list(fairness)
    strong = {i for i, f in enumerate(fairness) if f.strong}
    enabled: dict[Any, set[int]] = {}
    for s in g.nodes:
        names = {k[0] for _u, _v, k in g.out_edges(s, keys=True)}
        enabled[s] = {i for i, c in enumerate(classes) if any(c.counts(s, a) for a in names)}
    init = set(initial)
    cycles = g if finite is None else nx.subgraph_view(
        g, filter_edge=lambda _u, _v, k: not finite(k[0]))
    return {name: _lasso(g, cycles, init, name, when, then, classes, strong, enabled)
            for name, (when, then) in props.items()}


def _lasso(g: nx.MultiDiGraph, cycles: nx.MultiDiGraph, initial: set[Any], name: str,
           when: Callable[[Any], bool],
           then: Callable[[Any], bool], classes: list[Fairness], strong: set[int],
           enabled: dict[Any, set[int]]) -> Lasso | None:
    starts = [s for s in g.nodes if when(s) and not then(s)]
    # Multi-source BFS from the obligations, never through a state where Q holds.
    parent: dict[State, tuple[State, str, Param] | None] = dict.fromkeys(starts)
    queue = deque(starts)
    while queue:
        s = queue.popleft()
        for _u, t, k in g.out_edges(s, keys=True):
            if t not in parent and not then(t):
                parent[t] = (s, k[0], k[1])
                queue.append(t)
    found = _fair_component(cycles, set(parent), classes, strong, enabled)
    if found is None:
        return None
    comp, inside = found
    return _build_lasso(g, initial, name, comp, inside, parent, classes, enabled)


def check_fleet_liveness(spec: FleetSpec, ex: FleetExploration) -> dict[str, Lasso | None]:
    """Each liveness property of the fleet ``spec`` on its exploration (explored with
    ``keep_steps``): None if it holds, else a lasso (of a member property, the first
    member's that fails). Member actions are told apart by member: every member's fairness
    is one class per member, as TLA+'s ``\\A n \\in Engines : SF_vars(...)`` states it."""
    members = range(1, spec.bounds.engines + 1)
    per_member = frozenset({*spec.lifted, *spec.restarts})
    finite = spec.finite
    return _labelled_liveness(
        ex.steps, ex.nodes, ex.initial,
        lambda name, p: unit_label(name, p[0]) if name in per_member else name,
        [*spec.fairness, *_per_unit(spec.member_fairness, members, _member_state)],
        _props([(lp.name, lp.member, partial(_shifted, lp.when, spec.bounds),
                 partial(_shifted, lp.then, spec.bounds)) for lp in spec.liveness], members),
        finite=lambda label: label.split("@", 1)[0] in finite)


def check_failover_liveness(spec: FailoverSpec, ex: FoExploration) -> dict[str, Lasso | None]:
    """Each liveness property of the failover ``spec`` on its exploration (explored with
    ``keep_steps``): a controller's actions told apart by controller, a delivery by the
    epoch that sent it."""
    b = spec.bounds
    per_ctl = frozenset(a.name for a in spec.actions if "c" in a.tla_params)

    def label(name: str, p: Any) -> str:
        if name in per_ctl:
            return unit_label(name, p[0])
        if name == "deliver":
            return unit_label(name, p[0][1])  # the message's epoch
        return name

    return _labelled_liveness(
        ex.steps, ex.nodes, ex.initial, label,
        [*spec.fairness, *_per_unit(spec.epoch_fairness, range(1, b.epochs + 1)),
         *_per_unit(spec.controller_fairness, range(1, b.controllers + 1))],
        _props([(lp.name, lp.per_controller, partial(_with_bounds, lp.when, b),
                 partial(_with_bounds, lp.then, b)) for lp in spec.liveness],
               range(1, b.controllers + 1)))


#: A property for :func:`_props`: name, whether it is one per unit, when, then (each over
#: a state and a unit, counted from 1).
UnitProperty = tuple[str, bool, Callable[[Any, int], bool], Callable[[Any, int], bool]]


def _per_unit(classes: Sequence[Fairness], units: range,
              unit_state: Callable[[Any, int], Any] | None = None) -> list[Fairness]:
    """Each class once per unit, over that unit's labels (and a class's ``when`` over the
    unit's own state, ``unit_state(node, unit)``)."""
    out = []
    for n in units:
        for c in classes:
            when = None
            if c.when is not None:
                if unit_state is None:
                    raise ValueError(f"{c.name}: a condition needs the unit's state")
                when = partial(_unit_holds, c.when, unit_state, n)
            out.append(replace(c, name=unit_label(c.name, n), when=when,
                               actions=frozenset(unit_label(a, n) for a in c.actions)))
    return out


def _unit_holds(pred: Callable[[Any], bool], unit_state: Callable[[Any, int], Any], n: int,
                node: Any) -> bool:
    return pred(unit_state(node, n))


def _member_state(f: Any, n: int) -> Any:
    """A fleet member's state (members counted from 1)."""
    return f.eng[n - 1]


def _props(props: Sequence[UnitProperty], units: range
           ) -> dict[str, tuple[bool, dict[str, Leads]]]:
    """Each property's instances (one per unit for a unit property)."""
    return {name: (each, {unit_label(name, n) if each else name:
                          (partial(_at, when, n), partial(_at, then, n))
                          for n in (units if each else (1,))})
            for name, each, when, then in props}


def _at(pred: Callable[[Any, int], bool], n: int, f: Any) -> bool:
    return pred(f, n)


def _labelled_liveness(steps: Iterable[tuple[Any, str, Any, Any]], nodes: Iterable[Any],
                       initial: Iterable[Any], label: Callable[[str, Any], str],
                       classes: Sequence[Fairness],
                       props: Mapping[str, tuple[bool, dict[str, Leads]]], *,
                       finite: Callable[[str], bool] | None = None
                       ) -> dict[str, Lasso | None]:
    """Liveness over a model whose edges are labelled by ``label`` (action name and
    parameter: which unit took it); a property with several instances fails with its
    first failing one."""
    steps = list(steps)
    if not steps:
        raise ValueError("the exploration kept no steps (explore with keep_steps=True)")
    g = nx.MultiDiGraph()
    g.add_nodes_from(nodes)
    for f, name, p, t in steps:
        g.add_edge(f, t, key=(label(name, p), p))
    leads = {k: v for _each, inst in props.values() for k, v in inst.items()}
    found = fair_lassos(g, initial, classes, leads, finite=finite)
    return {name: next((found[k] for k in inst if found[k] is not None), None)
            for name, (_each, inst) in props.items()}


def unit_label(action: str, unit: int) -> str:
    """A unit's action (or property) in a liveness graph: its name and unit."""
    return f"{action}@{unit}"


def _shifted(pred: Callable[[Any, int, Any], bool], b: Any, f: Any, n: int) -> bool:
    """A fleet property's predicate (members from 0) over a unit counted from 1."""
    return pred(f, n - 1, b)


def _with_bounds(pred: Callable[[Any, int, Any], bool], b: Any, f: Any, n: int) -> bool:
    return pred(f, n, b)


Edge = tuple[State, State, tuple[str, Param]]


def _fair_component(g: nx.MultiDiGraph, states: set[State], classes: list[Fairness],
                    strong: set[int], enabled: dict[State, set[int]]
                    ) -> tuple[set[State], list[Edge]] | None:
    """A fair strongly connected set of ``states`` (with its inside edges and the classes
    a cycle through it must take), or None. A weakly fair class is met by a component
    that takes it inside or has a state where it is disabled (no part of a component
    failing that does better); a strongly fair class by one that takes it inside or never
    enables it, so a component failing only strong classes is searched again without the
    states that enable them (Emerson-Lei)."""
    sub = g.subgraph(states)
    for comp in sorted(nx.strongly_connected_components(sub), key=len):
        inside = [(u, v, k) for u, v, k in sub.edges(comp, keys=True) if v in comp]
        taken = _taken(inside, classes)
        somewhere = set().union(*(enabled[s] for s in comp))
        everywhere = set.intersection(*(enabled[s] for s in comp))
        weak_unmet = (everywhere - strong) - taken
        strong_unmet = (somewhere & strong) - taken
        if weak_unmet:
            continue
        if strong_unmet:
            rest = {s for s in comp if not enabled[s] & strong_unmet}
            found = _fair_component(g, rest, classes, strong, enabled) if rest else None
            if found is not None:
                return found
            continue
        return comp, inside
    return None


def _taken(edges: list[Edge], classes: list[Fairness]) -> set[int]:
    """The classes some of ``edges`` take (a step of its actions from a state it counts)."""
    return {i for u, _v, k in edges for i, c in enumerate(classes) if c.counts(u, k[0])}


def _build_lasso(g: nx.MultiDiGraph, initial: set[Any], name: str, comp: set[State],
                 inside: list[Edge], parent: dict[State, tuple[State, str, Param] | None],
                 classes: list[Fairness], enabled: dict[Any, set[int]]) -> Lasso:
    entry = min(comp, key=lambda s: _hops(parent, s))
    # Prefix: the initial state to the obligation, then within not-Q to the entry.
    tail: list[Step] = []
    cur = entry
    while (link := parent[cur]) is not None:
        tail.append(Step(link[1], link[2], cur))
        cur = link[0]
    head = _path(g, initial, cur)
    prefix = (*head, *reversed(tail))
    # Cycle: a fair one. Through an edge of every class the component takes, and through
    # a state that disables each class it never takes (a fair component has one: weakly
    # fair classes are disabled somewhere, strongly fair ones everywhere), back home.
    out = {u: [(v, k) for uu, v, k in inside if uu == u] for u in comp}
    taken = _taken(inside, classes)
    waypoints: list[tuple[State, Edge | None]] = []
    for i in sorted(taken):
        u, v, k = next(e for e in inside if classes[i].counts(e[0], e[2][0]))
        waypoints.append((u, (u, v, k)))
    for i in range(len(classes)):
        if i not in taken and any(i in enabled[s] for s in comp):
            waypoints.append((next(s for s in comp if i not in enabled[s]), None))
    cycle: list[Step] = []
    at = entry
    for u, edge in waypoints:
        cycle += _within(out, at, u)
        at = u
        if edge is not None:
            cycle.append(Step(edge[2][0], edge[2][1], edge[1]))
            at = edge[1]
    if at != entry or (not cycle and len(comp) > 1):
        if at == entry:  # a non-trivial component with no class to cover: any loop
            u, v, k = inside[0]
            cycle += _within(out, at, u)
            cycle.append(Step(k[0], k[1], v))
            at = v
        cycle += _within(out, at, entry)
    return Lasso(name, prefix, tuple(cycle))


def _hops(parent: dict[State, tuple[State, str, Param] | None], s: State) -> int:
    n = 0
    while (link := parent[s]) is not None:
        s, n = link[0], n + 1
    return n


def _path(g: nx.MultiDiGraph, sources: set[State], target: State) -> tuple[Step, ...]:
    """Shortest path from an initial state to ``target``, as steps (the first: init)."""
    back: dict[State, tuple[State, str, Param] | None] = dict.fromkeys(sources)
    queue = deque(sources)
    while queue and target not in back:
        s = queue.popleft()
        for _u, t, k in g.out_edges(s, keys=True):
            if t not in back:
                back[t] = (s, k[0], k[1])
                queue.append(t)
    steps: list[Step] = []
    cur = target
    while (link := back[cur]) is not None:
        steps.append(Step(link[1], link[2], cur))
        cur = link[0]
    steps.append(Step("init", None, cur))
    return tuple(reversed(steps))


def _within(out: dict[State, list[tuple[State, tuple[str, Param]]]], a: State,
            b: State) -> list[Step]:
    """Shortest path from ``a`` to ``b`` inside one component."""
    if a == b:
        return []
    back: dict[State, tuple[State, tuple[str, Param]] | None] = {a: None}
    queue = deque([a])
    while queue and b not in back:
        s = queue.popleft()
        for t, k in out[s]:
            if t not in back:
                back[t] = (s, k)
                queue.append(t)
    steps: list[Step] = []
    cur = b
    while (link := back[cur]) is not None:
        steps.append(Step(link[1][0], link[1][1], cur))
        cur = link[0]
    return list(reversed(steps))
