"""The RL loop on two real vLLM CPU servers, at reduced size: groups through the gateway,
the trainer's publishes over gloo, a member killed mid-transfer and re-admitted, and
every check of ``make demo`` (records against the journal, the fleet trace, behaviour
logprobs against the trainer's recomputation to 1e-4 nats, the reward rising).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rolloutcore.conformance.rl_demo import RLConfig, run_rl_demo
from rolloutcore.conformance.server_pool import ServerPool

pytestmark = pytest.mark.vllm

#: Fewer steps than the demo, the fault early enough for the victim to come back.
REDUCED = RLConfig(steps=16, fault_step=5, threshold=0.5)


def test_the_rl_loop_learns_through_verified_publishes(tmp_path: Path,
                                                        vllm_pool: ServerPool) -> None:
    lines: list[str] = []
    result = run_rl_demo(REDUCED, tmp_path, lines.append, pool=vllm_pool)
    failed = [c for c in result.checks if not c.ok]
    assert result.error is None, "\n".join(lines[-30:])
    assert not failed and result.passed, "\n".join(lines[-30:])
    ev = result.evidence
    assert ev["logprob_tokens_compared"] > 0 and ev["logprob_max_abs_diff"] <= 1e-4
    assert ev["records"] >= REDUCED.steps * REDUCED.groups_per_step * \
        REDUCED.samples_per_group
    # every generation published once per step, the fault's included
    assert [s["generation"] for s in result.steps] == list(range(2, REDUCED.steps + 2))
    assert any(s["serving"] == ["e0"] for s in result.steps)  # e1 quarantined meanwhile
    names = {Path(p).name for p in result.pictures}
    assert {"timeline.png", "reward.png", "lag.png", "index.html"} <= names
