"""``make demo``: an agentic RL run that learns through RolloutCore, on real vLLM servers.

The loop of :mod:`rl_run` (two vLLM CPU servers behind the gateway, the plain-torch GRPO
trainer publishing its live weights every step, a member SIGKILLed mid-transfer and
re-admitted), with the tool task (:mod:`tool_task`) run as agentic episodes: a group is
``n`` episodes of one task prompt sharing one hold (one member, one generation per
segment, as a group of samples shares one admission), each an episode through the
gateway (``RolloutClient.episode``, policy ``segment``): a call turn, a slow tool (its delay
heavy-tailed: most 20-200 ms, one in twenty 1-3 s, so updates land while episodes wait on
it), the tool's reading as environment tokens, the final turn. The trainer's loss reads
the final turn's scored token only; every token the policy did not sample (the prompt,
the tool's answer) is masked out, and the run checks it. An update that drains a
group's member between its turns ends the group's segment there: the final turns run as
segment 2 under the new generation (both segments journalled and recorded).

Checks beyond :mod:`rl_run`'s: every episode's turns are one generation per segment
(``records verify`` over the per-turn records, and the fleet checker over the journal's
holds), and the loss covers only tokens the mask says the policy sampled.
"""

from __future__ import annotations

import random
import statistics
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolloutcore.conformance.demos.grpo import TrainSample, group_advantages
from rolloutcore.conformance.demos.rl_run import RLConfig, RLRun
from rolloutcore.conformance.demos.rl_run import main as rl_main
from rolloutcore.conformance.demos.tool_task import ToolTask
from rolloutcore.rl import EpisodeRecord, RolloutClient, Sampling
from rolloutcore.trajectories.format import write_jsonl

#: The slow tool: most answers in 20-200 ms, one in twenty in 1-3 s.
TOOL_FAST_S, TOOL_SLOW_S, TOOL_SLOW_P = (0.02, 0.2), (1.0, 3.0), 0.05


@dataclass(frozen=True)
class EpisodeGroup:
    """``n`` episodes of one task prompt: what the buffer holds and the trainer takes."""

    prompt_ids: tuple[int, ...]
    episodes: tuple[EpisodeRecord, ...]
    readings: tuple[int, ...]  # the tool's answer to each

    @property
    def samples(self) -> tuple[EpisodeRecord, ...]:
        return self.episodes

    @property
    def generation(self) -> int:
        """The oldest generation any final turn ran under (the buffer's lag reads it)."""
        return min(e.turns[-1].generation for e in self.episodes)

    @property
    def engine(self) -> str:
        return self.episodes[0].turns[-1].engine

    @property
    def nbytes(self) -> int:
        return sum(16 * len(e.tokens) for e in self.episodes)


class AgenticRun(RLRun):
    """The RL run on the tool task, through episodes."""

    def _task(self, model_dir: Path) -> Any:
        return ToolTask(model_dir, tail_tokens=self.cfg.tail_tokens)

    def _producer(self, task: Any, client: RolloutClient, records: Path
                  ) -> Callable[[random.Random], Any]:
        n = self.cfg.samples_per_group
        call = Sampling(temperature=1.0, max_tokens=task.call_tokens,
                        min_tokens=task.call_tokens)
        answer = Sampling(temperature=1.0, max_tokens=task.max_tokens)
        writing = threading.Lock()
        pools = threading.local()
        self.segmented = 0

        def episode(prompt: tuple[int, ...], reading: int, seed: int, group: str
                    ) -> EpisodeRecord:
            rng = random.Random(seed)
            with client.episode(policy="segment", sampling=answer, group=group) as ep:
                ep.observe(prompt)
                ep.turn(call)
                slow = rng.random() < TOOL_SLOW_P
                threading.Event().wait(rng.uniform(*(TOOL_SLOW_S if slow else
                                                     TOOL_FAST_S)))
                ep.observe(task.tool_answer(reading))
                ep.turn(answer)
                ep.record.check()  # the mask is exactly the tokens the turns sampled
                return ep.record

        def make(rng: random.Random) -> EpisodeGroup:
            pool = getattr(pools, "pool", None)
            if pool is None:
                pool = pools.pool = ThreadPoolExecutor(n, thread_name_prefix="episode")
            prompt = task.prompts(rng, 1)[0].token_ids
            readings = tuple(task.reading(rng) for _ in range(n))
            group = f"group-{rng.randrange(1 << 62):016x}"
            eps = list(pool.map(episode, [prompt] * n, readings,
                                [rng.randrange(1 << 30) for _ in range(n)], [group] * n))
            with writing:  # every episode generated is recorded, consumed or not
                write_jsonl(records, [r for e in eps for r in e.records()], append=True)
                self.segmented += sum(len(e.segments) > 1 for e in eps)
            return EpisodeGroup(prompt, tuple(eps), readings)
        return make

    def _train_samples(self, taken: list[Any], task: Any, by_ids: dict[Any, Any],
                       generation: int) -> tuple[list[TrainSample], list[float],
                                                 list[Any]]:
        samples, rewards, current = [], [], []
        masked = self.result.evidence.setdefault("loss_tokens_outside_mask", 0)
        env_tokens = self.result.evidence.setdefault("environment_tokens_in_context", 0)
        for t in taken:
            g: EpisodeGroup = t.group
            finals = []
            for e, r in zip(g.episodes, g.readings, strict=True):
                last = e.turns[-1]
                final = task.final_prompt(e.tokens[:last.start], r)
                finals.append((e, last, final))
            rs = [task.reward(f, last.token_ids) for _e, last, f in finals]
            rewards += rs
            for (e, last, f), adv in zip(finals, group_advantages(rs), strict=True):
                scored = min(task.scored_tokens, len(last.token_ids))
                masked += sum(not m for m in e.mask[last.start:last.start + scored])
                env_tokens += sum(not m for m in e.mask[:last.start])
                samples.append(TrainSample(f.token_ids, last.token_ids, adv,
                                           task.scored_tokens))
                current.append(last.logprobs if last.generation == generation else None)
        self.result.evidence.update(loss_tokens_outside_mask=masked,
                                    environment_tokens_in_context=env_tokens,
                                    episodes_segmented=getattr(self, "segmented", 0))
        return samples, rewards, current

    def _final_checks(self, buffer: Any, identities: dict[int, str]) -> None:
        super()._final_checks(buffer, identities)
        ev = self.result.evidence
        outside, env = ev.get("loss_tokens_outside_mask", -1), ev.get(
            "environment_tokens_in_context", 0)
        self.check(f"the loss reads only tokens the policy sampled: {outside} loss tokens "
                   f"outside the mask; {env} environment and prompt tokens stayed context",
                   outside == 0 and env > 0)
        steps = self.result.steps
        self.say(f"  {ev.get('episodes_segmented', 0)} episodes went on as a second segment "
                 "under a newer generation (an update drained their member while they "
                 "waited on the tool); records verify checked each turn under its segment")
        if steps:
            ev["reward_mean"] = round(statistics.fmean(s["mean_reward"] for s in steps), 4)


#: The agentic demo's defaults: the tool task learns at lr 2e-3 (tests/test_rl_learning),
#: more slowly than the single-turn task through vLLM (one 30-step run: 0.80 over the
#: last three steps; one 20-step run: 0.47), hence 40 steps and a threshold of 0.5.
AGENTIC = RLConfig(steps=40, threshold=0.5, tail_tokens=4)


def main(*, as_json: bool = False, artifacts: Path | None = None,
         cfg: RLConfig | None = None) -> int:
    return rl_main(as_json=as_json, artifacts=artifacts, cfg=cfg or AGENTIC,
                   runner=AgenticRun, name="agentic-demo")


__all__ = ["AGENTIC", "AgenticRun", "EpisodeGroup", "main"]
