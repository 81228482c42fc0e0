"""Exhaustive breadth-first model checking of a :class:`~rolloutcore.spec.lifecycle.Spec`.

Every reachable state is visited once; every invariant is checked in every state and
every action property on every edge. Breadth-first order makes the first violation
found for a property a shortest counterexample.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import networkx as nx

from rolloutcore.spec.lifecycle import Param, Spec, State


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
