from __future__ import annotations

import pytest

from rolloutcore.explore import Exploration, explore
from rolloutcore.spec.lifecycle import SPEC


@pytest.fixture(scope="session")
def exploration() -> Exploration:
    return explore(SPEC)


def require_tlc() -> None:
    """Skip (visibly, with the reason) when TLC cannot run here; never pass silently."""
    from rolloutcore.modelcheck import tlc_available

    why_not = tlc_available()
    if why_not:
        pytest.skip(f"TLC unavailable: {why_not}")
