"""Generate the TLA+ module and TLC configuration from a :class:`Spec` (pure: strings)."""

from __future__ import annotations

from rolloutcore.spec.lifecycle import (
    ALL_EVIDENCE,
    BROKEN,
    GHOST_VARS,
    INIT_TLA,
    MIXED,
    POST_MUTATION_PHASES,
    QUIET_PHASES,
    TAINT,
    TIERS,
    VARIABLES,
    WEIGHT_EVIDENCE,
    Action,
    Kind,
    Phase,
    Spec,
    WorldTla,
    param_domain,
    param_var,
)


def tla_name(action_name: str) -> str:
    """``mutate_ok`` -> ``MutateOk``: the operator name TLC uses as the edge label."""
    return "".join(part.capitalize() for part in action_name.split("_"))


def _strings(values: object) -> str:
    items = sorted(str(v) for v in values)  # type: ignore[attr-defined]
    return "{" + ", ".join(f'"{v}"' for v in items) + "}"


def world_conjuncts(world: WorldTla) -> list[str]:
    """``var' = expr`` or ``var' \\in set`` per ghost variable an effect writes."""
    return [f"{v}' {e}" if e.startswith("\\in ") else f"{v}' = {e}" for v, e in world.items()]


def _head(a: Action, suffix: str = "") -> str:
    head = tla_name(a.name) + suffix
    return head + (f"({param_var(a.param)})" if a.param is not None else "")


def _action(a: Action) -> str:
    sources = _strings(p.value for p in sorted(a.sources, key=list(Phase).index))
    lines = [f"\\* {a.name} [{a.kind}]: {a.doc}", f"{_head(a)} ==", f"    /\\ phase \\in {sources}"]
    for guard in (a.when_tla, a.truth_tla):
        if guard.strip() != "TRUE":
            lines.append(f"    /\\ {guard}")
    if a.fault:
        lines.append("    /\\ faults < MaxFaults")
    if a.needs_generation:
        lines.append("    /\\ committed < MaxGen")
    if a.dest is not None:
        lines.append(f'    /\\ phase\' = "{a.dest.value}"')
    for var, expr in a.control_tla.items():
        lines.append(f"    /\\ {var}' = {expr}")
    lines += [f"    /\\ {c}" for c in world_conjuncts(a.world_tla)]
    if a.in_flight:
        lines.append("    /\\ InFlight")
    if a.fault:
        lines.append("    /\\ faults' = faults + 1")
    unchanged = [v for v in VARIABLES if v not in a.writes]
    if unchanged:
        lines.append(f"    /\\ UNCHANGED <<{', '.join(unchanged)}>>")
    return "\n".join(lines)


def _in_flight(spec: Spec) -> str:
    """What the operation in flight may have done when the controller crashed: nothing,
    or the world effect of any outcome the engine can produce (see Spec.in_flight_worlds)."""
    ghosts = [v for v in GHOST_VARS if v != "faults"]
    parts = ["\\* The effect on the engine of an outcome of the operation in flight.", ""]
    disjuncts = [f"UNCHANGED <<{', '.join(ghosts)}>>"]
    for o in spec.actions:
        if o.kind is not Kind.OUTCOME:
            continue
        sources = _strings(p.value for p in sorted(o.sources, key=list(Phase).index))
        body = [f"phase \\in {sources}", o.when_tla]
        if o.truth_tla.strip() != "TRUE":
            body.append(o.truth_tla)
        body += world_conjuncts(o.world_tla)
        rest = [v for v in ghosts if v not in o.world_tla]
        if rest:
            body.append(f"UNCHANGED <<{', '.join(rest)}>>")
        parts.append(f"{_head(o, 'Effect')} ==\n" + "\n".join(f"    /\\ {b}" for b in body))
        parts.append("")
        if o.param is None:
            disjuncts.append(f"{tla_name(o.name)}Effect")
        else:
            v = param_var(o.param)
            disjuncts.append(
                f"\\E {v} \\in {param_domain(o.param)} : {tla_name(o.name)}Effect({v})")
    parts.append("InFlight ==\n" + "\n".join(f"    \\/ {d}" for d in disjuncts))
    return "\n".join(parts)


def _next(spec: Spec) -> str:
    disjuncts = []
    for a in spec.actions:
        if a.param is None:
            disjuncts.append(tla_name(a.name))
        else:
            v = param_var(a.param)
            disjuncts.append(f"\\E {v} \\in {param_domain(a.param)} : {tla_name(a.name)}({v})")
    return "Next ==\n" + "\n".join(f"    \\/ {d}" for d in disjuncts)


def module(spec: Spec) -> str:
    """The TLA+ module text for ``spec``."""
    phases = _strings(p.value for p in Phase)
    parts = [
        f"---------------------------- MODULE {spec.name} ----------------------------",
        "\\* Generated from spec/lifecycle.py by `rolloutcore spec tla`.",
        "\\* Do not edit: change the Python spec and regenerate.",
        "EXTENDS Integers, FiniteSets, Sequences",
        "",
        "CONSTANTS NumSlots, MaxGen, MaxFaults",
        "",
        "Slots == 1..NumSlots",
        f"Tiers == {_strings(TIERS)}",
        f"Phases == {phases}",
        f"AllEvidence == {_strings(ALL_EVIDENCE)}",
        f"WeightEvidence == {_strings(WEIGHT_EVIDENCE)}",
        f"QuietPhases == {_strings(p.value for p in QUIET_PHASES)}",
        f"PostMutationPhases == {_strings(p.value for p in POST_MUTATION_PHASES)}",
        f"MIXED == {MIXED}",
        f"BROKEN == {BROKEN}",
        f"TAINT == {TAINT}",
        "",
        f"VARIABLES {', '.join(VARIABLES)}",
        f"vars == <<{', '.join(VARIABLES)}>>",
        "",
        "Init ==\n    " + INIT_TLA,
        "",
    ]
    if any(a.in_flight for a in spec.actions):
        parts += [_in_flight(spec), ""]
    parts += [_action(a) + "\n" for a in spec.actions]
    parts += [_next(spec), "", "Spec == Init /\\ [][Next]_vars", "", _fair_spec(spec), "",
              "\\* ---- invariants"]
    for inv in spec.invariants:
        parts.append(f"\\* {inv.doc}\n{inv.name} ==\n    {inv.tla}\n")
    parts.append("\\* ---- action properties")
    for prop in spec.action_properties:
        parts.append(f"\\* {prop.doc}\n{prop.name} ==\n    [][{prop.tla}]_vars\n")
    parts.append("\\* ---- liveness (under FairSpec's fairness)")
    for lp in spec.liveness:
        parts.append(f"\\* {lp.doc}\n{lp.name} ==\n    ({lp.when_tla}) ~> ({lp.then_tla})\n")
    parts.append("=" * 78)
    return "\n".join(parts) + "\n"


def _fair_spec(spec: Spec) -> str:
    """``FairSpec``: the spec with its fairness assumptions (what liveness is checked
    under), one WF_ or SF_ conjunct per assumption over the disjunction of its actions."""
    lines = ["\\* The spec with its fairness assumptions (liveness is checked under it).",
             "FairSpec == Spec"]
    for f in spec.fairness:
        acts = []
        for a in spec.actions:
            if a.name not in f.actions:
                continue
            if a.param is None:
                acts.append(tla_name(a.name))
            else:
                v = param_var(a.param)
                acts.append(f"(\\E {v} \\in {param_domain(a.param)} : {tla_name(a.name)}({v}))")
        kind, body = ("SF" if f.strong else "WF"), " \\/ ".join(acts)
        if f.when_tla:
            body = f"({f.when_tla}) /\\ ({body})"
        lines.append(f"    /\\ {kind}_vars({body})  \\* {f.name}")
    return "\n".join(lines)


def liveness_config(spec: Spec, prop: str) -> str:
    """A TLC configuration that checks liveness property ``prop`` under ``FairSpec``."""
    b = spec.bounds
    return "\n".join([
        "\\* Generated by rolloutcore (a liveness run). Do not edit.",
        "CONSTANTS",
        f"    NumSlots = {b.rollouts}",
        f"    MaxGen = {b.generations}",
        f"    MaxFaults = {b.faults}",
        "SPECIFICATION FairSpec",
        f"PROPERTY {prop}",
    ]) + "\n"


def config(spec: Spec) -> str:
    """The TLC configuration: the bounds, the invariants and the action properties."""
    b = spec.bounds
    lines = [
        "\\* Generated by `rolloutcore spec tla`. Do not edit.",
        "CONSTANTS",
        f"    NumSlots = {b.rollouts}",
        f"    MaxGen = {b.generations}",
        f"    MaxFaults = {b.faults}",
        "SPECIFICATION Spec",
        "INVARIANTS",
        *(f"    {inv.name}" for inv in spec.invariants),
        "PROPERTIES",
        *(f"    {p.name}" for p in spec.action_properties),
    ]
    return "\n".join(lines) + "\n"
