"""The audit of a serving engine: is it still the engine the controller verified?

An engine's process can be replaced behind the controller's back (an orchestrator's
restart, a relaunch, an operator) with other weights or another label; nothing the
controller holds shows it. An audit reads the engine again, as the spec's ``audit``
operation says: its label, weight identity and run state, then a probe (skipped when the
read already decides). One attempt, journalled like every operation (begin, the calls,
the decision, the outcome), decided by :func:`rolloutcore.postconditions.decide`:

* ``audit_ok``: every piece of evidence is (again) in hand;
* ``audit_mismatch``: the engine definitely is not the one verified: TAINTED, and the
  engine is fenced at once (its bound rollouts are released as aborted);
* ``audit_failed``: unreachable or unreadable: the evidence is dropped, no admission and
  no update until an audit passes.

The runner drives single engines; this module adds the audit to it without changing its
cycle (the fleet audits its members with it, see :meth:`rolloutcore.fleet.Fleet.audit`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rolloutcore import postconditions as post
from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.postconditions import Decision, Outcome
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Op, Trigger

if TYPE_CHECKING:
    from rolloutcore.runner import LifecycleRunner


def audit_attempt(runner: LifecycleRunner, target: WeightTarget) -> Callable[[float], Decision]:
    """One attempt of the audit of the engine behind ``runner`` against ``target`` (the
    committed generation): the read, then the probe unless the read decided already."""
    expected = runner._expected(target, first_since_reset=False)

    def attempt(deadline: float) -> Decision:
        report = runner.adapter.read_state(deadline)
        read_only = Decision(Op.AUDIT, (report,), expected)
        if report.paused is None or report.label is None or report.identity is None \
                or post.decide(read_only).trigger == Trigger.AUDIT_MISMATCH:
            return read_only
        return Decision(Op.AUDIT, (report, runner._probe_call(target, deadline)), expected)

    return attempt


def audit(runner: LifecycleRunner, target: WeightTarget | None = None, *,
          why: str = "audit") -> Outcome:
    """Audit the engine once (deadline: the policy's ``step_timeout_s``), journalled with
    ``why``; on a mismatch the engine is fenced. ``target`` describes the committed
    generation (default: the one the runner committed)."""
    c = runner.controller
    if target is None:
        target = runner.targets.get(c.control.committed)
        if target is None:
            raise ValueError(f"no target known for generation {c.control.committed}")
    if target.generation != c.control.committed:
        raise ValueError(f"an audit is against the committed generation "
                         f"{c.control.committed}, not {target.generation}")
    outcome = runner._idempotent(None, Op.AUDIT, None, audit_attempt(runner, target),
                                 {"why": why}, retry=False)
    if c.phase is Phase.TAINTED:
        runner.fence(target)
    return outcome


__all__ = ["audit", "audit_attempt"]
