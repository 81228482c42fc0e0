"""Every field a journal record states: its schema, and the rule that checks it, or why it
is informational. The one place that says so; the trace checkers call it, and the
checkers' own mutation test (``rolloutcore.conformance.forge``) counts a forged field as
harmless only if this module declares it informational.

A journal claims three kinds of things:

* **steps** (the record's step, phase, generations, pending operation, parameter):
  checked against the spec by :mod:`rolloutcore.check.trace`;
* **decisions** (an outcome's evidence and what it expected): re-decided by
  :func:`rolloutcore.engine.postconditions.decide`, and the expectation held to the generation
  it is about, below;
* **references**: what a generation *is* (label, weight identity, probe prompt and
  reference, tolerance). The update request names its target's reference; the initial
  generation's is the one its bootstrap verified. Every later record that speaks of a
  generation (the mutation, validation, the probe, the publish, an audit, a re-admission,
  the fence's label) must name that generation's reference exactly, so a journal whose
  publish names other weights than validation verified is rejected, and so is an audit
  "against itself" onto other weights.

Everything else in a record is informational: words (reasons, errors), timings,
counters of attempts, the application's own notes, and evidence fields that the
decision's operation does not read (:data:`EVIDENCE_INFO`). Their *schema* is still
checked (a wrong type or an unknown key is a Schema rejection): only their values are
free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rolloutcore.engine.identity import ADAPTER_JOIN
from rolloutcore.spec.lifecycle import SPEC, TIERS, Kind, Phase, Result
from rolloutcore.spec.triggers import OUTCOMES, Trigger

# ------------------------------------------------------------------------ schema


def _is_num(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


_KINDS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: type(v) is str,
    "int": lambda v: type(v) is int,
    "num": _is_num,
    "bool": lambda v: type(v) is bool,
    "obj": lambda v: isinstance(v, dict),
    "list[str]": lambda v: isinstance(v, list) and all(type(x) is str for x in v),
    "list[int]": lambda v: isinstance(v, list) and all(type(x) is int for x in v),
    "json": lambda v: True,
}


@dataclass(frozen=True)
class Info:
    """Informational: the checkers read no decision from its value."""

    reason: str


@dataclass(frozen=True)
class Claim:
    """Checked: ``rule`` says against what."""

    rule: str


@dataclass(frozen=True)
class Field:
    kind: str
    role: Claim | Info
    required: bool = False

    def conforms(self, v: Any) -> bool:
        if self.kind.endswith("?"):
            return v is None or _KINDS[self.kind[:-1]](v)
        return _KINDS[self.kind](v)


#: How much later than its attempt's deadline an outcome may be written before the trace
#: checker reports it: the runner's own grace for a late call, the journal's write and
#: the clock (wall-clock times can step), together.
TIMING_SLACK_S = 1.0
_DEADLINE = Field("num", Info(
    "the attempt's deadline as the runner's policy set it: the timing check holds the "
    "outcome to it (plus TIMING_SLACK_S); no decision of the spec reads it"))
_REASON = Field("str", Info("the decision's reason in words: decide() names it again from "
                            "the evidence"))
_APPLICATION = Info("the application's own notes about the rollout (token counts, the "
                    "route it came by): RolloutCore decides nothing by them")
_WHO = Info("who asked, in words")
_CHECKPOINT = Info("where the bytes came from (a path on the writer's machine): the "
                   "identity, not the path, is what was verified; recovery, the one reader, "
                   "digests the bytes there and refuses them unless they have it")
_TARGET_LABEL = Claim("the label of the target the update request named")
_TARGET_IDENTITY = Claim("the identity of the target the update request named")
_COMMITTED_LABEL = Claim("the committed generation's label")
_COMMITTED_IDENTITY = Claim("the committed generation's identity")
_PROBE = Field("obj", Claim("the target's probe: prompt, reference (tokens or scores) and "
                            "tolerance; every later probe and expectation must be it"),
               required=True)

_STAGED = Field("bool", Info("a staged update (spec/staged.py): every rank staged and "
                              "prepared the target while the engine served; the mutation "
                              "installs the prepared buffers (the trace checker steps the "
                              "staged spec's table from the staging records)"))

#: Detail fields per step. A step missing here takes no detail; ``None``: an open object
#: (the application's).
DETAIL: dict[str, dict[str, Field] | None] = {
    Trigger.ADMIT: None,
    Trigger.RELEASE: None,
    Trigger.RELEASE_ABORTED: None,
    Trigger.REQUEST_UPDATE: {
        "target": Field("str", _TARGET_LABEL, required=True),
        "identity": Field("str", _TARGET_IDENTITY, required=True),
        "probe": _PROBE,
        "checkpoint": Field("str", _CHECKPOINT),
        "adapter": Field("str", Claim(
            "the LoRA adapter an adapter update installs (served under that name): the "
            "identity then names base and adapter, on the base the engine serves")),
        "staged": _STAGED,
        "drain_s": Field("num", Info(
            "how long the drain may wait: the trace checker's closed-window bound adds it "
            "(timing; a warning unless --strict)")),
    },
    Trigger.CANCEL_UPDATE: {"reason": _REASON,
                            "target": Field("str", _TARGET_LABEL, required=True),
                            "identity": Field("str", _TARGET_IDENTITY, required=True)},
    Trigger.MUTATE_BEGIN: {
        "target": Field("str", _TARGET_LABEL, required=True),
        "identity": Field("str", _TARGET_IDENTITY, required=True),
        "deadline_s": _DEADLINE,
        "backend": Field("str", Info("the transfer backend's name")),
        "staged": _STAGED,
        "headers": Field("obj", Info("transport headers, redacted")),
    },
    Trigger.PUBLISH: {
        "label": Field("str", _TARGET_LABEL, required=True),
        "identity": Field("str", _TARGET_IDENTITY, required=True),
        "checkpoint": Field("str", _CHECKPOINT),
    },
    Trigger.GIVE_UP: {"reason": _REASON, "after": Field("str", Info("the step given up on, "
                                                                    "in words"))},
    Trigger.READMIT_BEGIN: {
        "who": Field("str", _WHO),
        "target": Field("str", _COMMITTED_LABEL, required=True),
        "identity": Field("str", _COMMITTED_IDENTITY, required=True),
        "checkpoint": Field("str", _CHECKPOINT),
    },
    Trigger.SUSPECT: {"error": Field("str", Info("what the application saw, in words")),
                      "rollout": Field("str", Info("the rollout whose request failed"))},
}
DETAIL[Trigger.READMIT_BEGIN] = {**(DETAIL[Trigger.READMIT_BEGIN] or {}),
                                 "deadline_s": _DEADLINE}
for _op, _outcomes in OUTCOMES.items():  # every attempt's begin states its deadline
    _begin = _outcomes[Result.BEGIN]
    if _begin not in DETAIL:
        DETAIL[_begin] = {"deadline_s": _DEADLINE}
for _restart in (Trigger.RESTART_READY, Trigger.RESTART_TAINTED, Trigger.RESTART_UNINITIALIZED):
    DETAIL[_restart] = {
        "from_phase": Field("str", Claim("the phase the journal left the controller in"),
                            required=True),
        "reason": _REASON,
    }
#: Every outcome record: the reason; an audit's the reason it was asked for; a
#: bootstrap's the initial generation's checkpoint and label.
_OUTCOME_DETAIL: dict[str, Field] = {"reason": _REASON}
_AUDIT_DETAIL = {**_OUTCOME_DETAIL, "why": Field("str", _WHO)}
_BOOTSTRAP_DETAIL = {**_OUTCOME_DETAIL, "checkpoint": Field("str", _CHECKPOINT),
                     "label": Field("str", Claim("the initial generation's label, the same "
                                                 "in every bootstrap outcome, and what the "
                                                 "bootstrap expected"), required=True)}
for _a in SPEC.actions:
    if _a.kind is Kind.OUTCOME and _a.trigger is not None:
        DETAIL.setdefault(_a.trigger, _BOOTSTRAP_DETAIL if _a.op == "bootstrap"
                          else _AUDIT_DETAIL if _a.op == "audit" else _OUTCOME_DETAIL)

#: Fleet steps' detail (checked by rolloutcore.check.fleet_trace).
_FLOOR = Field("int", Claim("the fleet's floor after the step (the fleet spec's effect)"),
               required=True)
FLEET_DETAIL: dict[str, dict[str, Field]] = {
    "fleet_open": {"members": Field("list[str]", Claim("the members verified at the open"),
                                    required=True),
                   "min_serving": Field("int", Claim("the quorum the fleet runs with"),
                                        required=True),
                   "max_live": Field("int", Claim("K: generations served at once (absent: 1, "
                                                  "strict updates)")),
                   "min_admitting": Field("int", Claim("C: members serving through a "
                                                       "rolling update (absent: 0)"))},
    "fleet_request_update": {
        "target": Field("str", Claim("the label every participant's request names"),
                        required=True),
        "identity": Field("str", Info("the first participant's target identity (each "
                                      "member's own request names its own, checked there)")),
        "members": Field("list[str]", Claim("the serving members, which take part"),
                         required=True),
        "min_serving": Field("int", Claim("this update's quorum (1..members): the fleet "
                                          "spec's guards of its request and decision use "
                                          "it"), required=True)},
    "fleet_publish": {
        "members": Field("list[str]", Claim("exactly the validated members"), required=True),
        "label": Field("str", Claim("the fleet's target label"), required=True),
        "min_serving": Field("int", Claim("the quorum the update's request named"),
                             required=True),
        "identity": Field("str", Info("the first participant's target identity (each "
                                      "member's publish names its own, checked there)"))},
    "fleet_abort": {
        "validated": Field("list[str]", Claim("exactly the validated members"), required=True),
        "needed": Field("int", Claim("the quorum the update's request named"),
                        required=True),
        "held_back": Field("list[str]", Claim("exactly the members held back"))},
    "fleet_reopen": {"serving": Field("list[str]", Claim("exactly the serving members"),
                                      required=True)},
    "fleet_close": {"serving": Field("list[str]", Claim("exactly the serving members"),
                                     required=True),
                    "min_serving": Field("int", Claim("the quorum"), required=True)},
    "fleet_recover": (_RECOVERED := {
        "serving": Field("int", Claim("how many members serve"), required=True),
        "min_serving": Field("int", Claim("the quorum"), required=True)}),
    "fleet_recover_closed": _RECOVERED,
    "fleet_roll": {
        "target": Field("str", Claim("the label every wave member's request names"),
                        required=True),
        "identity": Field("str", Info("the first wave member's target identity (each "
                                      "member's own request names its own, checked there)")),
        "members": Field("list[str]", Claim("the wave: members on the frontier, each "
                                            "joining while min_admitting others serve, "
                                            "as many as wave_width allows"),
                         required=True),
        "max_live": Field("int", Claim("the fleet's K, as its fleet_open stated it"),
                          required=True),
        "min_admitting": Field("int", Claim("the fleet's C, as its fleet_open stated it"),
                               required=True),
        "floor": _FLOOR},
    "fleet_publish_wave": {
        "members": Field("list[str]", Claim("exactly the validated members"), required=True),
        "label": Field("str", Claim("the fleet's target label"), required=True),
        "identity": Field("str", Info("the first wave member's target identity (each "
                                      "member's publish names its own, checked there)")),
        "floor": _FLOOR},
    "fleet_end_wave": {"members": Field("list[str]", Claim("the validated members: none"),
                                        required=True), "floor": _FLOOR},
    "fleet_abort_wave": {
        "validated": Field("list[str]", Claim("exactly the validated members"), required=True),
        "needed": Field("int", Claim("the quorum"), required=True), "floor": _FLOOR},
    "fleet_raise_floor": {"floor": _FLOOR},
    "fleet_takeover": {
        "epoch": Field("int", Info("the store's revision of the leader key, which no "
                                   "journal can show: the checker still requires it above "
                                   "every earlier takeover's and named by fleet_fenced"),
                       required=True),
        "controller": Field("str", Info("who took over, in the operator's words (the "
                                        "epoch is what is checked)"), required=True),
        "fenced": Field("list[str]", Claim("members fenced with the epoch (with unfenced: "
                                           "every member once)"), required=True),
        "unfenced": Field("list[str]", Claim("members not fenced: no admission or audit on "
                                             "them until fleet_fenced names them"),
                          required=True)},
    "fleet_fenced": {
        "epoch": Field("int", Claim("the last takeover's epoch"), required=True),
        "fenced": Field("list[str]", Claim("members that takeover left unfenced"),
                        required=True)},
    "migrate": {
        "rollout": Field("str", Claim("the rollout the two members' records just released "
                                      "and admitted"), required=True),
        "members": Field("list[str]", Claim("the member it left (draining), the member it "
                                            "joined (serving its generation)"),
                         required=True),
        "generation": Field("int", Claim("its generation, on both members"), required=True)},
}

#: Top-level fields every record has (the chain's own, ``hash`` and ``prev``, are the
#: journal reader's).
TOP_LEVEL: dict[str, Field] = {
    "t": Field("num", Info("wall-clock time of the write: clocks step and are not ordered; "
                           "the sequence number orders the journal")),
}


def detail_problem(step: str, detail: Any, table: Mapping[str, Mapping[str, Field] | None]
                   = DETAIL) -> str | None:
    """Why ``detail`` is not a valid detail of ``step`` (None: it is)."""
    if step not in table:
        return None if detail is None else f"{step} takes no detail"
    fields = table[step]
    if detail is None:
        detail = {}
    if not isinstance(detail, dict):
        return f"{step}: detail is not an object"
    if fields is None:
        return None
    for key, v in detail.items():
        f = fields.get(key)
        if f is None:
            return f"{step}: unknown detail field {key!r:.40}"
        if not f.conforms(v):
            return f"{step}: detail.{key} is not {f.kind}: {v!r:.40}"
    missing = [k for k, f in fields.items() if f.required and k not in detail]
    if missing:
        return f"{step}: detail lacks {', '.join(missing)}"
    return None


# ------------------------------------------------------------------------ references


@dataclass(frozen=True)
class Reference:
    """What a generation is, as the journal established it."""

    label: str
    identity: str
    prompt: tuple[int, ...] | None = None
    tokens: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    tolerance: float | None = None

    @staticmethod
    def of_request(detail: Mapping[str, Any]) -> Reference | str:
        """The target an update request names (or why its probe is malformed)."""
        p = detail.get("probe")
        if not isinstance(p, dict) or set(p) != {"prompt", "tokens", "logprobs", "tolerance"} \
                or not _KINDS["list[int]"](p["prompt"]) or not p["prompt"] \
                or not (p["tokens"] is None or _KINDS["list[int]"](p["tokens"])) \
                or not (p["logprobs"] is None or (isinstance(p["logprobs"], list) and all(
                    _is_num(x) for x in p["logprobs"]))) \
                or (p["tokens"] is None) == (p["logprobs"] is None) \
                or not _is_num(p["tolerance"]) or p["tolerance"] < 0:
            return ("request_update: detail.probe is not {prompt, tokens | logprobs (one of "
                    "them), tolerance}")
        return Reference(str(detail.get("target")), str(detail.get("identity")),
                         tuple(p["prompt"]),
                         _tuple(p["tokens"]), _tuple(p["logprobs"]), p["tolerance"])

    def expected_problem(self, expected: Any, what: str) -> str | None:
        """Why a decision's ``expected`` is not this reference (None: it is)."""
        if not isinstance(expected, Mapping):
            return f"{what} expects nothing, not {self.label!r}"
        got = (expected.get("label"), expected.get("identity"))
        if got != (self.label, self.identity):
            return (f"{what} was decided against label {got[0]!r}, identity "
                    f"{str(got[1])[:16]}; {self.described}")
        if self.tolerance is None:
            return None  # the probe reference is not known (a continuing segment)
        probe = (_tuple(expected.get("probe_tokens")), _tuple(expected.get("probe_logprobs")),
                 expected.get("tolerance"))
        if probe != (self.tokens, self.logprobs, self.tolerance):
            return f"{what} was decided against another probe reference than {self.described}"
        return None

    @property
    def described(self) -> str:
        return f"the generation is {self.label!r}, identity {self.identity[:16]}"

    def probe_json(self) -> dict[str, Any]:
        return {"prompt": list(self.prompt or ()), "tokens": _list(self.tokens),
                "logprobs": _list(self.logprobs), "tolerance": self.tolerance}


def _tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _list(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def request_detail(label: str, identity: str, prompt: tuple[int, ...],
                   tokens: tuple[int, ...] | None, logprobs: tuple[float, ...] | None,
                   tolerance: float) -> dict[str, Any]:
    """The detail of an update request (the runner's, the tour's, the corpus's)."""
    return {"target": label, "identity": identity,
            "probe": Reference(label, identity, prompt, tokens, logprobs,
                               tolerance).probe_json()}


# ------------------------------------------------------------------------ evidence

#: The pause mode each pausing operation must have used.
PAUSE_MODE = {"pause": "wait", "pause_abort": "abort", "readmit": "abort"}
#: Operations whose engine read is taken while the engine must be quiet (paused, nothing
#: running: EngineQuietWhileClosed; a re-admission's read comes after its abort-mode
#: pause and before its resume).
QUIET_READS = frozenset({"validate", "readmit", "mutate"})


def _mode(decision: Mapping[str, Any]) -> str:
    exp = decision.get("expected") or {}
    return "scored" if exp.get("probe_logprobs") is not None else "greedy"


#: (op, decision json, the evidence object) -> whether the field is informational there.
Condition = Callable[[str, Mapping[str, Any], Mapping[str, Any]], bool]


def _always(_op: str, _d: Mapping[str, Any], _e: Mapping[str, Any]) -> bool:
    return True


def _unless_quiet(op: str, _d: Mapping[str, Any], _e: Mapping[str, Any]) -> bool:
    return op not in QUIET_READS


def _hits_unread(op: str, d: Mapping[str, Any], e: Mapping[str, Any]) -> bool:
    first = (d.get("expected") or {}).get("first_since_reset")
    return op in ("bootstrap", "audit") or not first or e.get("prefix_hits") in (0, None)


#: Evidence fields whose value the decision of the operation does not read, with the
#: condition under which that is so and the reason.
EVIDENCE_INFO: dict[tuple[str, str], tuple[Condition, str]] = {
    ("EngineReport", "running_requests"): (
        _unless_quiet, "a serving engine runs requests: the count is context (in a "
        "validation and a re-admission it must be 0: the engine is quiet)"),
    ("PauseEvidence", "http_status"): (_always, "the read-back decides, whatever the call "
                                                "answered"),
    ("PauseEvidence", "body"): (_always, "the read-back decides, whatever the call answered"),
    ("ResumeEvidence", "http_status"): (_always, "the read-back decides, whatever the call "
                                                 "answered"),
    ("ResumeEvidence", "body"): (_always, "the read-back decides, whatever the call "
                                          "answered"),
    ("FenceEvidence", "pause_status"): (_always, "the read-backs (paused, label, running) "
                                                 "decide"),
    ("FenceEvidence", "label_status"): (_always, "the read-backs (paused, label, running) "
                                                 "decide"),
    ("FenceEvidence", "error"): (_always, "the read-backs decide; the words say what went "
                                          "wrong"),
    ("MutationEvidence", "observed"): (_always, "what the adapter saw, in words: the "
                                                "outcome field is the claim, re-decided"),
    ("MutationEvidence", "seconds"): (_always, "how long the mutation took: a timing, "
                                               "bounded by its deadline"),
    ("MutationEvidence", "bytes_moved"): (_always, "a size, for the record: the identity "
                                                   "read afterwards is the claim"),
    ("ResetEvidence", "body_success"): (
        _always, "one of three confirmations of a reset (the body, the entry count, the "
        "engine's proof that it has no such cache); the first that settles it decides (and "
        "is re-decided), the others are context"),
    ("ResetEvidence", "entries_after"): (_always, "as body_success: one of three "
                                                  "confirmations, the first that settles "
                                                  "it decides"),
    ("ResetEvidence", "tier_absent"): (_always, "as body_success: one of three "
                                                "confirmations, the first that settles it "
                                                "decides"),
    ("ProbeEvidence", "http_status"): (_always, "the tokens or scores decide; the status "
                                                "is how they arrived"),
    ("ProbeEvidence", "finish_reason"): (_always, "the tokens decide (a shorter output "
                                                  "differs from the reference)"),
    ("ProbeEvidence", "logprobs"): (_always, "the sampled tokens' log-probabilities: the "
                                             "greedy probe compares tokens"),
    ("ProbeEvidence", "error"): (_always, "the words of a failure; a failure is decided "
                                          "by the missing output"),
    ("ProbeEvidence", "prefix_hits"): (
        _hits_unread,
        "hits prove stale reuse only on the first request after an invalidation (a serving "
        "engine's probe, or a later attempt, may hit its cache); no hits read and 0 hits "
        "say the same"),
    ("ProbeEvidence", "tokens"): (lambda _o, d, _e: _mode(d) == "scored",
                                  "a scored probe compares scores, not tokens"),
    ("ProbeEvidence", "prompt_logprobs"): (lambda _o, d, _e: _mode(d) == "greedy",
                                           "a greedy probe compares tokens, not scores"),
}


#: Outcome results whose evidence is believed only as far as the outcome itself.
NEGATIVE_TYPES = frozenset({"fail", "info"})
NEGATIVE_REASON = ("a negative outcome (failed, refused, mismatch, ambiguous) is believed "
                   "only as far as its outcome, re-decided from the evidence (a forgery that "
                   "would make it positive is caught); which of its reasons the engine gave "
                   "changes no state")

#: Decision fields outside the evidence list that are informational.
DECISION_INFO: dict[str, str] = {
    "facts": "attempt counters and timings",
    "error": "what stopped the call, in words: that it stopped decides",
}


def informational_fields() -> list[tuple[str, str, str]]:
    """Every declared informational field: (where, field, why), for review."""
    out = [("every record", k, f.role.reason) for k, f in TOP_LEVEL.items()
           if isinstance(f.role, Info)]
    seen: dict[tuple[str, str], list[str]] = {}
    for table in (DETAIL, FLEET_DETAIL):
        for step, fields in table.items():
            if fields is None:
                out.append((str(step), "detail.*", _APPLICATION.reason))
                continue
            for key, f in fields.items():
                if isinstance(f.role, Info):
                    seen.setdefault((f"detail.{key}", f.role.reason), []).append(str(step))
    for (key, reason), steps in seen.items():
        out.append((", ".join(steps) if len(steps) < 4 else f"{len(steps)} steps", key, reason))
    out += [("every decision", f"evidence.{k}", why) for k, why in DECISION_INFO.items()]
    out += [(kind, f"evidence.evidence[{kind}].{name}", why)
            for (kind, name), (_c, why) in EVIDENCE_INFO.items()]
    out.append(("negative outcomes", "evidence.evidence[*].*", NEGATIVE_REASON))
    out.append(("references nothing compared", "(see the reason)", UNUSED_REASON))
    return out


def informational(rec: Mapping[str, Any], path: tuple[str | int, ...]) -> bool:
    """Whether the field at ``path`` in ``rec`` is declared informational (its value
    free; its schema still checked)."""
    top = path[0]
    if top in TOP_LEVEL:
        return isinstance(TOP_LEVEL[str(top)].role, Info)
    step = str(rec.get("step", ""))
    if top == "detail":
        table = FLEET_DETAIL if step in FLEET_DETAIL else DETAIL
        fields = table.get(step)
        if fields is None:
            return step in table  # an application's open detail
        if len(path) == 1:  # the whole detail: informational if every field of it is
            return all(isinstance(f.role, Info) and not f.required for f in fields.values())
        f = fields.get(str(path[1]))
        return f is not None and isinstance(f.role, Info)
    if top == "evidence" and len(path) >= 2:
        d = rec.get("evidence") or {}
        if path[1] in DECISION_INFO:
            return True
        if path[1] == "evidence" and len(path) >= 4 and isinstance(path[2], int):
            evs = d.get("evidence") or []
            ev = evs[path[2]] if path[2] < len(evs) else {}
            rule = EVIDENCE_INFO.get((str(ev.get("type")), str(path[3])))
            if rule is not None and rule[0](str(d.get("op")), d, ev):
                return True
            return rec.get("type") in NEGATIVE_TYPES
    return False


def path_name(rec: Mapping[str, Any], path: tuple[str | int, ...]) -> str:
    """A field's name: its path, with list elements named by their evidence type."""
    out: list[str] = []
    node: Any = rec
    for p in path:
        if isinstance(p, int):
            elem = node[p] if isinstance(node, list) and p < len(node) else None
            out[-1] += f"[{elem.get('type')}]" if isinstance(elem, dict) and "type" in elem \
                else "[]"
        else:
            out.append(p)
        if isinstance(node, list) and isinstance(p, int) and p < len(node):
            node = node[p]
        elif isinstance(node, dict):
            node = node.get(p)
        else:
            node = None
    return ".".join(out)


# ------------------------------------------------------------------------ the rules


FieldPath = tuple[str | int, ...]
#: Where a reference's fields were stated: field -> (line, path in that record).
Origin = dict[str, tuple[int, FieldPath]]
#: Why a reference field nothing acted on is informational (see :class:`Claims`).
UNUSED_REASON = ("a reference that no later record compares (a request cancelled, refused "
                 "or cut short by a crash before the step that would act on it, a generation "
                 "never audited, a rollout freed without its release): nothing depends on it")

_REQUEST_PATHS: dict[str, FieldPath] = {
    "label": ("detail", "target"), "identity": ("detail", "identity"),
    "prompt": ("detail", "probe", "prompt"), "tokens": ("detail", "probe", "tokens"),
    "logprobs": ("detail", "probe", "logprobs"), "tolerance": ("detail", "probe", "tolerance")}


@dataclass
class Claims:
    """What the journal so far established: the committed and the target generations'
    references, and whether a probe was attempted since the caches were invalidated.
    Constant size: two references.

    With ``on_unused`` set, every reference field that no later record compared is
    reported (its line and path) when its reference is dropped or the journal ends: the
    mutation test's way to tell a forged claim that nothing could contradict
    (:data:`UNUSED_REASON`) from a hole in the checker."""

    committed: Reference | None = None
    target: Reference | None = None
    probed_since_invalidation: bool = False
    fence_label: str | None = None  # what a fence now must relabel the engine to
    tier: str | None = None  # the tier of the reset in flight
    initial: str | None = None  # the initial generation's label, as bootstraps name it
    on_unused: Callable[[int, FieldPath], None] | None = None
    _origin: dict[str, Origin] = field(default_factory=lambda: {
        "target": {}, "committed": {}, "initial": {}})
    _used: dict[str, set[str]] = field(default_factory=lambda: {
        "target": set(), "committed": set(), "initial": set()})

    def copy(self) -> Claims:
        """An independent copy (without use tracking: a copy checks, it does not report)."""
        return replace(self, on_unused=None, _origin={k: {} for k in self._origin},
                       _used={k: set() for k in self._used})

    def _use(self, ref: Reference | None, *fields: str) -> None:
        if ref is not None and self.on_unused is not None:
            which = "target" if ref is self.target else "committed"
            self._used[which].update(fields)

    def _drop(self, which: str) -> None:
        if self.on_unused is not None:
            for f, (line, path) in self._origin[which].items():
                if f not in self._used[which]:
                    self.on_unused(line, path)
        self._origin[which], self._used[which] = {}, set()

    def finish(self) -> None:
        """The journal ended: report what nothing compared."""
        for which in self._origin:
            self._drop(which)

    # -------------------------------------------------------------- checking

    def problem(self, r: Mapping[str, Any], phase: Phase | None) -> tuple[str, str] | None:
        """Why record ``r`` (the controller in ``phase`` before it; None: not known, a
        continuing segment read alone) contradicts what the journal established (None: it
        does not). Violations: ``Schema`` for a malformed field,
        ``EvidenceContradicts{Target,Committed}`` for a decision taken against another
        generation than the one it is about, ``DetailContradicts{Target,Committed,Journal}``
        for a record that names another, ``EvidenceIncoherent`` for evidence its own
        operation could not have produced."""
        step = str(r["step"])
        detail = r.get("detail")
        bad = detail_problem(step, detail)
        if bad:
            return "Schema", bad
        d = detail or {}
        if step == Trigger.REQUEST_UPDATE:
            ref = Reference.of_request(d)
            if isinstance(ref, str):
                return "Schema", ref
            adapter = self._adapter_request(d)
            if adapter:
                return adapter
        elif step in (Trigger.MUTATE_BEGIN, Trigger.PUBLISH, Trigger.CANCEL_UPDATE):
            key = "label" if step == Trigger.PUBLISH else "target"
            named = self._names(self.target, d.get(key), d.get("identity"), step,
                                "DetailContradictsTarget")
            if named:
                return named
        elif step == Trigger.READMIT_BEGIN:
            named = self._names(self.committed, d["target"], d["identity"], step,
                                "DetailContradictsCommitted")
            if named:
                return named
        elif step in (Trigger.RESTART_READY, Trigger.RESTART_TAINTED,
                      Trigger.RESTART_UNINITIALIZED) and phase is not None \
                and d.get("from_phase") != phase.value:
            return "DetailContradictsJournal", (f"{step} says it restarted from "
                                               f"{d.get('from_phase')!r}; the journal left "
                                               f"the controller in {phase.value}")
        if "evidence" in r:
            return self._decision(step, r["evidence"], d)
        return None

    def _adapter_request(self, d: Mapping[str, Any]) -> tuple[str, str] | None:
        """An adapter update is a mutation of its own kind: the request names the adapter
        (``adapter``), its identity names base and adapter, and the base is the one the
        engine serves (an adapter update never changes the base weights). A request that
        names no adapter changes the base weights: its identity names none."""
        identity, name = str(d.get("identity")), d.get("adapter")
        base, sep, digest = identity.partition(ADAPTER_JOIN)
        if name is None:
            if sep:
                return "DetailContradictsTarget", (
                    f"request_update names no adapter but identity {identity[:24]}... "
                    f"names base and adapter {digest[:16]}")
            return None
        if not sep or not digest:
            return "DetailContradictsTarget", (
                f"request_update names adapter {name!r} but its identity {identity[:24]} "
                "names the base weights alone")
        served = self.committed.identity.partition(ADAPTER_JOIN)[0] \
            if self.committed is not None else None
        if served is not None and served != base:
            return "DetailContradictsCommitted", (
                f"adapter {name!r} on base {base[:16]}; the engine serves base {served[:16]}")
        return None

    def _names(self, ref: Reference | None, label: Any, identity: Any, step: str,
               violated: str) -> tuple[str, str] | None:
        self._use(ref, "label", "identity")
        if ref is None or (label, identity) == (ref.label, ref.identity):
            return None
        return violated, f"{step} names {label!r}, identity {str(identity)[:16]}; " \
            f"{ref.described}"

    def _decision(self, step: str, dec: Mapping[str, Any], detail: Mapping[str, Any]
                  ) -> tuple[str, str] | None:
        op = str(dec.get("op"))
        evs = [e for e in dec.get("evidence") or [] if isinstance(e, Mapping)]
        exp = dec.get("expected")
        about = self.committed if op in ("audit", "readmit", "mutate") else \
            self.target if op in ("validate", "probe") else None
        if op in ("audit", "readmit", "validate", "probe", "mutate") and not (
                exp is None and ("error" in dec or op == "mutate")):  # expected nothing
            if about is not None:
                self._use(about, "label", "identity", "tokens", "logprobs", "tolerance")
                bad = about.expected_problem(exp, step)
                if bad:
                    which = "Committed" if op in ("audit", "readmit", "mutate") else "Target"
                    return f"EvidenceContradicts{which}", bad
            elif op in ("validate", "probe"):
                return "EvidenceContradictsTarget", f"{step} is decided, but no update named " \
                    "a target"
        if op == "bootstrap" and isinstance(exp, Mapping) and "label" in detail \
                and detail["label"] != exp.get("label"):
            return "DetailContradictsTarget", (f"{step} says label {detail['label']!r}; its "
                                               f"decision expected {exp.get('label')!r}")
        if isinstance(exp, Mapping) and (exp.get("probe_tokens") is None) == (
                exp.get("probe_logprobs") is None):
            return "EvidenceIncoherent", (f"{step} expected both or neither of a token and a "
                                          "scored probe reference")
        if op == "bootstrap":
            initial = self._initial(step, detail)
            if initial:
                return initial
        if isinstance(exp, Mapping) and op in _FIRST_SINCE_RESET:
            want = _FIRST_SINCE_RESET[op](self)
            if exp.get("first_since_reset") is not want:
                return "EvidenceIncoherent", (f"{step} expected first_since_reset "
                                              f"{exp.get('first_since_reset')!r}; the journal "
                                              f"says {want}")
        for e in evs:
            bad = self._evidence(step, op, e, about)
            if bad:
                return "EvidenceIncoherent", bad
        resets = [e.get("tier") for e in evs if e.get("type") == "ResetEvidence"]
        if op == "readmit" and resets != list(TIERS)[:len(resets)]:
            return "EvidenceIncoherent", f"{step}: the re-admission reset {resets}, not the " \
                "tiers in order"
        return None

    def _initial(self, step: str, detail: Mapping[str, Any]) -> tuple[str, str] | None:
        """Every bootstrap outcome names the same initial label."""
        if self.initial is None:
            return None  # this one names it (advance)
        self._used["initial"].add("label")
        if detail["label"] != self.initial:
            return "DetailContradictsTarget", (f"{step} names initial label "
                                               f"{detail['label']!r}; an earlier bootstrap "
                                               f"named {self.initial!r}")
        return None

    def _evidence(self, step: str, op: str, e: Mapping[str, Any], about: Reference | None
                  ) -> str | None:
        kind = e.get("type")
        if kind == "PauseEvidence" and op in PAUSE_MODE and e.get("mode") != PAUSE_MODE[op]:
            return f"{step}: a {op} pauses in {PAUSE_MODE[op]} mode, not {e.get('mode')!r}"
        if kind == "ResetEvidence" and op == "reset" and e.get("tier") != self.tier:
            return f"{step}: reset evidence of tier {e.get('tier')!r} for tier {self.tier!r}"
        if kind == "EngineReport" and op in QUIET_READS and (
                e.get("paused") is False or e.get("running_requests") not in (0, None)):
            return (f"{step}: the engine read as paused={e.get('paused')}, running "
                    f"{e.get('running_requests')} while it must be quiet")
        if kind == "ProbeEvidence" and op != "bootstrap" and about is not None \
                and about.prompt is not None:
            self._use(about, "prompt")
            if _tuple(e.get("prompt")) != about.prompt:
                return f"{step}: the probe prompt is not the generation's probe prompt"
        if kind == "FenceEvidence" and self.fence_label is not None:
            self._use(self.target if self.target is not None else self.committed, "label")
            if e.get("label") != self.fence_label:
                return f"{step}: fenced as {e.get('label')!r}, not {self.fence_label!r}"
        return None

    # -------------------------------------------------------------- advancing

    def advance(self, r: Mapping[str, Any], line: int, committed: int, target: int) -> None:
        """Take an accepted record (at ``line``) into account (``committed``, ``target``:
        the controller's generations after it)."""
        step = str(r["step"])
        d = r.get("detail") or {}
        if step == Trigger.REQUEST_UPDATE:
            named = Reference.of_request(d)
            self._drop("target")
            self.target = named if isinstance(named, Reference) else None
            self._origin["target"] = {f: (line, p) for f, p in _REQUEST_PATHS.items()}
        elif step == Trigger.PUBLISH and self.target is not None:
            self._drop("committed")
            self.committed, self.target = self.target, None
            self._origin["committed"], self._used["committed"] = \
                self._origin["target"], self._used["target"]
            self._origin["target"], self._used["target"] = {}, set()
        elif step == Trigger.INVALIDATED:
            self.probed_since_invalidation = False
        elif step == Trigger.RESET_BEGIN:
            self.tier = r.get("param")
        elif step == Trigger.BOOTSTRAP_OK:
            self._bootstrapped(r["evidence"], line)
        if step.startswith("bootstrap_") and step != Trigger.BOOTSTRAP_BEGIN \
                and self.initial is None:
            self.initial = str(d.get("label"))
            self._origin["initial"] = {"label": (line, ("detail", "label"))}
        elif step in (Trigger.PROBE_OK, Trigger.PROBE_FAILED, Trigger.PROBE_MISMATCH):
            self.probed_since_invalidation = True
        if self.committed is None and step in (Trigger.AUDIT_OK, Trigger.READMIT_OK):
            # A continuing segment read without the one it continues: the first verified
            # evidence about the committed generation names it.
            exp = (r.get("evidence") or {}).get("expected") or {}
            self.committed = Reference(str(exp.get("label")), str(exp.get("identity")))
        if not target and self.target is not None:
            self._drop("target")
            self.target = None
        ref = self.target if target else self.committed
        self.fence_label = f"tainted:{ref.label}" if ref is not None else None

    def _bootstrapped(self, dec: Mapping[str, Any], line: int) -> None:
        exp = dec.get("expected") or {}
        evs = dec.get("evidence") or []
        k = next((i for i, e in enumerate(evs) if e.get("type") == "ProbeEvidence"), None)
        self._drop("committed")
        self.committed = Reference(str(exp.get("label")), str(exp.get("identity")),
                                   _tuple(evs[k].get("prompt")) if k is not None else None,
                                   _tuple(exp.get("probe_tokens")),
                                   _tuple(exp.get("probe_logprobs")), exp.get("tolerance"))
        self._origin["committed"] = {
            "tolerance": (line, ("evidence", "expected", "tolerance")),
            **({"prompt": (line, ("evidence", "evidence", k, "prompt"))} if k is not None
               else {})}


_FIRST_SINCE_RESET: dict[str, Callable[[Claims], bool]] = {
    "probe": lambda c: not c.probed_since_invalidation,
    "readmit": lambda c: True,
    "mutate": lambda c: True,  # a refusal's read (no probe: the field is the default)
    "audit": lambda c: False,
    "validate": lambda c: True,
    "bootstrap": lambda c: True,
}
