"""The negative control of the TRL run: TRL's weight sync as a call sequence on a real
vLLM server, with a rollout in flight.

TRL's own sync path needs its ``trl vllm-serve`` server and NCCL (a GPU), which this CPU
build cannot run; its calls are reproduced here against the same server the TRL run uses,
in the order TRL's asynchronous trainer makes them: pause the engine in ``keep`` mode
(in-flight requests freeze), load the new weights in place, reset the prefix cache
(TRL checks the HTTP status only), resume. The version TRL stamps on the rollout is the
one at scheduling time. The evidence is the rollout's own tokens: the engine's behaviour
logprobs against the two policies recomputed offline (float32, float64 attention: exact
to 1e-4 nats). The tokens before the load are v1's; the tokens after it are neither v1's
nor v2's, because v2's weights continued on the KV that v1 computed (the prefix reset was
refused while the request held its blocks, with HTTP 200). One rollout, labelled v1,
sampled by two policies and a stale cache. Its positive twin is the TRL run itself, where
every group is drained before a publish and every token agrees with TRL's model.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.conformance.demos.grpo import TrainSample, load_model, token_logprobs

AGREE = 1e-4  # nats: the exact recomputation's bound (make demo's logprob check)
TOKENS = 48  # generated after the first streamed token (min_tokens holds them to it)


def keep_pause_sync(engine: Any, targets: Mapping[int, Any], models: Mapping[str, Path]
                    ) -> dict[str, Any]:
    """Run the sequence on ``engine`` (a harness engine on v1; left on v2) and return the
    evidence: per generated token, whether its behaviour logprob is v1's, v2's, or
    neither's, and what the prefix reset answered."""
    http = engine.http
    prompt = list(engine.prompt("rollout"))
    body = {"model": "tiny", "prompt": prompt, "max_tokens": TOKENS, "min_tokens": TOKENS,
            "temperature": 1.0, "seed": 7, "logprobs": 0, "return_token_ids": True,
            "stream": True}
    tokens: list[int] = []
    logprobs: list[float] = []
    ev: dict[str, Any] = {}
    with httpx.Client(base_url=engine.server.url, timeout=120) as client, \
            client.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        for line in lines:  # until the first token: the rollout is running on v1
            if _chunk(line, tokens, logprobs):
                break
        # The rollout is frozen from here to the resume: the cause is the pause itself.
        # TRL's calls, each judged by its HTTP status as TRL judges them.
        pause = client.post("/pause", params={"mode": "keep", "clear_cache": "false"})
        mutated = http.mutate(targets[2], time.monotonic() + 120)
        reset = client.post("/reset_prefix_cache", params={"reset_running_requests": "false"})
        resumed = client.post("/resume")
        ev.update(tokens_before_load=len(tokens), pause_status=pause.status_code,
                  mutation=str(mutated.outcome), reset_http_status=reset.status_code,
                  reset_success=reset.json().get("success") if reset.content else None,
                  resume_status=resumed.status_code)
        for line in lines:
            _chunk(line, tokens, logprobs)
    sample = [TrainSample(tuple(prompt), tuple(tokens), 0.0, len(tokens))]
    per_policy = {v: token_logprobs(load_model(models[v]), sample)[0] for v in ("v1", "v2")}
    verdicts = []
    for i, b in enumerate(logprobs):
        if abs(b - per_policy["v1"][i]) <= AGREE:
            verdicts.append("v1")
        elif abs(b - per_policy["v2"][i]) <= AGREE:
            verdicts.append("v2")
        else:
            verdicts.append("neither")
    ev.update(tokens=len(tokens), verdicts=verdicts,
              max_diff_v1_after=max((abs(b - a) for b, a in zip(
                  logprobs[ev["tokens_before_load"]:],
                  per_policy["v1"][ev["tokens_before_load"]:], strict=True)), default=0.0))
    return ev


def _chunk(line: str, tokens: list[int], logprobs: list[float]) -> bool:
    """Collect one server-sent event's tokens; whether it held any."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return False
    choice = json.loads(line[6:])["choices"][0]
    ids = choice.get("token_ids") or []
    lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
    tokens += ids
    logprobs += [float(x) for x in lps]
    return bool(ids)


__all__ = ["AGREE", "keep_pause_sync"]
