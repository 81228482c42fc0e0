"""The state graph TLC dumps with ``-dump dot,actionlabels`` (format:
:mod:`rolloutcore.proof.tlc`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rolloutcore.proof.tlc.values import TlaParseError, parse_state


@dataclass
class TlcGraph:
    """The state graph TLC dumped with ``-dump dot,actionlabels``.

    ``states`` maps TLC's node id (a fingerprint, different on every run) to
    the parsed state; ``edges`` holds ``(src, action, dst)``; ``initial`` the
    nodes TLC drew filled (its initial states); ``stuttering`` the nodes with
    an unlabelled dashed self-loop (only drawn when liveness is checked).
    ``closed``: the file ended with its closing braces. That does not mean the
    exploration was complete: TLC also closes it after a violation; only a run
    that exited 0 dumped the whole reachable state space.
    """

    states: dict[int, dict[str, object]] = field(default_factory=dict)
    edges: set[tuple[int, str, int]] = field(default_factory=set)
    initial: set[int] = field(default_factory=set)
    stuttering: set[int] = field(default_factory=set)
    closed: bool = False


_NODE_RE = re.compile(r'^(-?\d+) \[label="((?:[^"\\]|\\.)*)"(.*)\]\s*;?\s*$')
_EDGE_RE = re.compile(r"^(-?\d+) -> (-?\d+)(?: \[(.*)\])?\s*;?\s*$")
_ATTR_RE = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([\w.]+))')
_DOT_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def _unescape_dot(s: str) -> str:
    # The common case, every state label: its only escapes are \n and \" (no regex needed).
    if s.count("\\") == s.count("\\n") + s.count('\\"'):
        return s.replace("\\n", "\n").replace('\\"', '"')
    return _DOT_ESCAPE_RE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), s)


def _dot_attrs(text: str) -> dict[str, str]:
    return {
        m.group(1): _unescape_dot(m.group(2)) if m.group(2) is not None else m.group(3)
        for m in _ATTR_RE.finditer(text)
    }


def parse_dot_text(text: str) -> TlcGraph:
    """Parse the text of a ``-dump dot,actionlabels`` file (see module doc)."""
    g = TlcGraph()
    closing = 0
    lines = text.splitlines()
    last = max((i for i, raw in enumerate(lines, 1) if raw.strip()), default=0)
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if line == "}":
            closing += 1
            continue
        closing = 0
        if line.startswith(("strict digraph", "digraph", "subgraph", "{rank", "nodesep", "color")):
            continue
        m = _EDGE_RE.match(line)
        if m:
            src, dst = int(m.group(1)), int(m.group(2))
            attrs = _dot_attrs(m.group(3) or "")
            if "label" in attrs:
                g.edges.add((src, attrs["label"], dst))
            elif attrs.get("style") == "dashed" and src == dst:
                g.stuttering.add(src)
            else:
                raise TlaParseError(f"dot line {lineno}: edge without action label: {line!r}")
            continue
        m = _NODE_RE.match(line)
        if m:
            node = int(m.group(1))
            try:
                state = parse_state(_unescape_dot(m.group(2)))
            except TlaParseError as e:
                raise TlaParseError(f"dot line {lineno}: {e}") from e
            if node in g.states and g.states[node] != state:
                raise TlaParseError(f"dot line {lineno}: node {node} labelled twice")
            g.states[node] = state
            if _dot_attrs(m.group(3)).get("style") == "filled":
                g.initial.add(node)
            continue
        if lineno == last:
            break  # a dump cut short mid-line; closed stays False
        raise TlaParseError(f"dot line {lineno}: unrecognised line {line!r}")
    g.closed = closing >= 2
    if g.closed:
        missing = {n for s, _, d in g.edges for n in (s, d)} - g.states.keys()
        missing |= g.stuttering - g.states.keys()
        if missing:
            raise TlaParseError(f"dot graph has edges to unlabelled nodes {sorted(missing)[:5]}")
    return g


def parse_dot_graph(path: Path) -> TlcGraph:
    """Parse a ``-dump dot,actionlabels`` file written by TLC."""
    return parse_dot_text(Path(path).read_text(encoding="utf-8"))
