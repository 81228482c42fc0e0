"""Postconditions: the only place where evidence becomes a spec outcome.

Each function reads what an adapter observed and names the outcome trigger the
controller takes, with the reason in words for the journal. An HTTP 200 alone never
yields an ``*_ok``: the body, a read-back or a counter must confirm it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from rolloutcore.adapters.contract import (
    EngineReport,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
    WeightTarget,
)


class Outcome(NamedTuple):
    trigger: str
    reason: str


def pause(ev: PauseEvidence) -> Outcome:
    if ev.paused_read_back is True and ev.running_after == 0:
        return Outcome("pause_ok", f"is_paused=true, running={ev.running_after}")
    return Outcome("pause_failed", f"status={ev.http_status} paused={ev.paused_read_back} "
                                   f"running={ev.running_after}")


def resume(ev: ResumeEvidence) -> Outcome:
    if ev.paused_read_back is False:
        return Outcome("resume_ok", "is_paused=false")
    return Outcome("resume_failed", f"status={ev.http_status} paused={ev.paused_read_back}")


def mutation(ev: MutationEvidence) -> Outcome:
    trigger = {
        MutationOutcome.COMPLETED: "mutate_ok",
        MutationOutcome.NOT_MUTATED: "mutate_refused",
        MutationOutcome.AMBIGUOUS: "mutate_ambiguous",
    }[ev.outcome]
    return Outcome(trigger, ev.observed)


def reset(ev: ResetEvidence) -> Outcome:
    if ev.http_status != 200:
        return Outcome("reset_failed", f"{ev.tier}: HTTP {ev.http_status}")
    if ev.body_success is False:
        return Outcome("reset_failed", f"{ev.tier}: refused (success:false)")
    if ev.body_success is True:
        return Outcome("reset_ok", f"{ev.tier}: body success:true")
    if ev.entries_after == 0:
        return Outcome("reset_ok", f"{ev.tier}: engine reports 0 entries after the reset")
    if ev.tier_absent:
        return Outcome("reset_ok", f"{ev.tier}: the engine has no such cache")
    return Outcome("reset_failed", f"{ev.tier}: 200 with nothing to verify it by")


def validation(report: EngineReport | None, target: WeightTarget, error: str | None = None) -> (
    Outcome
):
    if report is None or report.label is None or report.identity is None:
        return Outcome("validate_failed", error or "label or identity could not be read")
    if report.label != target.label:
        return Outcome("validate_mismatch", f"label {report.label!r} != {target.label!r}")
    if report.identity != target.identity:
        return Outcome("validate_mismatch",
                       f"identity {report.identity[:16]} != {target.identity[:16]}")
    return Outcome("validate_ok", f"label {target.label}, identity {target.identity[:16]}")


def probe(ev: ProbeEvidence, expected: tuple[int, ...], *, first_since_reset: bool = True) -> (
    Outcome
):
    """``first_since_reset``: no request has run since the caches were verified clean, so
    any prefix hit can only be a stale entry."""
    if ev.tokens is None:
        return Outcome("probe_failed", ev.error or f"HTTP {ev.http_status}")
    if ev.prefix_hits and first_since_reset:
        return Outcome("probe_mismatch",
                       f"{ev.prefix_hits} prefix-cache hits on the first post-update request: "
                       "stale KV was reused")
    if tuple(ev.tokens) != tuple(expected):
        first = next((i for i, (a, b) in enumerate(zip(ev.tokens, expected, strict=False))
                      if a != b), min(len(ev.tokens), len(expected)))
        return Outcome("probe_mismatch", f"tokens differ from the reference at position {first}")
    return Outcome("probe_ok", f"{len(expected)} tokens equal the reference")


def bootstrap(report: EngineReport | None, ev: ProbeEvidence | None, initial: WeightTarget) -> (
    Outcome
):
    if report is None or ev is None:
        return Outcome("bootstrap_failed", "engine could not be read")
    if report.paused is not False:
        return Outcome("bootstrap_failed", f"engine paused={report.paused}")
    v = validation(report, initial)
    if v.trigger != "validate_ok":
        return Outcome("bootstrap_failed", v.reason)
    # Hits are no sign of staleness here: nothing has changed the weights yet.
    p = probe(replace(ev, prefix_hits=None), initial.probe_tokens)
    if p.trigger != "probe_ok":
        return Outcome("bootstrap_failed", p.reason)
    return Outcome("bootstrap_ok", f"{v.reason}; {p.reason}")
