"""The explorer of the specs whose actions are a table of guarded steps over a state
(failover, episodes): breadth first over every reachable state, each invariant in every
state and each action property on every edge, a shortest counterexample per violation."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

S = TypeVar("S", bound=Hashable)
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
