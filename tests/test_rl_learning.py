"""The toy RL task is learnable from random initialisation by the plain-torch GRPO
trainer, fast, on CPU, and the trainer recomputes the sampler's behaviour logprobs (the
pure-torch twin of the vLLM agreement check). No vLLM anywhere.

Budget of the learnability test: 40 steps of 8 groups x 8 samples from v1 (seeded random
weights), Adam lr 1e-3; the mean reward of the first step is below 0.2 and that of the
last 5 steps above 0.8. Tuned for a margin (measured, seeds 0-11: all 12 have a last-5
mean >= 0.997; the slowest, seed 10, settles at step 31; seed 0, the test's, at step
16). Higher rates learn faster but sometimes leave one context stuck on a wrong number
(lr 1.5e-3: 11/12 seeds, 2e-3 and 3e-3: 10/12 at 30 steps): a group that agrees has no
contrast, so GRPO cannot unlearn it. The negative control (advantages negated) runs the
same budget and its reward falls to ~0.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from rolloutcore.conformance.demos.grpo import (
    GRPOTrainer,
    TrainSample,
    group_advantages,
    load_model,
    sample_groups,
    sample_torch,
)
from rolloutcore.conformance.demos.task import SuccessorTask
from rolloutcore.conformance.demos.tool_task import ToolTask
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, PREFIX_BLOCK_SIZE, build_models

SEED = 0
STEPS = 40
GROUPS = 8  # prompts per step
N = 8  # samples per prompt (one group)
LR = 1e-3
LAST = 5  # steps averaged for the final reward
THRESHOLD = 0.8
INITIAL_BELOW = 0.2
# Trainer recomputation (full forward) vs the sampler's incremental KV-cache decode, the
# same weights: with load_model's float64 attention the two agree bitwise but for rare
# one-ulp roundings (measured: 0.0 at v1, <= 4.8e-6 nats in training runs); held to 1e-5.
TWIN_TOL = 1e-5
# With transformers' stock float32 SDPA they are two float32 paths whose attention
# reduces in a different order (measured on the tiny Llama: up to 3.4e-5 nats at v1 and
# 5.5e-5 during training, p99 1.6e-5), so that configuration is held to the fleet
# check's 1e-4 (the learning loop uses float64 attention).
SDPA_TWIN_TOL = 1e-4


@pytest.fixture(scope="module")
def v1() -> Path:
    return build_models(DEFAULT_OUT)["v1"]


@pytest.fixture(scope="module")
def task(v1: Path) -> SuccessorTask:
    return SuccessorTask(v1)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # The tiny model gains nothing from a second thread, and intra-op threads that
    # share cores with other processes can be 10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _model(v1: Path, *, exact_attention: bool = True) -> Any:
    return load_model(v1, exact_attention=exact_attention)


@dataclass
class Run:
    curve: list[float]  # mean reward per step (of the rollouts that step trains on)
    step_seconds: list[float]  # sampling + optimiser step
    total_seconds: float
    max_twin_diff: float  # max |recomputed - behaviour| logprob over every token


def _run(v1: Path, task: SuccessorTask, *, seed: int = SEED, steps: int = STEPS,
         lr: float = LR, groups: int = GROUPS, n: int = N, sign: float = 1.0) -> Run:
    """The on-policy loop of the real demo with the torch sampler in vLLM's place:
    sample GROUPS x N, score, group-normalise, one optimiser step; per step, the
    trainer's recomputed logprobs are compared with the behaviour logprobs.

    Measured (2 shared cores, 1 thread; mean reward per step, seed 0): 0.03 0.09 0.03
    0.30 0.62 0.52 0.16 0.53 0.47 0.84 0.61 0.92 0.95 0.92 1.00 0.98 1.00 ... 1.00,
    last-5 mean 1.00, 0.3-0.45 s per step (sampling ~60%), 12-18 s per run.
    """
    model = _model(v1)
    trainer = GRPOTrainer(model, lr=lr)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    run = Run([], [], 0.0, 0.0)
    t0 = time.perf_counter()
    for _ in range(steps):
        t_step = time.perf_counter()
        prompts = task.prompts(rng, groups)
        outs = sample_groups(model, [p.token_ids for p in prompts], n, task.max_tokens,
                             generator=gen, eos_id=task.eos_id)
        samples: list[TrainSample] = []
        behaviour: list[list[float]] = []
        rewards: list[float] = []
        for prompt, group in zip(prompts, outs, strict=True):
            r = [task.reward(prompt, ids) for ids, _ in group]
            rewards += r
            for (ids, lps), adv in zip(group, group_advantages(r), strict=True):
                samples.append(TrainSample(prompt.token_ids, tuple(ids), sign * adv,
                                           task.scored_tokens))
                behaviour.append(lps)
        stats = trainer.step(samples)
        run.max_twin_diff = max(run.max_twin_diff, *(
            abs(a - b) for rec, beh in zip(stats.logprobs, behaviour, strict=True)
            for a, b in zip(rec, beh, strict=True)))
        run.curve.append(statistics.fmean(rewards))
        run.step_seconds.append(time.perf_counter() - t_step)
    run.total_seconds = time.perf_counter() - t0
    return run


def _report(name: str, run: Run) -> str:
    curve = " ".join(f"{r:.2f}" for r in run.curve)
    return (f"{name}: reward per step [{curve}]; last {LAST} mean "
            f"{statistics.fmean(run.curve[-LAST:]):.3f}; {statistics.fmean(run.step_seconds):.3f}"
            f" s/step, {run.total_seconds:.1f} s total; max twin diff {run.max_twin_diff:.2e}")


# --------------------------------------------------------------------------- learning


@pytest.mark.deep  # make check's size: the vLLM RL loop and make demo learn too
def test_grpo_learns_the_task_from_random_init(v1: Path, task: SuccessorTask) -> None:
    run = _run(v1, task)
    report = _report("learn", run)
    print(report)
    assert run.curve[0] < INITIAL_BELOW, report
    assert statistics.fmean(run.curve[-LAST:]) > THRESHOLD, report
    # On-policy throughout: every step's recomputation is the policy that sampled.
    assert run.max_twin_diff < TWIN_TOL, report


@pytest.mark.deep
def test_negative_control_flipped_advantages_do_not_learn(
    v1: Path, task: SuccessorTask
) -> None:
    run = _run(v1, task, sign=-1.0)
    report = _report("flipped", run)
    print(report)
    assert max(run.curve) < THRESHOLD, report
    assert statistics.fmean(run.curve[-LAST:]) < INITIAL_BELOW, report


# --------------------------------------------------------------------------- advantages


def test_group_advantages_values() -> None:
    assert group_advantages([0.0, 1.0]) == pytest.approx([-1.0, 1.0], abs=1e-5)
    adv = group_advantages([0.0, 0.0, 0.0, 1.0])
    assert statistics.fmean(adv) == pytest.approx(0.0, abs=1e-12)
    assert statistics.pstdev(adv) == pytest.approx(1.0, abs=1e-5)  # population std
    assert adv[3] > 0 > adv[0] == adv[1] == adv[2]
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.7]) == [0.0]


@pytest.mark.parametrize("bad", [[], [float("nan"), 1.0], [float("inf")]])
def test_group_advantages_bad_input(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        group_advantages(bad)


# --------------------------------------------------------------------------- trainer


@pytest.mark.parametrize(("exact_attention", "tol"),
                         [(True, TWIN_TOL), (False, SDPA_TWIN_TOL)], ids=["float64-attn", "sdpa"])
def test_recomputation_matches_sampler_and_padding_changes_nothing(
    v1: Path, task: SuccessorTask, exact_attention: bool, tol: float
) -> None:
    model = _model(v1, exact_attention=exact_attention)
    trainer = GRPOTrainer(model, lr=LR)
    gen = torch.Generator().manual_seed(1)
    samples: list[TrainSample] = []
    behaviour: list[list[float]] = []
    # Prompts of several lengths and responses of several lengths in one batch.
    other = tuple(random.Random(7).randrange(4, 1000) for _ in range(11))
    for prompt_ids, max_tokens in [(task.prompt(3).token_ids, task.max_tokens),
                                   (task.prefix, 5), (other, 9)]:
        for ids, lps in sample_torch(model, prompt_ids, 3, max_tokens, generator=gen):
            assert len(ids) == len(lps) == max_tokens
            samples.append(TrainSample(tuple(prompt_ids), tuple(ids), 0.0, 1))
            behaviour.append(lps)
    samples.append(TrainSample(task.prompt(0).token_ids, (), 0.0, 1))  # empty response
    behaviour.append([])
    batched = trainer.token_logprobs(samples)
    worst = max(abs(a - b) for rec, beh in zip(batched, behaviour, strict=True)
                for a, b in zip(rec, beh, strict=True))
    print(f"max |recomputed - behaviour| ({'float64' if exact_attention else 'sdpa'} "
          f"attention): {worst:.2e}")
    assert worst <= tol
    # A mixed-length batch gives each sample exactly what it gets alone.
    assert batched == [trainer.token_logprobs([s])[0] for s in samples]
    # step() reports the same recomputation, taken before the update.
    stats = trainer.step(samples)
    assert stats.logprobs == batched
    assert stats.grad_norm == 0.0  # all advantages zero: nothing to learn, no update


def test_step_updates_only_through_scored_tokens(v1: Path, task: SuccessorTask) -> None:
    model = _model(v1)
    trainer = GRPOTrainer(model, lr=LR)
    before = trainer.state_dict()
    p = task.prompt(1)
    right, wrong = task.answer_ids(1)[0], task.digit_ids[0]
    tail = (5, 6, 7)
    samples = [TrainSample(p.token_ids, (right, *tail), 1.0, 1),
               TrainSample(p.token_ids, (wrong, *tail), -1.0, 1)]
    stats = trainer.step(samples)
    # The loss reads the scored (first) token only: -mean(A * logp[0]).
    expected = -(stats.logprobs[0][0] - stats.logprobs[1][0]) / 2
    assert stats.loss == pytest.approx(expected, abs=1e-5)
    assert stats.grad_norm > 0
    after = trainer.state_dict()
    assert after.keys() == before.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # The step moved probability toward the rewarded answer.
    new = trainer.token_logprobs(samples)
    assert new[0][0] > stats.logprobs[0][0]
    assert new[1][0] < stats.logprobs[1][0]


def test_state_dict_is_the_checkpoint_layout_and_detached(v1: Path) -> None:
    from safetensors.torch import load_file

    model = _model(v1)
    trainer = GRPOTrainer(model)
    state = trainer.state_dict()
    ckpt = load_file(str(v1 / "model.safetensors"))
    assert state.keys() == ckpt.keys()
    for name, t in state.items():
        assert t.device.type == "cpu" and t.dtype == torch.float32 and not t.requires_grad
        assert torch.equal(t, ckpt[name])
    # A copy: later in-place updates of the model never reach a published tensor.
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert torch.equal(state["lm_head.weight"], ckpt["lm_head.weight"])


def test_trainer_rejects_non_float32(v1: Path) -> None:
    with pytest.raises(ValueError, match="float32"):
        GRPOTrainer(_model(v1).to(torch.float64))


def test_sampler_deterministic_and_stops_at_eos(v1: Path, task: SuccessorTask) -> None:
    model = _model(v1)
    prompt = task.prompt(2).token_ids

    def draw(seed: int, eos: int | None) -> list[tuple[list[int], list[float]]]:
        return sample_torch(model, prompt, 16, 8, generator=torch.Generator().manual_seed(seed),
                            eos_id=eos)

    assert draw(3, None) == draw(3, None)
    assert draw(3, None) != draw(4, None)
    # Make a likely token the "EOS" so that some samples stop early.
    first = [ids[0] for ids, _ in draw(3, None)]
    eos = max(set(first), key=first.count)
    stopped = draw(3, eos)
    assert any(len(ids) < 8 for ids, _ in stopped)
    for ids, lps in stopped:
        assert len(ids) == len(lps) <= 8
        assert eos not in ids[:-1]  # EOS ends a sample and is part of it, as in vLLM
        assert len(ids) == 8 or ids[-1] == eos
        assert all(lp <= 0.0 for lp in lps)


# --------------------------------------------------------------------------- task


def test_task_shape(task: SuccessorTask) -> None:
    assert len(task.prefix) >= PREFIX_BLOCK_SIZE
    assert task.max_tokens == task.scored_tokens + task.tail_tokens
    assert len(set(task.digit_ids)) == task.k == 5
    for d, prompt in enumerate(task.all_prompts()):
        assert prompt.context == d
        assert prompt.token_ids[: len(task.prefix)] == task.prefix  # the shared prefix
        assert prompt.token_ids[-1] == task.digit_ids[d]  # a single digit token
        assert task.number_values[task.digit_ids[d]] == d
    got = task.prompts(random.Random(5), 50)
    assert got == task.prompts(random.Random(5), 50)
    assert {p.context for p in got} == set(range(task.k))
    line = task.describe()
    assert "\n" not in line and "mod 5" in line


def test_task_reward_on_hand_made_responses(v1: Path, task: SuccessorTask) -> None:
    p3, p4 = task.prompt(3), task.prompt(4)
    digit = task.digit_ids
    by_value = {v: t for t, v in task.number_values.items()}
    junk = 300  # some non-number token
    assert junk not in task.number_values
    assert task.reward(p3, [digit[4]]) == 1.0  # canonical answer " 4"
    assert task.reward(p3, [digit[4], junk, junk, digit[0]]) == 1.0  # the tail is ignored
    assert task.reward(p3, [by_value[14]]) == 1.0  # any number = 4 (mod 5)
    assert task.reward(p4, [digit[0]]) == 1.0  # wraps: successor of 4 is 0
    assert task.reward(p3, [digit[3]]) == 0.0  # wrong digit
    assert task.reward(p3, [junk, digit[4]]) == 0.0  # only the first token is scored
    assert task.reward(p3, []) == 0.0
    assert task.eos_id is not None and task.reward(p3, [task.eos_id]) == 0.0
    graded = SuccessorTask(v1, number_reward=0.25)
    assert graded.reward(graded.prompt(3), [digit[3]]) == 0.25  # a number, wrong residue
    assert graded.reward(graded.prompt(3), [junk]) == 0.0
    two = SuccessorTask(v1, scored_tokens=2, tail_tokens=3)
    assert two.max_tokens == 5
    assert two.answer_ids(3) == (digit[4], digit[0])  # counting on, mod 5
    assert two.reward(two.prompt(3), [digit[4], digit[0]]) == 1.0
    assert two.reward(two.prompt(3), [digit[4], junk]) == 0.5
    assert two.reward(two.prompt(3), [digit[4]]) == 0.5  # a missing position scores 0


def test_task_bad_arguments(v1: Path) -> None:
    for kwargs in ({"k": 1}, {"k": 11}, {"tail_tokens": -1}, {"scored_tokens": 0},
                   {"number_reward": 1.0}):
        with pytest.raises(ValueError):
            SuccessorTask(v1, **kwargs)


# ------------------------------------------------------------------------ the tool task


TOOL_LR = 2e-3  # the demo's rate
TOOL_THRESHOLD = 0.7


def _tool_run(v1: Path, *, steps: int = STEPS, seed: int = SEED, use_tool: bool = True
              ) -> list[float]:
    """The agentic demo's episodes in pure torch: per group one task prompt and N
    episodes, each a sampled call (two tokens), the tool's fresh reading as environment
    tokens, a sampled final answer scored on the reading; group-relative advantages over
    the N episodes; the loss on the final turn's scored token only. ``use_tool=False``
    (the negative control) hides the reading from the policy: the tool's answer is a
    fixed digit, the reward still the reading's. Mean reward per step.

    Measured (40 steps, mean reward per five steps): at lr 2e-3, seed 0: 0.30 0.92 0.96
    0.96 0.98 0.99 0.98 0.96; seed 2, the slowest of 0-3: 0.26 ... 0.80; seed 3: 1.00
    from step 16. At lr 1e-3 (the single-turn test's) seeds 2 and 3 end at 0.67 and 0.55:
    the call tokens make every context different, and the faster rate gets past them."""
    task = ToolTask(v1)
    model = _model(v1)
    trainer = GRPOTrainer(model, lr=TOOL_LR)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    curve = []
    for _ in range(steps):
        samples: list[TrainSample] = []
        rewards: list[float] = []
        for prompt in task.prompts(rng, GROUPS):
            calls = sample_torch(model, prompt.token_ids, N, task.call_tokens, generator=gen)
            readings = [task.reading(rng) for _ in calls]
            finals = [task.final_prompt((*prompt.token_ids, *ids, *task.tool_answer(
                r if use_tool else 0)), r) for (ids, _), r in zip(calls, readings,
                                                                  strict=True)]
            answers = sample_groups(model, [f.token_ids for f in finals], 1,
                                    task.max_tokens, generator=gen, eos_id=task.eos_id)
            rs = [task.reward(f, a[0][0]) for f, a in zip(finals, answers, strict=True)]
            rewards += rs
            for f, a, adv in zip(finals, answers, group_advantages(rs), strict=True):
                samples.append(TrainSample(f.token_ids, tuple(a[0][0]), adv,
                                           task.scored_tokens))
        trainer.step(samples)
        curve.append(statistics.fmean(rewards))
    return curve


@pytest.mark.deep  # the agentic demo (make demo) learns it through the gateway
def test_the_tool_task_is_learned_only_by_reading_the_tool(v1: Path) -> None:
    """Learned from random init (first step below 0.2, last five above 0.7); with the
    reading hidden from the policy (the negative control) it stays near chance (1/K)."""
    curve = _tool_run(v1)
    report = " ".join(f"{r:.2f}" for r in curve)
    print(f"tool task: {report}")
    assert curve[0] < INITIAL_BELOW and statistics.fmean(curve[-LAST:]) > TOOL_THRESHOLD, \
        report
    blind = _tool_run(v1, use_tool=False)
    report = " ".join(f"{r:.2f}" for r in blind)
    print(f"tool hidden: {report}")
    assert statistics.fmean(blind[-LAST:]) < 0.35, report  # chance is 1/5
