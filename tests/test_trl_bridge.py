"""TRLBridge's contract with TRL, without servers (the real run is tests/test_trl_vllm.py):
one group per run of num_generations repeats, asked for on the generation just
published, returned in TRL's order with the provenance fields; anything that is not a
batch of groups is refused before anything is generated."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from rolloutcore.engine.controller import Binding
from rolloutcore.errors import BadInput
from rolloutcore.integrations.trl import SAMPLE_FIELDS, TRLBridge
from rolloutcore.rl import Group, GroupError, Sample, Sampling

SAMPLING = Sampling(max_tokens=3)


class FakeClient:
    """Answers each group with its prompt's first token repeated, on ``generation``."""

    logprobs_mode = "raw_logprobs"

    def __init__(self, generation: int = 1, aborted: bool = False) -> None:
        self.generation, self.aborted = generation, aborted
        self.asked: list[tuple[tuple[int, ...], int, int | None]] = []
        self.lock = threading.Lock()

    def generate_group(self, prompt_ids: Sequence[int], n: int, sampling: Sampling, *,
                       min_generation: int | None = None, **_: Any) -> Group:
        with self.lock:
            self.asked.append((tuple(prompt_ids), n, min_generation))
        samples = tuple(Sample(i, (prompt_ids[0],) * 3, (-0.5,) * 3, "length", False)
                        for i in range(n))
        return Group(tuple(prompt_ids), samples,
                     Binding(f"r-{prompt_ids[0]}", self.generation, f"id{self.generation}", 1,
                             aborted=self.aborted), "e0", "rc-1", self.logprobs_mode,
                     sampling, 0.0, 0.0)


def bridge(client: FakeClient, **kw: Any) -> TRLBridge:
    return TRLBridge(client, None, num_generations=2, sampling=SAMPLING,  # type: ignore[arg-type]
                     **kw)


def test_each_run_of_repeats_is_one_group_on_the_generation_just_published() -> None:
    client = FakeClient(generation=3)
    b = bridge(client, generation=3)
    out = b.rollout_func([[5, 6], [5, 6], [7, 8], [7, 8], [5, 6], [5, 6]], None)
    assert sorted(client.asked) == [((5, 6), 2, 3), ((5, 6), 2, 3), ((7, 8), 2, 3)]
    assert out["prompt_ids"] == [[5, 6]] * 2 + [[7, 8]] * 2 + [[5, 6]] * 2  # TRL's order
    assert out["completion_ids"] == [[5, 5, 5]] * 2 + [[7, 7, 7]] * 2 + [[5, 5, 5]] * 2
    assert out["logprobs"] == [[-0.5] * 3] * 6
    assert out["generation"] == [3] * 6 and out["identity"] == ["id3"] * 6
    assert set(SAMPLE_FIELDS) <= set(out) and out["logprobs_mode"] == ["raw_logprobs"] * 6
    lagged = bridge(FakeClient(generation=3), generation=3, max_lag=1)
    lagged.rollout_func([[5], [5]], None)
    assert lagged.client.asked == [((5,), 2, 2)]  # type: ignore[attr-defined]


def test_a_batch_that_is_not_groups_is_refused_before_anything_is_generated() -> None:
    client = FakeClient()
    b = bridge(client)
    with pytest.raises(BadInput, match="groups of num_generations"):
        b.rollout_func([[5, 6], [5, 6], [7]], None)
    with pytest.raises(BadInput, match="repeat each prompt"):
        b.rollout_func([[5, 6], [5, 6], [7, 8], [9, 9]], None)
    with pytest.raises(BadInput, match="token ids or text"):
        b.rollout_func([[{"role": "user"}], [{"role": "user"}]], None)
    assert client.asked == []
    with pytest.raises(BadInput):
        bridge(client, max_lag=-1)


def test_an_aborted_group_is_never_handed_to_trl() -> None:
    with pytest.raises(GroupError, match="aborted"):
        bridge(FakeClient(aborted=True)).rollout_func([[5], [5]], None)
