"""Time on a real server's journal (issue 48, item 5): a verified update on a vLLM CPU
server journals every call within its declared deadline plus the slack, and passes
``trace check --strict``. The negative control runs the same update with the
validation's state read held past its deadline (an adapter call that cannot be
interrupted: a sleep the test controls): the default check warns of it and the strict
check rejects the journal at that outcome (DeadlineExceeded). The frozen-member fleet
scenarios check their journals with --strict too (conformance/fleet_scenarios.py)."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.contract import EngineReport  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.check.claims import TIMING_SLACK_S  # noqa: E402
from rolloutcore.check.trace import check_file  # noqa: E402
from rolloutcore.conformance.engines import checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.controller import Controller  # noqa: E402
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy  # noqa: E402
from rolloutcore.journal import Journal  # noqa: E402

#: Short step deadlines (a tiny model's calls take well under a second), so that the
#: held call's wait stays short.
POLICY = RunnerPolicy(step_timeout_s=8.0, retries=0, retry_backoff_s=0.0)


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Iterator[VllmServer]:
    with vllm_pool.leased(1) as (srv,):
        yield srv


def test_a_real_servers_journal_is_in_time_and_a_held_call_is_rejected(
        server: VllmServer, tmp_path: Path) -> None:
    models = build_models(DEFAULT_OUT)
    with HttpAdapter(server.url) as adapter:
        clean = tmp_path / "clean.jsonl"
        runner = LifecycleRunner(Controller(trace=Journal(clean, fsync=False)), adapter,
                                 POLICY)
        assert runner.bootstrap(checkpoint_target(models["v1"], 1, "default")).trigger \
            == "bootstrap_ok"
        assert runner.update(checkpoint_target(models["v2"], 2, "v2")).published
        verdict = check_file(clean, strict=True)
        assert verdict.accepted and verdict.warnings == (), verdict

        held = tmp_path / "held.jsonl"
        runner = LifecycleRunner(Controller(trace=Journal(held, fsync=False)), adapter,
                                 POLICY)
        assert runner.bootstrap(checkpoint_target(models["v2"], 1, "v2")).trigger \
            == "bootstrap_ok"
        read = adapter.read_state
        calls = {"n": 0}

        def slow_read(deadline: float | None = None) -> EngineReport:
            calls["n"] += 1
            if calls["n"] == 1:  # the validation's read: held past its deadline, once
                time.sleep(POLICY.step_timeout_s + TIMING_SLACK_S + 0.5)
            return read(deadline)

        adapter.read_state = slow_read  # type: ignore[method-assign]
        try:
            # back to v1's bytes under the startup label: the pool gets its server as found
            runner.update(checkpoint_target(models["v1"], 2, "default"))
        finally:
            adapter.read_state = read  # type: ignore[method-assign]
        assert calls["n"] >= 1 and runner.stuck_calls, "the held read was not late"
        lenient = check_file(held)
        assert lenient.accepted and any("past their deadline" in w
                                        for w in lenient.warnings), lenient
        strict = check_file(held, strict=True)
        assert not strict.accepted and strict.violated == "DeadlineExceeded", strict
