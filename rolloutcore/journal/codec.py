"""Journal records: their types (derived from the spec), canonical encoding, redaction
of secrets, and the hash that chains them."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from rolloutcore.spec.lifecycle import SPEC, Kind, Spec
from rolloutcore.spec.staged import JOURNAL_STEPS as STAGED_JOURNAL_STEPS

#: Version 2: outcome records carry the decision (``evidence``) they were decided on;
#: restarts are spec steps; a header may name the segment it continues.
SCHEMA = 2
ZERO_HASH = "0" * 64
REDACTED = "<redacted>"
#: The detail key under which the runner hands over an outcome's decision; the journal
#: writes it as the record's typed ``evidence`` field.
DECISION = "decision"
#: Header field of a new segment: the last good hash of the journal it continues.
CONTINUES = "continues"
#: Journal-level record types that are not spec steps.
HEADER = "header"
RECOVER = "recover"

STEP_FIELDS: tuple[str, ...] = (
    "seq", "type", "op", "step", "param", "phase", "committed", "target", "pending", "t", "prev",
)
HEADER_FIELDS: tuple[str, ...] = ("seq", "type", "schema", "spec", "t", "prev")
JEPSEN_TYPES = frozenset({"invoke", "ok", "fail", "info", "step", RECOVER})


# ------------------------------------------------------------------ record types


def jepsen_types(spec: Spec = SPEC) -> dict[str, tuple[str, str | None]]:
    """Map every controller trigger to its (Jepsen type, operation), from the spec:
    an operation's action journals as its :class:`~rolloutcore.spec.lifecycle.Result`
    says (begin ``invoke``, ok ``ok``, ambiguous ``info``, any other outcome ``fail``), a
    restart as ``recover``, every other control step (admit, publish, ...) as ``step``.
    """
    out: dict[str, tuple[str, str | None]] = {}
    for a in spec.actions:
        trigger = a.trigger
        if trigger is None:
            continue
        if a.result is not None:
            typ = a.result.jepsen
        elif a.kind is Kind.RESTART:
            typ = RECOVER
        else:
            typ = "step"
        seen = out.setdefault(trigger, (typ, a.op))
        if seen != (typ, a.op):  # actions observed alike must journal alike
            raise ValueError(f"{a.name} journals as {(typ, a.op)} but {trigger} as {seen}")
    # Staging steps change no lifecycle state; the staged spec decides them.
    for step, (_action, typ, op) in STAGED_JOURNAL_STEPS.items():
        out[step] = (typ, op)
    return out


_SPEC_TYPES = jepsen_types(SPEC)


def jepsen_type(step: str, spec: Spec = SPEC) -> str:
    """The Jepsen type of a step (``recover`` for a recovery record)."""
    table = _SPEC_TYPES if spec is SPEC else jepsen_types(spec)
    try:
        return table[step][0]
    except KeyError:
        raise KeyError(f"unknown step {step!r}") from None


# ------------------------------------------------------------------------ encoding


def _norm_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


#: Detail keys whose value is never written, compared case-insensitively and ignoring
#: ``-`` and ``_`` (``X-Api-Key`` is ``x_api_key``, ``ClientSecret`` is ``client_secret``).
#: Exact names, not substrings: ``tokens``, ``max_tokens`` or ``prompt_token_ids`` are
#: token ids and counts, and must survive.
SECRET_KEYS: frozenset[str] = frozenset(_norm_key(k) for k in (
    "authorization", "proxy-authorization", "api_key", "apikey", "x-api-key", "bearer",
    "bearer_token", "admin_token", "access_token", "auth_token", "refresh_token", "secret",
    "client_secret", "password", "cookie", "set-cookie",
))
#: A string value that looks like a credential, whatever its key: ``Bearer <token>``,
#: an OpenAI-style ``sk-...`` or a Hugging Face ``hf_...`` key, with 20+ token characters.
_CREDENTIAL = re.compile(r"\s*(?:bearer\s+|sk-|hf_)[A-Za-z0-9._~+/=-]{20,}", re.IGNORECASE)


#: Name endings that mark a secret whatever the prefix (``db_password``, ``ClientSecret``,
#: ``openai_api_key``); token-like names are matched exactly, since ``max_tokens`` and
#: ``prompt_token_ids`` are data.
SECRET_SUFFIXES: tuple[str, ...] = ("password", "secret", "apikey", "credential", "cookie")


def _is_secret(key: str) -> bool:
    hit = _SECRET_MEMO.get(key)
    if hit is None:
        k = _norm_key(key)
        hit = k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES)
        if len(_SECRET_MEMO) < 4096:  # detail keys are a small fixed set; bound it anyway
            _SECRET_MEMO[key] = hit
    return hit


_SECRET_MEMO: dict[str, bool] = {}
#: Values that are returned as they are (exact types: a str or int subclass, such as an
#: enum, takes the general path).
_PLAIN = frozenset({int, float, bool, type(None)})


def _looks_like_credential(value: str) -> bool:
    return _CREDENTIAL.match(value) is not None


def redact(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with the value of every secret key, and every
    credential-looking string, replaced by :data:`REDACTED`.

    Keys become strings (sorting mixed key types would fail) and sets sorted lists.
    """
    if type(value) in _PLAIN:
        return value
    if isinstance(value, str):
        return REDACTED if _looks_like_credential(value) else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            out[key] = REDACTED if _is_secret(key) else (
                v if type(v) in _PLAIN else redact(v))
        return out
    if isinstance(value, list | tuple):
        # Evidence carries long lists of numbers (token ids, log-probabilities).
        return [v if type(v) in _PLAIN else redact(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((redact(v) for v in value), key=repr)
    return value


#: Built once: ``json.dumps`` with options builds an encoder per call (a tenth of a
#: record's cost on the journal's hot path).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def canonical(obj: Mapping[str, Any]) -> str:
    """The canonical JSON a record's hash is computed over."""
    return _CANONICAL.encode(obj)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def seal(record: Mapping[str, Any]) -> str:
    """The hash of a record (its ``hash`` field, if any, excluded)."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return _sha(canonical(body))


def rechain(records: list[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """Recompute ``prev`` and ``hash`` of every record in order (tooling and tests); from
    record ``start`` on only, when the ones before it are sealed already (a forgery of
    record ``start`` reseals only what follows it)."""
    prev = records[start - 1]["hash"] if start else ZERO_HASH
    out: list[dict[str, Any]] = list(records[:start])
    for r in records[start:]:
        r = {k: v for k, v in r.items() if k != "hash"}
        r["prev"] = prev
        r["hash"] = prev = seal(r)
        out.append(r)
    return out


def dumps_line(record: Mapping[str, Any]) -> str:
    """One journal line (with its newline) for a record that already has its hash."""
    return canonical(record) + "\n"
