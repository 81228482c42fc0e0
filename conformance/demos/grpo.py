"""A plain-torch GRPO-style trainer (group-relative advantages, no KL, no reference
model) and a torch sampler that stands in for the vLLM fleet.

The sampler mirrors the fleet's sampling exactly: temperature 1, top_p 1, no top-k,
``min_tokens`` 0 (EOS may come first), and the behaviour logprob of each sampled token
is the raw ``log_softmax`` of the unprocessed float32 logits, which is what vLLM returns.
The trainer recomputes those logprobs with one full (non-incremental) forward pass, so a
served policy can be checked against the trained one token by token.

Float32 noise between the two paths: on the tiny Llama, transformers' incremental decode
and its full forward differ by up to ~5e-5 nats (measured), and only in attention, whose
reductions run in a different order for one query row than for a whole sequence (every
linear layer agrees bitwise). :func:`load_model` with ``exact_attention`` (the default)
computes attention in float64, rounded back to float32: both paths then round to the
same float32 values, and the sampler and the trainer agree bitwise but for a rare
one-ulp rounding (measured: 0.0 at v1, at most 5e-6 nats over 36 training runs; weights,
activations and logits stay float32).

The objective, per batch of ``B`` samples with group-relative advantages ``A_i``::

    loss = -(1/B) * sum_i A_i * sum_{t < scored_tokens} log pi(y_i,t | x_i, y_i,<t)

a sequence sum over the scored tokens and a mean over samples (no length normalisation:
every sample scores the same number of tokens, unless EOS came first). Tokens past
``scored_tokens`` (the rollout's tail) are never in the loss. There is no importance
ratio: every step is on-policy (ratio 1, whose gradient is exactly this one), which the
behaviour-vs-recomputed logprob comparison verifies.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: The transformers attention implementation registered by :func:`register_exact_attention`.
EXACT_ATTENTION = "rolloutcore_float64_sdpa"
# A decode step of fewer rows is padded to at least this many: CPU BLAS multiplies 1-3
# rows with other kernels than a sequence's rows (measured: 1.6e-5 nats apart), 8 alike.
_MIN_DECODE_ROWS = 8


def _float64_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.to(torch.float64)
    out, weights = sdpa_attention_forward(
        module, query.double(), key.double(), value.double(), attention_mask, **kwargs
    )
    return out.to(query.dtype), weights


def register_exact_attention() -> str:
    """Register (idempotently) transformers' SDPA attention computed in float64 and
    return its name, for ``attn_implementation=`` or ``model.set_attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(EXACT_ATTENTION, _float64_attention)
    return EXACT_ATTENTION


def load_model(model_dir: str | Path, *, exact_attention: bool = True) -> Any:
    """A float32 ``LlamaForCausalLM`` (any causal LM) from ``model_dir``, in eval mode;
    with ``exact_attention`` its attention runs in float64 (see the module docstring)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if exact_attention:
        kwargs["attn_implementation"] = register_exact_attention()
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    model.eval()
    return model


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """``(r - mean) / (std + eps)`` over one group (population std); all zeros when the
    rewards are all equal, so a group with no contrast teaches nothing."""
    if len(rewards) == 0:
        raise ValueError("group_advantages needs at least one reward")
    values = [float(r) for r in rewards]
    if not all(math.isfinite(r) for r in values):
        raise ValueError(f"rewards must be finite, got {values}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if max(values) == min(values):
        return [0.0] * len(values)
    mean = statistics.fmean(values)
    std = statistics.pstdev(values, mu=mean)
    return [(r - mean) / (std + eps) for r in values]


@dataclass(frozen=True)
class TrainSample:
    """One rollout as the trainer consumes it."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    advantage: float
    #: The loss reads only the first ``scored_tokens`` response tokens (fewer if EOS
    #: ended the response earlier); the rest is the unscored tail.
    scored_tokens: int

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sample needs a non-empty prompt")
        if self.scored_tokens < 0:
            raise ValueError(f"scored_tokens must be >= 0, got {self.scored_tokens}")
        if not math.isfinite(self.advantage):
            raise ValueError(f"advantage must be finite, got {self.advantage}")


@dataclass(frozen=True)
class StepStats:
    """What one optimiser step did."""

    loss: float
    #: The trainer's recomputation, before the optimiser step, of every response
    #: token's logprob per sample (raw log_softmax at temperature 1, float32).
    logprobs: list[list[float]]
    seconds: float
    #: Gradient norm before clipping (0.0 when every advantage is zero).
    grad_norm: float = 0.0


def _check_float32(model: torch.nn.Module) -> None:
    bad = {str(p.dtype) for p in model.parameters() if p.dtype != torch.float32}
    if bad:
        raise ValueError(f"the model must be float32 (logprob agreement), found {sorted(bad)}")


def _response_logprobs(
    model: torch.nn.Module, samples: Sequence[TrainSample]
) -> list[torch.Tensor]:
    """Per sample, the logprob of each response token from full (non-incremental)
    forward passes, one per distinct sequence length; gradients flow if enabled.

    Samples of one total length are stacked with no padding at all: a padded batch
    changes attention's reductions (measured: up to 7e-6 nats on the tiny Llama), while
    the batch size does not change a row (the linear layers see ``batch * length`` rows
    either way), so a sample's values are bitwise those of a forward of it alone.
    """
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        by_length[len(s.prompt_ids) + len(s.response_ids)].append(i)
    result: list[torch.Tensor | None] = [None] * len(samples)
    for width, idx in by_length.items():
        group = [samples[i] for i in idx]
        ids = torch.tensor([s.prompt_ids + s.response_ids for s in group], dtype=torch.long)
        # Only the positions that predict response tokens need the (vocab-wide) head.
        first = min(len(s.prompt_ids) for s in group) - 1
        out: Any = model(input_ids=ids, use_cache=False, logits_to_keep=width - first)
        logits: torch.Tensor = out.logits
        for row, (i, s) in enumerate(zip(idx, group, strict=True)):
            start = len(s.prompt_ids) - 1 - first  # logits at position t predict t + 1
            rows = logits[row, start : start + len(s.response_ids)].to(torch.float32)
            target = torch.tensor(s.response_ids, dtype=torch.long)
            result[i] = torch.log_softmax(rows, dim=-1).gather(1, target[:, None])[:, 0]
    return [t if t is not None else torch.zeros(0) for t in result]


def _context_log_softmax(
    model: torch.nn.Module, contexts: Sequence[tuple[int, ...]], prompt_lens: Sequence[int]
) -> list[torch.Tensor]:
    """Per context (prompt + the scored response tokens but the last), the log-softmax
    rows at the positions that predict its response tokens, with grad; one forward per
    distinct length, no padding."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(contexts):
        by_length[len(c)].append(i)
    result: list[torch.Tensor | None] = [None] * len(contexts)
    for width, idx in by_length.items():
        first = min(prompt_lens[i] for i in idx) - 1
        ids = torch.tensor([contexts[i] for i in idx], dtype=torch.long)
        out: Any = model(input_ids=ids, use_cache=False, logits_to_keep=width - first)
        logits: torch.Tensor = out.logits
        for row, i in enumerate(idx):
            start = prompt_lens[i] - 1 - first
            result[i] = torch.log_softmax(logits[row, start:].to(torch.float32), dim=-1)
    return [t if t is not None else torch.zeros(0) for t in result]


def token_logprobs(model: torch.nn.Module, samples: Sequence[TrainSample]) -> list[list[float]]:
    """Every response token's logprob per sample under ``model``, without grad, batched
    (one forward per distinct sequence length, no padding); ``model`` is left in eval
    mode only for the call (a trainer's own mode is restored)."""
    if not samples:
        return []
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [t.tolist() for t in _response_logprobs(model, samples)]
    finally:
        model.train(training)


class GRPOTrainer:
    """Group-relative policy gradient on a float32 torch causal LM, updated in place.

    The model stays in ``eval()`` mode throughout: the gradient must be that of the
    policy that sampled, which has no dropout (the tiny Llama has none anyway), and the
    recomputed logprobs must equal what the servers report.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        _check_float32(model)
        self.model = model
        self.model.eval()
        self.max_grad_norm = max_grad_norm
        self.steps = 0
        self.optimizer = torch.optim.Adam(
            [p for p in model.parameters() if p.requires_grad],
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
        )

    def token_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Every response token's logprob per sample (see :func:`token_logprobs`)."""
        return token_logprobs(self.model, samples)

    def step(self, samples: Sequence[TrainSample]) -> StepStats:
        """One optimiser step on ``samples`` (see the module docstring for the loss).

        The recomputation of every token is a no-grad pass; the gradient comes from a
        second pass over only what the scored tokens condition on, once per distinct
        context (with one scored token: once per prompt, not once per sample), so the
        tail and the group size cost no backward work. Both passes compute the same
        rows (a row does not depend on what follows it), so the loss is exactly the one
        of the reported logprobs.
        """
        if not samples:
            raise ValueError("step needs at least one sample")
        t0 = time.perf_counter()
        logprobs = self.token_logprobs(samples)
        # Each scored context once: its rows' log-softmax serves every sample sharing it.
        contexts: dict[tuple[int, tuple[int, ...]], list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            scored = min(s.scored_tokens, len(s.response_ids))
            if s.advantage != 0.0 and scored > 0:
                key = (len(s.prompt_ids), s.prompt_ids + s.response_ids[: scored - 1])
                contexts[key].append(i)
        self.model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = -sum(
            s.advantage * sum(lp[: s.scored_tokens])
            for s, lp in zip(samples, logprobs, strict=True)
        ) / len(samples)
        grad_norm = 0.0
        if contexts:
            keys = list(contexts)
            rows = _context_log_softmax(self.model, [seq for _, seq in keys],
                                        [plen for plen, _ in keys])
            terms: list[torch.Tensor] = []
            for key, table in zip(keys, rows, strict=True):
                for i in contexts[key]:
                    s = samples[i]
                    scored = min(s.scored_tokens, len(s.response_ids))
                    target = torch.tensor(s.response_ids[:scored], dtype=torch.long)
                    picked = table[:scored].gather(1, target[:, None]).sum()
                    terms.append(s.advantage * picked)
            loss = -torch.stack(terms).sum() / len(samples)
            loss.backward()  # type: ignore[no-untyped-call]
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            norm = torch.nn.utils.clip_grad_norm_(
                params, self.max_grad_norm if self.max_grad_norm is not None else math.inf
            )
            grad_norm = float(norm)
            self.optimizer.step()
        # else: nothing to learn (every advantage zero); skipping keeps Adam's moments.
        self.steps += 1
        return StepStats(
            loss=float(loss_value),
            logprobs=logprobs,
            seconds=time.perf_counter() - t0,
            grad_norm=grad_norm,
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights under the checkpoint's (HF) names: detached CPU copies,
        so later steps never change tensors already handed out for publishing."""
        return {
            name: t.detach().to("cpu", copy=True).contiguous()
            for name, t in self.model.state_dict().items()
        }


def sample_groups(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    n: int,
    max_tokens: int,
    *,
    generator: torch.Generator,
    eos_id: int | None = None,
) -> list[list[tuple[list[int], list[float]]]]:
    """``n`` samples per prompt (see :func:`sample_torch`), prompts of one length batched
    together (no padding, so nothing perturbs the values); returned in prompt order."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be non-empty")
    _check_float32(model)
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    results: list[list[tuple[list[int], list[float]]]] = [[] for _ in prompts]
    model.eval()
    with torch.no_grad():
        for length in sorted(by_length):
            idx = by_length[length]
            flat = _sample_rows(model, [list(prompts[i]) for i in idx], n, max_tokens,
                                generator, eos_id)
            for j, i in enumerate(idx):
                results[i] = flat[j * n : (j + 1) * n]
    return results


def _sample_rows(
    model: torch.nn.Module,
    prompts: list[list[int]],
    n: int,
    max_tokens: int,
    generator: torch.Generator,
    eos_id: int | None,
) -> list[tuple[list[int], list[float]]]:
    """``n`` samples of each equal-length prompt (prompt-major order): a prefill of every
    row, then incremental decoding with the KV cache. (Prefilling each prompt once and
    repeating its cache saves little and moved logprobs by a measured 3e-6 nats.)"""
    rows = [p for p in prompts for _ in range(n)]
    real = len(rows)
    rows = rows + [rows[-1]] * max(0, _MIN_DECODE_ROWS - real)  # padding rows: dropped
    out: Any = model(
        input_ids=torch.tensor(rows, dtype=torch.long), use_cache=True, logits_to_keep=1
    )
    past = out.past_key_values
    logits: torch.Tensor = out.logits[:, -1].to(torch.float32)
    tokens: list[torch.Tensor] = []
    logps: list[torch.Tensor] = []
    done = torch.zeros(len(rows), dtype=torch.bool)
    for t in range(max_tokens):
        logp = torch.log_softmax(logits, dim=-1)
        tok = torch.multinomial(logp.exp(), 1, generator=generator)  # temperature 1
        tokens.append(tok[:, 0])
        logps.append(logp.gather(1, tok)[:, 0])
        if eos_id is not None:
            done |= tok[:, 0] == eos_id
        if t == max_tokens - 1 or bool(done[:real].all()):
            break
        # Finished rows keep decoding (cheaper than reshaping the cache); cut below.
        out = model(input_ids=tok, past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
        logits = out.logits[:, -1].to(torch.float32)
    all_tok = torch.stack(tokens, dim=1)[:real].tolist()
    all_lp = torch.stack(logps, dim=1)[:real].tolist()
    result: list[tuple[list[int], list[float]]] = []
    for ids, lps in zip(all_tok, all_lp, strict=True):
        end = len(ids)
        if eos_id is not None and eos_id in ids:
            end = ids.index(eos_id) + 1  # EOS is part of the response, as in vLLM
        result.append((ids[:end], lps[:end]))
    return result


def sample_torch(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    n: int,
    max_tokens: int,
    *,
    generator: torch.Generator,
    eos_id: int | None = None,
) -> list[tuple[list[int], list[float]]]:
    """``n`` samples at temperature 1 from the torch model (batched, KV cache), each
    ``(token ids, behaviour logprob of each sampled token)`` with the logprob the raw
    ``log_softmax`` of the unprocessed logits; a sample stops after ``eos_id`` (which it
    includes) if given, else after ``max_tokens``. The pure-torch stand-in for vLLM."""
    return sample_groups(
        model, [prompt_ids], n, max_tokens, generator=generator, eos_id=eos_id
    )[0]
