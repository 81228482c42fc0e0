"""TRL's own GRPOTrainer trains through RolloutCore on two real vLLM CPU servers, at
reduced size: groups through the gateway (one admission each, on the generation just
published), a verified publish after each optimiser step, a member killed mid-transfer
and re-admitted, and every check of ``make demo`` (records against the journal, the fleet
trace, behaviour logprobs against TRL's model to 1e-4 nats, the reward rising)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rolloutcore.conformance.demos.rl_run import RLConfig
from rolloutcore.conformance.fixtures.server_pool import ServerPool
from rolloutcore.errors import BadInput
from rolloutcore.integrations.trl import SAMPLE_FIELDS, TRLBridge
from rolloutcore.rl import Sampling

pytestmark = pytest.mark.vllm

#: Fewer steps than the demo, the fault early enough for the victim to come back.
REDUCED = RLConfig(steps=12, fault_step=4, threshold=0.5)


def test_trl_grpo_learns_through_verified_publishes(tmp_path: Path,
                                                    vllm_pool: ServerPool) -> None:
    pytest.importorskip("trl")
    from rolloutcore.conformance.demos.trl_run import run_trl_demo

    lines: list[str] = []
    result = run_trl_demo(REDUCED, tmp_path, lines.append, pool=vllm_pool)
    failed = [c for c in result.checks if not c.ok]
    assert result.error is None, "\n".join(lines[-30:])
    assert not failed and result.passed, "\n".join(lines[-30:])
    ev = result.evidence
    assert ev["trl_version"] == "1.16.0"
    assert ev["logprob_tokens_compared"] > 0 and ev["logprob_max_abs_diff"] <= 1e-4
    assert ev["records"] == REDUCED.steps * REDUCED.groups_per_step * REDUCED.samples_per_group
    # one verified publish per optimiser step, the fault's included
    assert [s["generation"] for s in result.steps] == list(range(2, REDUCED.steps + 2))
    assert any(s["serving"] == ["e0"] for s in result.steps)  # e1 quarantined meanwhile


class _Client:
    logprobs_mode = "raw_logprobs"


def test_the_bridge_refuses_a_batch_that_does_not_repeat_each_prompt() -> None:
    """TRL repeats each prompt num_generations times in a row; anything else is not a
    batch of groups, and nothing is generated for it."""
    bridge = TRLBridge(_Client(), None, num_generations=2,  # type: ignore[arg-type]
                       sampling=Sampling(max_tokens=4))
    trainer: Any = None
    with pytest.raises(BadInput, match="groups of num_generations"):
        bridge.rollout_func([[5, 6], [5, 6], [7]], trainer)
    with pytest.raises(BadInput, match="repeat each prompt"):
        bridge.rollout_func([[5, 6], [7, 8]], trainer)
    with pytest.raises(BadInput):
        TRLBridge(_Client(), None, num_generations=0,  # type: ignore[arg-type]
                  sampling=Sampling(max_tokens=4))
    assert set(SAMPLE_FIELDS) >= {"generation", "identity"}
