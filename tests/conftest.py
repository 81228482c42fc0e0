from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rolloutcore.proof.explore import Exploration, explore
from rolloutcore.spec.lifecycle import SPEC

if TYPE_CHECKING:
    from rolloutcore.conformance.fixtures.server_pool import ServerPool

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
    # The real-server tests run last, together: the session's server pool (vllm_pool) is
    # then idle only between them, not beside every other module (stable: file order kept).
    items.sort(key=lambda item: item.get_closest_marker("vllm") is not None)
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


@pytest.fixture(scope="module")
def etcd() -> Iterator[Any]:
    """A real etcd for the module (``make install`` installs it; missing, the test fails:
    the etcd tests never pass without one)."""
    from rolloutcore.conformance.fixtures.etcd_server import EtcdError, EtcdServer, etcd_binary

    try:
        etcd_binary()
    except EtcdError as e:
        pytest.fail(f"{e} (the etcd tests need a real etcd; `make install` installs it)")
    with EtcdServer() as server:
        yield server


@pytest.fixture(scope="session")
def models() -> dict[str, Path]:
    """The tiny test models (built offline once, then reused): version name -> directory."""
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    return {k: Path(v) for k, v in build_models(DEFAULT_OUT).items()}


def require_tlc() -> None:
    """Skip (visibly, with the reason) when TLC cannot run here; never pass silently."""
    from rolloutcore.proof.modelcheck import tlc_available

    why_not = tlc_available()
    if why_not:
        pytest.skip(f"TLC unavailable: {why_not}")


@pytest.fixture(scope="session")
def vllm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """The session's vLLM servers (see rolloutcore.conformance.fixtures.server_pool): a module
    leases what it needs and gives it back; only a server verifiably as found is reused."""
    from rolloutcore.conformance.fixtures.server_pool import ServerPool
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    pool = ServerPool(build_models(DEFAULT_OUT), tmp_path_factory.mktemp("vllm-pool"))
    try:
        yield pool
    finally:
        pool.close()
        _POOL_REPORT.append(pool.summary())
        _POOL_REPORT.extend(f"  discarded {log}: {why}" for log, why in pool.discarded)


_POOL_REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _POOL_REPORT:  # what the pool saved, and why each discarded server went
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _vllm_only_where_marked(request: pytest.FixtureRequest,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a vLLM server must be marked ``vllm``: the fast tier
    (``make check``, ``-m "not vllm"``) then really starts none."""
    if request.node.get_closest_marker("vllm") is not None:
        return
    from rolloutcore.conformance.fixtures import vllm_server as server

    def refuse(self: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a vLLM server but is not "
                             "marked vllm")

    monkeypatch.setattr(server.VllmServer, "start", refuse)
