from __future__ import annotations

import pytest

from rolloutcore.explore import Exploration, explore
from rolloutcore.spec.lifecycle import SPEC

#: Marks a test that runs only with ``--slow-hypothesis`` (minutes of Hypothesis search).
SLOW_HYPOTHESIS = "slow_hypothesis"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-hypothesis", action="store_true", default=False,
        help="also run the full Hypothesis hunt against every spec mutant (many minutes; CI "
        "runs one fast mutant, the explorer and TLC catch every one)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{SLOW_HYPOTHESIS}: a long Hypothesis search, run only with --slow-hypothesis")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow-hypothesis"):
        return
    skip = pytest.mark.skip(reason="opt-in: pass --slow-hypothesis to run the full Hypothesis "
                            "hunt (the explorer and TLC catch every mutant on every run)")
    for item in items:
        if item.get_closest_marker(SLOW_HYPOTHESIS) is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def exploration() -> Exploration:
    return explore(SPEC)


def require_tlc() -> None:
    """Skip (visibly, with the reason) when TLC cannot run here; never pass silently."""
    from rolloutcore.modelcheck import tlc_available

    why_not = tlc_available()
    if why_not:
        pytest.skip(f"TLC unavailable: {why_not}")
