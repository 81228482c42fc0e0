"""The explorer of the specs whose actions are a table of guarded steps over a state
(failover, episodes): breadth first over every reachable state, each invariant in every
state and each action property on every edge, a shortest counterexample per violation."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Any, Generic, TypeVar

S = TypeVar("S", bound=Hashable)
T = TypeVar("T")
Param = tuple[object, ...]


@dataclass
class GraphExploration(Generic[S]):
    states: int
    edges: int
    violations: dict[str, list[tuple[str, Param]]]
    unreachable: tuple[str, ...]
    graph: set[tuple[S, str, S]]
    nodes: set[S]
    initial: tuple[S, ...]
    seconds: float
    #: Every edge with its parameter, kept when asked for (the liveness check).
    steps: list[tuple[S, str, Param, S]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def explore_graph(initial: tuple[S, ...],
                  successors: Callable[[S], Iterable[tuple[str, Param, S]]],
                  actions: Sequence[str],
                  invariants: Sequence[tuple[str, Callable[[S], bool]]],
                  action_properties: Sequence[tuple[str, Callable[[S, S], bool]]] = (), *,
                  what: str, max_states: int = 2_000_000, stop_at_violation: bool = False,
                  keep_steps: bool = False) -> GraphExploration[S]:
    """Every state reachable from ``initial`` by ``successors``; ``actions`` are the
    names an edge may carry (those never taken are reported unreachable)."""
    t0 = time.perf_counter()
    parent: dict[S, tuple[S, str, Param] | None] = dict.fromkeys(initial)
    queue: deque[S] = deque(initial)
    edges: set[tuple[S, str, S]] = set()
    steps: list[tuple[S, str, Param, S]] = []
    violations: dict[str, list[tuple[str, Param]]] = {}
    fired: set[str] = set()

    def path(f: S) -> list[tuple[str, Param]]:
        out: list[tuple[str, Param]] = []
        link = parent[f]
        while link is not None:
            out.append((link[1], link[2]))
            link = parent[link[0]]
        return out[::-1]

    def check(f: S) -> None:
        for name, holds in invariants:
            if name not in violations and not holds(f):
                violations[name] = path(f)

    for f0 in initial:
        check(f0)
    while queue and not (stop_at_violation and violations):
        f = queue.popleft()
        for name, p, g in successors(f):
            fired.add(name)
            edges.add((f, name, g))
            if keep_steps:
                steps.append((f, name, p, g))
            for prop, holds2 in action_properties:
                if prop not in violations and not holds2(f, g):
                    violations[prop] = [*path(f), (name, p)]
            if g not in parent:
                parent[g] = (f, name, p)
                check(g)
                queue.append(g)
                if len(parent) > max_states:
                    raise RuntimeError(f"more than {max_states} {what} states")
    return GraphExploration(len(parent), len(edges), violations,
                            tuple(a for a in actions if a not in fired), edges, set(parent),
                            initial, time.perf_counter() - t0, steps)


# ------------------------------------------------------------ specs written as a table

B = TypeVar("B")


@dataclass(frozen=True)
class TableAction(Generic[S, B]):
    """One action of a table spec: ``params`` names its parameters (each ranges over
    the domain of that name), ``when`` its guard, ``apply`` its effect, both over a
    state, the bounds and a parameter tuple; ``tla`` its TLA+ body over the same names."""

    name: str
    doc: str
    params: tuple[str, ...]
    when: Callable[[S, B, Param], bool]
    apply: Callable[[S, B, Param], S]
    tla: str


@dataclass(frozen=True)
class TableInvariant(Generic[S, B]):
    name: str
    doc: str
    tla: str
    holds: Callable[[S, B], bool]


@dataclass(frozen=True)
class TableProperty(Generic[S, B]):
    """A property of every step (``[][tla]_vars``)."""

    name: str
    doc: str
    tla: str
    holds: Callable[[S, S, B], bool]


def with_params(actions: Sequence[TableAction[S, B]], domains: dict[str, Iterable[object]]
                ) -> tuple[tuple[TableAction[S, B], tuple[Param, ...]], ...]:
    """Each action with every parameter tuple it may take."""
    out = []
    for a in actions:
        ps: list[Param] = [()]
        for n in a.params:
            ps = [(*p, v) for p in ps for v in domains[n]]
        out.append((a, tuple(ps)))
    return tuple(out)


def table_successors(params: tuple[tuple[TableAction[S, B], tuple[Param, ...]], ...],
                     f: S, b: B) -> list[tuple[str, Param, S]]:
    return [(a.name, p, a.apply(f, b, p)) for a, ps in params for p in ps if a.when(f, b, p)]


def explore_table(initial: tuple[S, ...], successors: Callable[[S], Iterable[tuple[str, Param, S]]],
                  actions: Sequence[TableAction[S, B]],
                  invariants: Sequence[TableInvariant[S, B]],
                  properties: Sequence[TableProperty[S, B]], bounds: B, *, what: str,
                  max_states: int = 2_000_000, stop_at_violation: bool = False
                  ) -> GraphExploration[S]:
    """:func:`explore_graph` over a table spec's actions and properties at ``bounds``."""
    return explore_graph(
        initial, successors, [a.name for a in actions],
        [(i.name, partial(_inv_holds, i, bounds)) for i in invariants],
        [(p.name, partial(_prop_holds, p, bounds)) for p in properties],
        what=what, max_states=max_states, stop_at_violation=stop_at_violation)


def _inv_holds(inv: TableInvariant[S, B], b: B, f: S) -> bool:
    return inv.holds(f, b)


def _prop_holds(prop: TableProperty[S, B], b: B, f: S, g: S) -> bool:
    return prop.holds(f, g, b)


def tla_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def table_module(name: str, source: str, *, extends: str, constants: Sequence[str],
                 preamble: Sequence[str], variables: Sequence[str],
                 actions: Sequence[TableAction[S, B]], domains: dict[str, str],
                 invariants: Sequence[TableInvariant[S, B]],
                 properties: Sequence[TableProperty[S, B]] = ()) -> str:
    """The TLA+ module of a table spec: its constants, ``preamble`` (sets, Init and
    helper definitions), one operator per action, Next, Spec and the properties."""
    parts = [
        f"---------------------------- MODULE {name} ----------------------------",
        f"\\* Generated from {source} by `rolloutcore spec tla`.",
        "\\* Do not edit: change the Python spec and regenerate.",
        f"EXTENDS {extends}", "", f"CONSTANTS {', '.join(constants)}", "",
        f"VARIABLES {', '.join(variables)}", f"vars == <<{', '.join(variables)}>>", "",
        *preamble, ""]
    for a in actions:
        head = tla_name(a.name) + (f"({', '.join(a.params)})" if a.params else "")
        parts.append(f"\\* {a.name}: {a.doc}\n{head} ==\n    {a.tla}\n")
    disj = []
    for a in actions:
        call = tla_name(a.name) + (f"({', '.join(a.params)})" if a.params else "")
        binders = "".join(f"\\E {p} \\in {domains[p]} : " for p in a.params)
        disj.append(binders + call)
    parts += ["Next ==\n" + "\n".join(f"    \\/ {d}" for d in disj), "",
              "Spec == Init /\\ [][Next]_vars", "", "\\* ---- invariants"]
    parts += [f"\\* {inv.doc}\n{inv.name} ==\n    {inv.tla}\n" for inv in invariants]
    if properties:
        parts.append("\\* ---- action properties")
        parts += [f"\\* {p.doc}\n{p.name} ==\n    [][{p.tla}]_vars\n" for p in properties]
    parts.append("=" * 78)
    return "\n".join(parts) + "\n"


def table_config(constants: dict[str, int], invariants: Sequence[TableInvariant[S, B]],
                 properties: Sequence[TableProperty[S, B]] = ()) -> str:
    return "\n".join([
        "\\* Generated by `rolloutcore spec tla`. Do not edit.", "CONSTANTS",
        *(f"    {k} = {v}" for k, v in constants.items()), "SPECIFICATION Spec",
        "INVARIANTS", *(f"    {i.name}" for i in invariants),
        *(["PROPERTIES", *(f"    {p.name}" for p in properties)] if properties else []),
    ]) + "\n"


class TableSpec:
    """What every table spec (a frozen dataclass with ``actions`` and ``bounds``) offers:
    other bounds, an action by name, and an action replaced (a mutant)."""

    actions: tuple[TableAction[Any, Any], ...]
    invariants: tuple[TableInvariant[Any, Any], ...]
    bounds: Any
    #: What an exploration's error names the spec.
    what: str = "table"

    def domains(self) -> dict[str, Iterable[object]]:
        """Each parameter name's domain at the spec's bounds."""
        raise NotImplementedError

    def initial_states(self) -> tuple[Any, ...]:
        raise NotImplementedError

    @cached_property
    def action_params(self) -> tuple[tuple[Any, tuple[Param, ...]], ...]:
        """Each action with every parameter its domains give (once per spec)."""
        return with_params(self.actions, self.domains())

    def successors(self, f: Any) -> list[tuple[str, Param, Any]]:
        return table_successors(self.action_params, f, self.bounds)

    def explore(self, *, max_states: int = 2_000_000,
                stop_at_violation: bool = False) -> GraphExploration[Any]:
        """Every reachable state; invariants in every state, step properties (a spec's
        ``properties``, if it has any) on every edge."""
        return explore_table(self.initial_states(), self.successors, self.actions,
                             self.invariants, getattr(self, "properties", ()), self.bounds,
                             what=self.what, max_states=max_states,
                             stop_at_violation=stop_at_violation)

    def with_bounds(self: T, bounds: Any) -> T:
        return replace(self, bounds=bounds)  # type: ignore[type-var]

    def action(self, name: str) -> TableAction[Any, Any]:
        return next(a for a in self.actions if a.name == name)

    def replace_action(self: T, name: str, **changes: Any) -> T:
        actions = self.actions  # type: ignore[attr-defined]
        if name not in {a.name for a in actions}:
            raise KeyError(name)
        return replace(self, actions=tuple(  # type: ignore[type-var]
            replace(a, **changes) if a.name == name else a for a in actions))

    def tla_replaced(self, action: str, old: str, new: str) -> str:
        """``action``'s TLA+ body with ``old`` (which it must contain) replaced (a mutant's
        TLA+ beside its Python)."""
        tla = self.action(action).tla
        if old not in tla:
            raise ValueError(f"{action}: no {old!r} in its TLA+")
        return tla.replace(old, new)
