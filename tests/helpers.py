"""Small helpers shared by tests: a step deadline, and an outcome decided from evidence."""

from __future__ import annotations

import time
from typing import Any

from rolloutcore.engine import postconditions as post
from rolloutcore.spec.triggers import Op


def dl(seconds: float = 30.0) -> float:
    """A step deadline ``seconds`` from now (what the runner hands an adapter call)."""
    return time.monotonic() + seconds


def decided(op: Op, evidence: Any, expected: post.Expected | None = None) -> str:
    """The outcome trigger the postconditions name for one piece of evidence."""
    return post.decide(post.Decision(op, (evidence,), expected)).trigger
