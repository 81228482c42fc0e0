"""A verifiable toy RL task for the tiny Llama: "successor mod K".

Every prompt is one FIXED shared prefix (a sentence of at least one prefix-cache block,
32 tokens, so that vLLM's prefix cache is live across groups) followed by a short
context naming a digit ``d``; the verifiable answer is a number congruent to
``d + 1 (mod K)``, canonically the single digit ``(d + 1) mod K``:

    <prefix> Step 3   ->   " 4"   (" 14", "4", " 1024" are right as well for K = 5)

The context ends with the digit token itself, so the answer is a function of the last
prompt token: a mapping the 2-layer model reaches from random initialisation in 15-30
policy-gradient steps of 64 samples (tests/test_rl_learning.py). With
``scored_tokens = s > 1`` the answer counts on: scored position ``j`` (from 0) must be
congruent to ``d + 1 + j``. The verifier reads each response token on its own (its
text, not its concatenation with the prompt).

Why any number and not only the digit tokens: a random policy puts ~0.3% of its mass
on the ten digit tokens but ~30% on the ~270 number tokens of the tiny vocabulary
(number = one optional leading space, then ASCII digits), so with ``K = 5`` about 2-6%
on the right residue class: most groups see a success within the first steps.

The reward is binary per scored position (1 for a number of the right residue, else 0)
and the mean over the ``s`` scored positions, in ``[0, 1]``; a missing position (after
an early EOS) scores 0. A graded first rung (partial credit ``number_reward`` for any
number, like "0.5 for any digit") is available but off by default: measured, it
locks each context onto whichever wrong number is rewarded first (a softmax policy
gradient sharpens onto the first rewarded arm, and a group that agrees on it has no
contrast left), and the mean reward then plateaus near the rung.

Everything after the scored tokens is a TAIL that the reward and the loss ignore: it
only keeps rollouts in flight longer (``max_tokens = scored_tokens + tail_tokens``).

Token ids are the tokenizer's with ``add_special_tokens=False`` (no BOS), and the
prompt is built so that ``prefix + context`` and ``prefix + context + answer`` encode,
as text, to exactly the concatenated ids: text and token-id prompts are interchangeable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolloutcore.conformance.fixtures.tiny_model import PREFIX_BLOCK_SIZE

PREFIX_TEXT = (
    "The learner counts on a ring of digits: the controller names one digit and the "
    "learner answers with the next one."
)
#: The context after the prefix; ``{d}`` is the digit, the last token of the prompt.
CONTEXT_TEMPLATE = " Step {d}"
#: How a digit is written where it is named and where it is answered: space + digit,
#: one token ("Ġ3") in the tiny tokenizer.
DIGIT_TEMPLATE = " {d}"


@dataclass(frozen=True)
class Prompt:
    """One prompt: the full token ids (prefix + context) and the digit it names."""

    token_ids: tuple[int, ...]
    context: int


class SuccessorTask:
    """Successor digit mod ``k``: prompts, the verifiable reward, and its description."""

    def __init__(
        self,
        tokenizer_dir: str | Path,
        *,
        k: int = 5,
        tail_tokens: int = 16,
        scored_tokens: int = 1,
        number_reward: float = 0.0,
    ) -> None:
        if not 2 <= k <= 10:
            raise ValueError(f"k must be in [2, 10] (single decimal digits), got {k}")
        if tail_tokens < 0:
            raise ValueError(f"tail_tokens must be >= 0, got {tail_tokens}")
        if scored_tokens < 1:
            raise ValueError(f"scored_tokens must be >= 1, got {scored_tokens}")
        if not 0.0 <= number_reward < 1.0:
            raise ValueError(f"number_reward must be in [0, 1), got {number_reward}")
        from transformers import PreTrainedTokenizerFast

        tok: Any = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
        self.k = k
        self.tail_tokens = tail_tokens
        self.scored_tokens = scored_tokens
        self.number_reward = number_reward
        self.max_tokens = scored_tokens + tail_tokens
        self.eos_id: int | None = tok.eos_token_id

        def encode(text: str) -> list[int]:
            return list(tok.encode(text, add_special_tokens=False))

        self.prefix: tuple[int, ...] = tuple(encode(PREFIX_TEXT))
        if len(self.prefix) < PREFIX_BLOCK_SIZE:
            raise ValueError(
                f"the shared prefix is {len(self.prefix)} tokens, fewer than one "
                f"prefix-cache block ({PREFIX_BLOCK_SIZE})"
            )
        digit_ids: list[int] = []
        for d in range(k):
            digit = encode(DIGIT_TEMPLATE.format(d=d))
            if len(digit) != 1:
                raise ValueError(
                    f"digit {DIGIT_TEMPLATE.format(d=d)!r} encodes to {len(digit)} tokens "
                    f"{digit}, not one: this tokenizer cannot host the task"
                )
            digit_ids.append(digit[0])
        if len(set(digit_ids)) != k:
            raise ValueError(f"digit tokens are not distinct: {digit_ids}")
        self.digit_ids: tuple[int, ...] = tuple(digit_ids)
        # Every token that reads as a number, with its value.
        self.number_values: dict[int, int] = {}
        for token_id in range(len(tok)):
            text = tok.decode([token_id])
            digits = text.removeprefix(" ")
            if digits.isascii() and digits.isdigit():
                self.number_values[token_id] = int(digits)
        if any(self.number_values.get(t) != d for d, t in enumerate(self.digit_ids)):
            raise ValueError("the digit tokens do not read as their own numbers")

        self._prompts: list[Prompt] = []
        for d in range(k):
            context = CONTEXT_TEMPLATE.format(d=d)
            ids = self.prefix + tuple(encode(context))
            if ids[-1] != self.digit_ids[d]:
                raise ValueError(f"context {context!r} does not end with the digit token")
            # Token boundaries must be stable: the prompt as text, and the prompt followed
            # by its answer as text, encode to the concatenated ids (a single answer token).
            if tuple(encode(PREFIX_TEXT + context)) != ids:
                raise ValueError(f"prefix + {context!r} re-tokenizes differently")
            answer = self.answer_ids(d)
            answered = "".join(DIGIT_TEMPLATE.format(d=self._digit(t)) for t in answer)
            if tuple(encode(PREFIX_TEXT + context + answered)) != ids + answer:
                raise ValueError(f"the answer {answered!r} to {context!r} is not single tokens")
            self._prompts.append(Prompt(token_ids=ids, context=d))

    def _digit(self, token_id: int) -> int:
        return self.digit_ids.index(token_id)

    def answer_ids(self, d: int) -> tuple[int, ...]:
        """The canonical right answer for digit ``d``: the digit tokens of ``d+1, ...,
        d+scored_tokens (mod k)``."""
        return tuple(self.digit_ids[(d + j) % self.k] for j in range(1, self.scored_tokens + 1))

    def prompt(self, d: int) -> Prompt:
        """The prompt naming digit ``d``."""
        return self._prompts[d]

    def all_prompts(self) -> list[Prompt]:
        """One prompt per digit, in order (for exhaustive evaluation)."""
        return list(self._prompts)

    def prompts(self, rng: random.Random, n: int) -> list[Prompt]:
        """``n`` prompts with digits drawn uniformly (with replacement) by ``rng``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self._prompts[rng.randrange(self.k)] for _ in range(n)]

    def is_correct(self, prompt: Prompt, position: int, token_id: int) -> bool:
        """Whether ``token_id`` is a right answer at scored ``position`` (from 0)."""
        value = self.number_values.get(token_id)
        return value is not None and value % self.k == (prompt.context + 1 + position) % self.k

    def reward(self, prompt: Prompt, response_ids: Sequence[int]) -> float:
        """Reward in ``[0, 1]`` read from the first ``scored_tokens`` tokens only: per
        position 1 for the right residue, ``number_reward`` for another number, else 0."""
        total = 0.0
        for position, token_id in enumerate(response_ids[: self.scored_tokens]):
            if self.is_correct(prompt, position, token_id):
                total += 1.0
            elif token_id in self.number_values:
                total += self.number_reward
        return total / self.scored_tokens

    def describe(self) -> str:
        """One line for the demo's output."""
        return (
            f"successor mod {self.k}: {len(self.prefix)}-token shared prefix + "
            f"{CONTEXT_TEMPLATE.format(d='d')!r} (d < {self.k}) -> any number = d+1 "
            f"(mod {self.k}); reward per scored token 1 right residue, "
            f"{self.number_reward:g} other number, else 0; "
            f"{self.scored_tokens} scored + {self.tail_tokens} tail tokens "
            f"(max_tokens {self.max_tokens})"
        )
