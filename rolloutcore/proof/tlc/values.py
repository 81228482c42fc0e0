"""TLA+ values and states as TLC prints them (traces and dot labels use one printer).

See :mod:`rolloutcore.proof.tlc` for the printed forms this parser reads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rolloutcore.errors import RolloutCoreError


class TlaParseError(RolloutCoreError, ValueError):
    """Text that is not a value or state as TLC prints them."""


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
    """Parse a printed TLC state (``/\\ x = 1\\n/\\ y = <<"a">>`` or ``x = 1``).

    A state graph repeats the same values (a fleet's member records) across tens of
    thousands of states, so each conjunct's value, and each element of a top-level
    tuple, is parsed once and reused; anything the fast path does not recognise is
    parsed (and its error reported) by the full parser."""
    try:
        return _parse_state_memoised(label)
    except TlaParseError:
        return _Parser(label).state()


def _parse_state_memoised(label: str) -> dict[str, object]:
    parts = label[3:].split("\n/\\ ") if label.startswith("/\\ ") else [label]
    out: dict[str, object] = {}
    for part in parts:
        name, sep, text = part.partition(" = ")
        if not sep or not name.isidentifier() or name in out:
            raise TlaParseError(f"not a conjunct: {part[:40]!r}")
        out[name] = _tuple_or_value(text.strip())
    return out


def _tuple_or_value(text: str) -> object:
    if text.startswith("<<") and text.endswith(">>"):
        body = text[2:-2]
        if not body.strip():
            return ()
        items = _top_level_items(body)
        if items is not None:
            return tuple(_parse_memoised(item.strip()) for item in items)
    return _parse_memoised(text)


@functools.lru_cache(maxsize=1 << 16)
def _parse_memoised(text: str) -> object:
    return parse_tla_value(text)  # values are immutable: sharing them is safe


_STRUCTURE_RE = re.compile(r'"(?:[^"\\]|\\.)*"|<<|>>|[\[\]{}(),]')
_OPENING = frozenset({"<<", "[", "{", "("})
_CLOSING = frozenset({">>", "]", "}", ")"})


def _top_level_items(body: str) -> list[str] | None:
    """``body`` split at its top-level commas (strings skipped whole), or None if its
    brackets do not balance."""
    depth, start, items = 0, 0, []
    for m in _STRUCTURE_RE.finditer(body):
        tok = m.group()
        if tok in _OPENING:
            depth += 1
        elif tok in _CLOSING:
            depth -= 1
            if depth < 0:
                return None
        elif tok == "," and depth == 0:
            items.append(body[start:m.start()])
            start = m.end()
    if depth != 0:
        return None
    items.append(body[start:])
    return items
