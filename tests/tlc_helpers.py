"""Test-only views of a TLC graph: states and edges keyed by value, free of TLC's node ids."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from rolloutcore.proof.tlc import TlcGraph, freeze_state


def _value_keys(
    g: TlcGraph, key: Callable[[dict[str, object]], Hashable], strict: bool
) -> dict[int, Hashable]:
    keys: dict[int, Hashable] = {}
    seen: dict[Hashable, int] = {}
    for node, state in g.states.items():
        k = key(state)
        if strict and k in seen:
            raise ValueError(
                f"key maps distinct TLC states {seen[k]} and {node} to the same value {k!r}"
            )
        seen[k] = node
        keys[node] = k
    return keys


def graph_as_value_edges(
    g: TlcGraph,
    key: Callable[[dict[str, object]], Hashable] = freeze_state,
    *,
    strict: bool = True,
) -> set[tuple[Hashable, str, Hashable]]:
    """Edges ``(key(src state), action, key(dst state))``, free of TLC node ids.

    With ``strict`` (default) a key that maps two distinct TLC states to one
    value raises ``ValueError``, since the comparison would then lose edges.
    """
    keys = _value_keys(g, key, strict)
    return {(keys[s], a, keys[d]) for s, a, d in g.edges}


def graph_value_states(
    g: TlcGraph,
    key: Callable[[dict[str, object]], Hashable] = freeze_state,
    *,
    strict: bool = True,
) -> set[Hashable]:
    """All states of the graph, as keys."""
    return set(_value_keys(g, key, strict).values())


def graph_value_initial(
    g: TlcGraph,
    key: Callable[[dict[str, object]], Hashable] = freeze_state,
    *,
    strict: bool = True,
) -> set[Hashable]:
    """The initial states of the graph, as keys."""
    keys = _value_keys(g, key, strict)
    return {keys[n] for n in g.initial}
