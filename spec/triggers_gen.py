"""Generate ``spec/triggers.py``: the trigger and operation enums every module imports, so
that a misspelt trigger is a type error (mypy) rather than a runtime surprise (pure)."""

from __future__ import annotations

from rolloutcore.spec.lifecycle import Kind, Result, Spec


def _member(name: str) -> str:
    return name.upper()


def module(spec: Spec) -> str:
    triggers: dict[str, str] = {}
    ops: list[str] = []
    outcomes: dict[str, dict[Result, str]] = {}
    for a in spec.actions:
        t = a.trigger
        if t is None:
            continue
        triggers.setdefault(t, a.kind.value)
        if a.op is not None and a.result is not None:
            if a.op not in ops:
                ops.append(a.op)
            outcomes.setdefault(a.op, {}).setdefault(a.result, t)
    lines = [
        '"""Generated from spec/lifecycle.py by `rolloutcore spec tla`. Do not edit."""',
        "",
        "from __future__ import annotations",
        "",
        "from enum import StrEnum",
        "from typing import Final",
        "",
        "from rolloutcore.spec.lifecycle import Result",
        "",
        "",
        "class Trigger(StrEnum):",
        '    """Every step the controller takes or journals (one per controller trigger)."""',
        "",
    ]
    lines += [f'    {_member(t)} = "{t}"  # {kind}' for t, kind in triggers.items()]
    lines += ["", "", "class Op(StrEnum):", '    """The operations: a begin and its outcomes."""',
              ""]
    lines += [f'    {_member(o)} = "{o}"' for o in ops]
    lines += ["", "", "#: The trigger of each result of each operation (its begin included).",
              "OUTCOMES: Final[dict[Op, dict[Result, Trigger]]] = {"]
    for o in ops:
        lines.append(f"    Op.{_member(o)}: {{")
        for r, t in outcomes[o].items():
            lines.append(f"        Result.{r.name}: Trigger.{_member(t)},")
        lines.append("    },")
    lines += ["}", "#: Restart triggers: what a restarted controller may assume.",
              "RESTARTS: Final[tuple[Trigger, ...]] = ("]
    lines += [f"    Trigger.{_member(a.name)}," for a in spec.actions if a.kind is Kind.RESTART]
    lines += [")", ""]
    return "\n".join(lines)
