"""The reference outputs of a torch model, as vLLM computes them: a greedy decode (EOS
masked, ``min_tokens == max_tokens``) and the prompt's log-probabilities. What an engine
holding the same weights must reproduce (the probe); the trainer's side computes it with
the very weights it sends, the test fixtures with the checkpoints they build."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Greedy:
    token_ids: list[int]
    logprobs: list[float]
    margins: list[float]


def greedy_reference(
    model: Any, prompt_ids: Sequence[int], max_tokens: int, eos_id: int | None, *,
    first_inputs: dict[str, Any] | None = None,
) -> Greedy:
    """Greedy decoding with ``min_tokens == max_tokens``: EOS is masked at every step.

    Equivalent to transformers' ``generate(do_sample=False, max_new_tokens=N,
    min_new_tokens=N)`` and to vLLM's ``temperature=0, max_tokens=N, min_tokens=N``.
    Log-probabilities and margins are of the raw logits (before the EOS mask),
    which is what vLLM returns by default (``logprobs_mode=raw_logprobs``).
    ``first_inputs``: what the first step feeds instead of the prompt's ids (a multimodal
    model's prompt embeddings, the image's in place of its placeholder tokens).
    """
    import torch

    out = Greedy([], [], [])
    step_in = first_inputs or {"input_ids": torch.tensor([list(prompt_ids)], dtype=torch.long)}
    past: Any = None
    with torch.no_grad():
        for _ in range(max_tokens):
            res = model(**step_in, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits: torch.Tensor = res.logits[0, -1].to(torch.float32)
            logp = torch.log_softmax(logits, dim=-1)
            masked = logits.clone()
            if eos_id is not None:
                masked[eos_id] = float("-inf")
            tok = int(torch.argmax(masked).item())
            top2 = torch.topk(masked, 2).values
            out.token_ids.append(tok)
            out.logprobs.append(float(logp[tok].item()))
            out.margins.append(float((top2[0] - top2[1]).item()))
            step_in = {"input_ids": torch.tensor([[tok]], dtype=torch.long)}
    return out


def prompt_logprobs(model: Any, prompt_ids: Sequence[int]) -> list[float]:
    """Log-probability of each prompt token after the first, from one forward pass (what
    vLLM returns for ``prompt_logprobs: 0``): the reference of the scored probe."""
    import torch

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].to(torch.float32)
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, prompt_ids[i]].item()) for i in range(1, len(prompt_ids))]


__all__ = ["Greedy", "greedy_reference", "prompt_logprobs"]
