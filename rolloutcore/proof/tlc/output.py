"""Reading what TLC printed: counts, the violation, the error trace (formats:
:mod:`rolloutcore.proof.tlc`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from rolloutcore.proof.tlc.dot import TlcGraph
from rolloutcore.proof.tlc.values import parse_state

ViolationKind = Literal["invariant", "property", "deadlock", "parse", "config", "eval", "other"]


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
            kind, name = "deadlock", "Deadlock"  # the explorer's name for it
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
