"""An agentic toy task for the tiny Llama: call a tool, read its answer, state the result.

One episode has two policy turns and one environment step between them:

    prompt  <prefix> Step 3                 (environment: the task)
    turn 1  two tokens, whatever they are   (the policy: its call of the tool)
    tool    " Tool" " 1"                    (environment: the tool's reading r, drawn
                                             fresh per episode; the tool is slow)
    turn 2  " 2"                            (the policy: the result, r + 1 mod K)

The reward reads the final turn only: 1 for a number congruent to ``r + 1 (mod K)``, the
successor of the tool's reading (:class:`SuccessorTask`'s rule, with the reading in place
of the task's digit). The reading is not in the task prompt and changes every episode,
so the reward depends on using what the tool returned: a policy that ignores it is right
one time in K at best. The reading is the last token of the final turn's context, the
same mapping from random initialisation as the single-turn task, behind a context that
now varies (the call tokens). ``tests/test_rl_learning.py`` proves it learnable in pure
torch before the demo runs it through the gateway as episodes.

Only the final turn's scored tokens enter the loss; the prompt, the call and the tool's
answer are its context (the call turn carries no reward of its own).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolloutcore.conformance.demos.task import Prompt, SuccessorTask

TOOL_TEXT = " Tool"
CALL_TOKENS = 2


class ToolTask:
    """The task prompts, the tool, and the reward of an episode's final turn."""

    def __init__(self, tokenizer_dir: str | Path, *, k: int = 5, tail_tokens: int = 4
                 ) -> None:
        from transformers import PreTrainedTokenizerFast

        self.base = SuccessorTask(tokenizer_dir, k=k, tail_tokens=tail_tokens)
        tok: Any = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
        self.tool_prefix: tuple[int, ...] = tuple(tok.encode(TOOL_TEXT,
                                                             add_special_tokens=False))
        self.k = k
        self.call_tokens = CALL_TOKENS
        self.max_tokens = self.base.max_tokens  # of the final turn
        self.scored_tokens = self.base.scored_tokens
        self.eos_id = self.base.eos_id

    def prompts(self, rng: random.Random, n: int) -> list[Prompt]:
        """Task prompts (``<prefix> Step d``): the episode's first context."""
        return self.base.prompts(rng, n)

    def all_prompts(self) -> list[Prompt]:
        return self.base.all_prompts()

    def reading(self, rng: random.Random) -> int:
        """What the tool answers this episode: a digit the policy cannot know before."""
        return rng.randrange(self.k)

    def tool_answer(self, reading: int) -> tuple[int, ...]:
        """The tool's answer as environment tokens (ends with the reading's digit)."""
        return (*self.tool_prefix, self.base.digit_ids[reading])

    def final_prompt(self, context: Sequence[int], reading: int) -> Prompt:
        """The final turn's context as a prompt whose digit is the tool's reading."""
        return Prompt(tuple(context), reading)

    def reward(self, final: Prompt, answer_ids: Sequence[int]) -> float:
        return self.base.reward(final, answer_ids)

    def describe(self) -> str:
        return (f"tool use mod {self.k}: task prompt -> {self.call_tokens} call tokens -> "
                f"the tool answers{TOOL_TEXT!r} + a fresh digit r -> reward 1 if the "
                f"final turn's first token is a number = r+1 (mod {self.k}); "
                f"{self.scored_tokens} scored + {self.base.tail_tokens} tail tokens")


__all__ = ["CALL_TOKENS", "ToolTask"]
