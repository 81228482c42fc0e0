"""A staged update's state, stepped only by the staged spec's table (spec/staged.py).

The runner steps it while it stages and installs; the trace checker steps one from the
journal: both take the table's guards and effects, so neither restates a rule. A step
the table does not allow raises :class:`StagingViolation`.
"""

from __future__ import annotations

from rolloutcore.errors import RolloutCoreError
from rolloutcore.spec.staged import JOURNAL_STEPS, SERVING, STAGED, StBounds, StState

#: A bound no run reaches (generations and ambiguous installs are not bounded at run time).
UNBOUNDED = 2**62
#: Journal step -> the spec action it names.
ACTION_OF_STEP: dict[str, str] = {step: a for step, (a, _t, _o) in JOURNAL_STEPS.items()}
STEP_OF_ACTION: dict[str, str] = {a: step for step, a in ACTION_OF_STEP.items()}


class StagingViolation(RolloutCoreError):
    """A staging step the staged spec does not allow in the state it was taken in."""


class Staging:
    """One engine's staged-update state (``ranks`` ranks, serving ``committed``)."""

    def __init__(self, ranks: int, committed: int) -> None:
        if ranks < 1:
            raise ValueError(f"an engine has at least one rank, not {ranks}")
        self.spec = STAGED.with_bounds(StBounds(ranks=ranks, generations=UNBOUNDED,
                                                faults=UNBOUNDED))
        self.ranks = ranks
        self.state = StState(SERVING, committed, 0, (committed,) * ranks, (0,) * ranks,
                             (False,) * ranks, (False,) * ranks, 0)

    def step(self, action: str, *params: object) -> StState:
        """Take ``action`` with ``params`` (a rank is 1-based) if the table allows it."""
        a = self.spec.action(action)
        if len(params) != len(a.params):
            raise StagingViolation(f"{action} takes {a.params}, got {params!r}")
        if not a.when(self.state, self.spec.bounds, params):
            raise StagingViolation(f"{action}{params!r} is not allowed in {self.state}")
        self.state = a.apply(self.state, self.spec.bounds, params)
        return self.state

    @property
    def phase(self) -> str:
        return self.state.phase

    def install_all(self) -> None:
        for r in range(1, self.ranks + 1):
            self.step("install", r, True)


__all__ = ["ACTION_OF_STEP", "STEP_OF_ACTION", "UNBOUNDED", "Staging", "StagingViolation"]
