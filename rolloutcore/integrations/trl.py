"""TRL's ``GRPOTrainer`` generating and publishing through RolloutCore.

    bridge = TRLBridge(RolloutClient(gateway_url, "my-model", logprobs_mode=mode),
                       Publisher(fleet, sources, probe_prompt=...),
                       num_generations=8, sampling=Sampling(max_tokens=64))
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(...),
                          train_dataset=ds, processing_class=tokenizer,
                          rollout_func=bridge.rollout_func, callbacks=[bridge.callback])

Two hooks TRL 1.16 documents, nothing of TRL subclassed or patched; its loss,
advantages, logging and config stay its own.

Generation (``rollout_func``). TRL hands it its batch, each prompt repeated
``num_generations`` times in a row. The bridge asks the gateway for each prompt's group as
one admission (``n`` samples on one member under one generation), and returns the token
ids and the engine's behaviour logprobs (TRL reads them for its off-policy mask; its
importance-sampling correction is tied to its own vLLM mode). Every sample also carries
``generation``, ``identity`` (the digest of the weights that served it), ``engine``,
``rollout_id`` and ``logprobs_mode``: TRL keeps these in its batch and passes them to the
reward functions. With ``records`` set, each group's trajectory records are appended to
that file (``rolloutcore records verify`` checks them against the fleet journal).

Publishing (``callback``). After each optimiser step (``on_step_end``, which TRL calls
with the updated model) the model's weights are published as a verified fleet update; a
publish the fleet cannot verify raises :class:`PublishError` with the fleet's report,
which ends ``train()``. TRL 1.16's GRPOTrainer has no sync cadence of its own: it syncs
its vLLM weights before every generation, and so does this bridge.

Staleness. GRPOTrainer generates right after the publish, so each group must be served
by the generation just published: the bridge names it as the group's minimum generation
(RolloutCore's admission floor, ``max_lag`` 0). ``max_lag=k`` lets a group be admitted up
to ``k`` generations behind (TRL's experimental async trainer's ``max_staleness``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rolloutcore.errors import BadInput
from rolloutcore.rl.client import Group, GroupError, RolloutClient, Sampling
from rolloutcore.rl.publish import Published, Publisher
from rolloutcore.trajectories.format import write_jsonl

#: The per-sample fields the bridge adds to TRL's batch (and to the reward functions).
SAMPLE_FIELDS = ("generation", "identity", "engine", "rollout_id", "logprobs_mode")


class TRLBridge:
    """``rollout_func`` and a ``TrainerCallback`` for TRL's GRPOTrainer (module doc)."""

    def __init__(self, client: RolloutClient, publisher: Publisher, *, num_generations: int,
                 sampling: Sampling, generation: int = 1, max_lag: int = 0,
                 records: Path | None = None, on_group: Callable[[Group], None] | None = None,
                 on_publish: Callable[[int, Published], None] | None = None,
                 before_publish: Callable[[int], None] | None = None,
                 concurrency: int = 16) -> None:
        if num_generations < 1 or max_lag < 0 or generation < 1 or concurrency < 1:
            raise BadInput(f"num_generations {num_generations}, generation {generation} and "
                           f"concurrency {concurrency} >= 1, max_lag {max_lag} >= 0 required")
        self.client, self.publisher = client, publisher
        self.n, self.sampling, self.max_lag = num_generations, sampling, max_lag
        self.concurrency = concurrency  # groups asked for at once
        self.generation = generation  # the newest generation published
        self.records, self.on_group = records, on_group
        self.on_publish, self.before_publish = on_publish, before_publish
        self.published: list[Published] = []
        self.callback = _PublishEachStep(self)

    # ------------------------------------------------------------------- generation

    def rollout_func(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        """TRL's ``rollout_func(prompts, trainer)``: one group per ``num_generations``
        repeats of a prompt, one sample per entry of ``prompts``, in order."""
        if len(prompts) % self.n:
            raise BadInput(f"{len(prompts)} prompts are not groups of num_generations {self.n}")
        out: dict[str, list[Any]] = {k: [] for k in (
            "prompt_ids", "completion_ids", "logprobs", *SAMPLE_FIELDS)}
        firsts = []
        for start in range(0, len(prompts), self.n):
            repeats = prompts[start:start + self.n]
            if any(p != repeats[0] for p in repeats):
                raise BadInput("TRL's batch does not repeat each prompt num_generations times "
                               f"in a row (entries {start}..{start + self.n - 1})")
            firsts.append(_token_ids(repeats[0], trainer))
        floor = max(1, self.generation - self.max_lag)
        # The groups of a batch are asked for at once (the gateway spreads them over the
        # members), and come back in TRL's order.
        with ThreadPoolExecutor(min(self.concurrency, len(firsts)) or 1) as pool:
            groups = list(pool.map(lambda ids: self.client.generate_group(
                ids, self.n, self.sampling, min_generation=floor), firsts))
        for ids, group in zip(firsts, groups, strict=True):
            if group.aborted:  # Partial.WAIT: a group is served whole or not returned
                raise GroupError(f"group {group.binding.rollout_id} came back aborted")
            if self.records is not None:
                write_jsonl(self.records, group.records(), append=True)
            if self.on_group is not None:
                self.on_group(group)
            for s in group.samples:
                out["prompt_ids"].append(list(ids))
                out["completion_ids"].append(list(s.token_ids))
                out["logprobs"].append(list(s.logprobs))
                out["generation"].append(group.generation)
                out["identity"].append(group.identity)
                out["engine"].append(group.engine)
                out["rollout_id"].append(group.binding.rollout_id)
                out["logprobs_mode"].append(self.client.logprobs_mode)
        return out

    # --------------------------------------------------------------------- publishing

    def publish(self, model: Any, step: int) -> Published:
        """Publish ``model``'s weights after optimiser step ``step`` (verified, or
        PublishError with the fleet's report)."""
        if self.before_publish is not None:
            self.before_publish(step)
        pub = self.publisher.publish(model, f"trl-step-{step}")
        self.generation = pub.generation
        self.published.append(pub)
        if self.on_publish is not None:
            self.on_publish(step, pub)
        return pub


class _PublishEachStep(TrainerCallback):
    def __init__(self, bridge: TRLBridge) -> None:
        self.bridge = bridge

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    **kwargs: Any) -> None:
        if model is None:
            raise BadInput("TRL called on_step_end without the model: cannot publish")
        self.bridge.publish(model, int(state.global_step))


def _token_ids(prompt: Any, trainer: Any) -> tuple[int, ...]:
    """A prompt as token ids: TRL passes a dataset's ``prompt`` as it is (token ids, or
    text the trainer's processing class tokenizes; chat messages are not supported)."""
    if isinstance(prompt, str):
        return tuple(trainer.processing_class(prompt, add_special_tokens=False)["input_ids"])
    if isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
        return tuple(prompt)
    raise BadInput(f"a prompt must be token ids or text, got {type(prompt).__name__}")


__all__ = ["SAMPLE_FIELDS", "TRLBridge"]
