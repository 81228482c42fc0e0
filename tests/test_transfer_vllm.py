"""Weight transfer into a real vLLM CPU server over the gloo backend (two servers, a few
minutes): full cycle, identity refusal, init refusal, a model of the wrong shape (and the
re-admission after it), SIGSTOP and SIGKILL midway."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm.distributed.weight_transfer")

from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.transfer_scenarios import GLOO, Row, run_all  # noqa: E402

SCENARIOS = ("refuse_identity", "init_refused", "full_cycle", "staged_sender_fails",
             "staged_cycle", "wrong_model", "frozen",
             "killed")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory, vllm_pool: ServerPool) -> dict[str, Row]:
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    models = build_models(DEFAULT_OUT)
    out = run_all(GLOO, models, Path(tmp_path_factory.mktemp("transfer")),
                  servers=lambda: vllm_pool.leased(1))
    return {r.scenario: r for r in out}


@pytest.mark.parametrize("name", SCENARIOS)
def test_transfer_scenario(rows: dict[str, Row], name: str) -> None:
    row = rows[name]
    assert row.passed, row.failures()
