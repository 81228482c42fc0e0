"""Cache-tier controls on real vLLM, each negative control next to its positive twin.

Encoder tier, on a real multimodal model (the tiny BLIP-2 of :mod:`.tiny_mm_model`): v1
and v2 differ only in the vision tower, so an image's output changes with the update
while its prompt tokens do not; every chat carries a fresh ``cache_salt`` so the prefix
cache never answers and only the encoder cache can carry an old result across.

* ``encoder_stale`` (gloo weight transfer, vLLM's own path for trainers, which never
  resets the encoder cache): *twin*: RolloutCore's cycle to v2 (pause, transfer, every
  tier reset and verified, validate, publish); the same image then gives v2's reference.
  *Control*: the same transfer back to v1 without the resets; the same image then gives
  v2's tokens and log-probabilities again (the stale encoder output), not v1's, while
  the engine vouches for v1's weights.
* ``encoder_crash`` (vLLM's in-place ``reload_weights``, which empties only the worker's
  half of the encoder cache): *twin*: RolloutCore's cycle over the reload path; the image
  then gives v2's reference. *Control*: ``reload_weights`` through ``/collective_rpc``
  alone; the scheduler still lists the image, skips the encoder, and the engine dies
  ("Encoder cache miss"), the server with it.

Prefix tier under a LoRA adapter (the tiny Llama v1 with the adapters of
:mod:`.tiny_lora`):

* ``lora_inplace``: *control*: an adapter served from a path, the path overwritten with
  new adapter weights and reloaded in place (``load_inplace``, vLLM's way); the prompt's
  prefix blocks computed under the old adapter are reused and the output is not the new
  adapter's reference. *Twin*: RolloutCore's adapter update (pause, a digested read-only
  copy loaded from a fresh path, every tier reset, identity of base and adapter
  verified, probe through the adapter, publish): the new adapter's reference.

Usage: ``python -m rolloutcore.conformance.cache_controls [--json FILE]`` (exit 1
when a check fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
from rolloutcore.conformance.fixtures.tiny_mm_model import DEFAULT_OUT, build_mm_models, data_url
from rolloutcore.conformance.fixtures.vllm_server import VllmServer
from rolloutcore.conformance.transfer_scenarios import GLOO, Row, session
from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import open_controller

#: A multimodal server: the transfer extension (a subclass of RolloutCore's), one image
#: per prompt.
MM_SERVER_ARGS: tuple[str, ...] = (*GLOO.server_args(), "--enable-prompt-tokens-details",
                                   "--limit-mm-per-prompt", '{"image":1}')
POLICY = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=60.0, drain_timeout_s=60.0)


def mm_server(model: Path, log_path: Path) -> VllmServer:
    return VllmServer(model.resolve(), extra_args=MM_SERVER_ARGS, log_path=log_path)


@dataclass(frozen=True)
class Chat:
    status: int | None
    tokens: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    cached_tokens: int | None = None
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        return {"status": self.status, "tokens": self.tokens,
                "logprobs": [round(x, 6) for x in self.logprobs or ()],
                "cached_tokens": self.cached_tokens, "error": self.error}


class MMClient:
    """Chats about the probes of ``references.json`` (an image as a base64 PNG data URL)."""

    def __init__(self, url: str, model_dir: Path) -> None:
        self.http = httpx.Client(base_url=url, timeout=120.0, trust_env=False)
        refs = json.loads((model_dir / "references.json").read_text())
        self.probes = {p["name"]: p for p in refs["probes"]}
        self.images = {p["image"]: data_url((model_dir / p["image_file"]).read_bytes())
                       for p in refs["probes"] if p["image"]}

    def chat(self, probe: str, salt: str) -> Chat:
        p = self.probes[probe]
        content: list[dict[str, Any]] = [{"type": "text", "text": p["prompt"]}]
        if p["image"]:
            content.insert(0, {"type": "image_url", "image_url": {"url": self.images[p["image"]]}})
        body = {"model": "tiny", "messages": [{"role": "user", "content": content}],
                "temperature": 0.0, "max_tokens": p["max_tokens"], "min_tokens": p["max_tokens"],
                "logprobs": True, "return_token_ids": True, "cache_salt": salt}
        try:
            r = self.http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as e:
            return Chat(None, error=f"{type(e).__name__}: {e}")
        if r.status_code != 200:
            return Chat(r.status_code, error=r.text[:300])
        js = r.json()
        choice = js["choices"][0]
        details = (js.get("usage") or {}).get("prompt_tokens_details") or {}
        return Chat(200, tokens=list(choice["token_ids"]),
                    logprobs=[float(c["logprob"]) for c in choice["logprobs"]["content"]],
                    prompt_token_ids=js.get("prompt_token_ids"),
                    cached_tokens=details.get("cached_tokens"))

    def close(self) -> None:
        self.http.close()


def _reference(models: Mapping[str, Path], version: str, probe: str) -> dict[str, Any]:
    refs = json.loads((models[version] / "references.json").read_text())
    return next(p for p in refs["probes"] if p["name"] == probe)


def _matches(chat: Chat, ref: dict[str, Any], tol: float = 1e-3) -> bool:
    """Same tokens as the transformers reference, log-probabilities within ``tol``."""
    return chat.tokens == ref["output_token_ids"] and chat.logprobs is not None and max(
        abs(a - b) for a, b in zip(chat.logprobs, ref["output_logprobs"], strict=True)) <= tol


def _max_diff(a: Chat, b: Chat) -> float | None:
    if a.logprobs is None or b.logprobs is None or len(a.logprobs) != len(b.logprobs):
        return None
    return max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


def _cache(http: HttpAdapter) -> dict[str, Any]:
    info = http.cache_info(time.monotonic() + 30.0)
    return {k: info[k] for k in ("encoder_cache_keys", "encoder_scheduler_keys",
                                 "encoder_entries", "mm_receiver_entries")}


def _resets(rep: CycleReport) -> list[list[str]]:
    return [[st.step, st.outcome, st.reason] for st in rep.steps if st.step.startswith("reset")]


def _twin(row: Row, runner: LifecycleRunner, http: HttpAdapter, client: MMClient,
          models: Mapping[str, Path], salt: str) -> Chat:
    """The positive twin: v1 serves the image, RolloutCore's cycle moves to v2, the same
    image (fresh salt) then gives v2's reference."""
    before = client.chat("img_a", f"{salt}-before")
    row.check("v1 serves the image as the reference says",
              _matches(before, _reference(models, "v1", "img_a")), before.summary())
    warm = _cache(http)
    row.check("the image's encoder output is cached (worker and scheduler)",
              len(warm["encoder_cache_keys"]) == 1 and
              warm["encoder_scheduler_keys"] == warm["encoder_cache_keys"], warm)
    rep = runner.update(checkpoint_target(models["v2"].resolve(), 2, "v2-gen2"))
    row.check("RolloutCore's cycle publishes v2", rep.published,
              [(st.step, st.outcome) for st in rep.steps])
    after = _cache(http)
    row.evidence.update(twin_before=before.summary(), cache_warm=warm,
                        twin_resets=_resets(rep), cache_after_cycle=after)
    row.check("every encoder entry is gone in both halves and the receiver cache is empty",
              after["encoder_entries"] == 0 and after["mm_receiver_entries"] == 0, after)
    now = client.chat("img_a", f"{salt}-after")
    row.evidence["twin_after"] = now.summary()
    row.check("the same image now gives v2's reference",
              _matches(now, _reference(models, "v2", "img_a")), now.summary())
    row.check("and not v1's output", now.tokens != before.tokens, now.tokens)
    return now


def control_encoder_stale(models: Mapping[str, Path], work: Path) -> Row:
    row = Row("encoder_stale", "gloo")
    srv = mm_server(models["v1"], work / "vllm-encoder-stale.log")
    client: MMClient | None = None
    try:
        with session(GLOO, dict(models), "v1", work, server=srv) as s:
            assert s.runner is not None and s.adapter is not None and s.http is not None
            client = MMClient(srv.url, models["v1"])
            served = _twin(row, s.runner, s.http, client, models, "stale")
            # The control: the same transfer path, back to v1's tower, without the cycle.
            ev = s.adapter.mutate(checkpoint_target(models["v1"].resolve(), 3, "v1-gen3"),
                                  time.monotonic() + 60.0)
            view = s.engine_view()
            row.check("the bare transfer loaded v1 (the engine vouches for v1's weights)",
                      view["identity"] == s.target("v1", 1).identity,
                      {"outcome": ev.outcome.name, "observed": ev.observed})
            kept = _cache(s.http)
            row.evidence["cache_after_bare_transfer"] = kept
            row.check("the encoder cache still holds the image (the transfer reset nothing)",
                      len(kept["encoder_cache_keys"]) == 1 and
                      kept["encoder_scheduler_keys"] == kept["encoder_cache_keys"], kept)
            stale = client.chat("img_a", "stale-control")
            row.evidence.update(control_after=stale.summary(),
                                control_max_logprob_diff_to_v2_output=_max_diff(stale, served))
            row.check("the image's output is v2's, token for token (stale encoder output)",
                      stale.tokens == served.tokens, stale.tokens)
            row.check("with v2's log-probabilities", _max_diff(stale, served) == 0.0,
                      _max_diff(stale, served))
            row.check("not v1's reference", stale.tokens !=
                      _reference(models, "v1", "img_a")["output_token_ids"], stale.tokens)
            text = client.chat("text_only", "stale-text")
            row.check("text without an image is v1's (the language model is unchanged)",
                      _matches(text, _reference(models, "v1", "text_only")), text.summary())
    except Exception as e:  # a row reports; the caller decides
        row.error = f"{type(e).__name__}: {e}"
    finally:
        if client is not None:
            client.close()
        srv.stop()
    return row


def control_encoder_crash(models: Mapping[str, Path], work: Path) -> Row:
    row = Row("encoder_crash", "reload")
    srv = mm_server(models["v1"], work / "vllm-encoder-crash.log")
    client: MMClient | None = None
    http: HttpAdapter | None = None
    journal: Any = None
    try:
        srv.start()
        http = HttpAdapter(srv.url, model=srv.served_model_name)
        controller, journal, _rec = open_controller(work / "journal-encoder-crash.jsonl")
        runner = LifecycleRunner(controller, http, POLICY)
        out = runner.bootstrap(checkpoint_target(models["v1"].resolve(), 1, INITIAL_LABEL))
        if out.trigger != "bootstrap_ok":
            raise RuntimeError(f"bootstrap failed: {out.reason}")
        client = MMClient(srv.url, models["v1"])
        _twin(row, runner, http, client, models, "crash")
        # The control: vLLM's own in-place reload, nothing else.
        r = http.request("POST", "/collective_rpc", op="control", idempotent=False,
                         json_body={"method": "reload_weights",
                                    "kwargs": {"weights_path": str(models["v1"].resolve())}},
                         deadline=time.monotonic() + 60.0)
        row.check("vLLM's reload_weights answers 200", r.status == 200, r.status)
        split = _cache(http)
        row.evidence["cache_after_bare_reload"] = split
        row.check("the worker's half is empty, the scheduler still lists the image",
                  split["encoder_cache_keys"] == [] and
                  len(split["encoder_scheduler_keys"]) == 1, split)
        crash = client.chat("img_a", "crash-control")
        row.evidence["control_after"] = crash.summary()
        row.check("the same image (no prefix hit) fails", crash.status != 200, crash.status)
        deadline = time.monotonic() + 30.0
        while srv.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = srv.log_path.read_text(errors="replace")
        row.evidence["server_exit"] = "exited" if not srv.is_running() else "still running"
        row.check("the engine died of the encoder-cache miss",
                  "Encoder cache miss" in log and not srv.is_running(),
                  [ln[-160:] for ln in log.splitlines() if "Encoder cache miss" in ln][:1])
    except Exception as e:
        row.error = f"{type(e).__name__}: {e}"
    finally:
        for closing in (client, http, journal):
            if closing is not None:
                closing.close()
        srv.stop()
    return row


LORA_SERVER_ARGS: tuple[str, ...] = (
    *GLOO.server_args(), "--enable-prompt-tokens-details", "--enable-lora",
    "--max-lora-rank", "8", "--max-loras", "2")
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def _replace_files(src: Path, dst: Path) -> None:
    """``dst``'s files become ``src``'s, each swapped in whole (``os.replace``): vLLM's
    tensors are memory-mapped views, so a file overwritten where it lies would change
    the served weights before any reload (not the hazard this control shows)."""
    dst.mkdir(exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            tmp = dst / f".{f.name}.tmp"
            shutil.copyfile(f, tmp)
            os.replace(tmp, dst / f.name)


def _probe(http: HttpAdapter, ref: dict[str, Any]) -> dict[str, Any]:
    ev = http.probe(tuple(ref["prompt_token_ids"]), ref["max_tokens"], time.monotonic() + 60.0)
    return {"status": ev.http_status, "tokens": list(ev.tokens or ()),
            "logprobs": [round(x, 6) for x in ev.logprobs or ()],
            "cached_tokens": ev.prefix_hits, "error": ev.error}


def control_lora_inplace(_models: Mapping[str, Path], work: Path) -> Row:
    from rolloutcore.conformance.fixtures.tiny_lora import build_lora_adapters
    from rolloutcore.conformance.fixtures.tiny_model import build_models
    from rolloutcore.engine.targets import adapter_target

    row = Row("lora_inplace", "lora")
    base = build_models()["v1"].resolve()
    adapters = {k: v.resolve() for k, v in build_lora_adapters().items()}
    refs = {k: _reference(adapters, k, "long") for k in adapters}
    srv = VllmServer(base, extra_args=LORA_SERVER_ARGS, env=LORA_ENV,
                     log_path=work / "vllm-lora.log")
    raw: HttpAdapter | None = None
    http: HttpAdapter | None = None
    journal: Any = None
    try:
        srv.start()
        # The control: vLLM's own in-place reload of an adapter from the same path.
        raw = HttpAdapter(srv.url, model="raw")
        path = work / "user-adapter"
        _replace_files(adapters["a1"], path)
        dl = time.monotonic() + 60.0
        first = raw.request("POST", "/v1/load_lora_adapter", op="control", idempotent=False,
                            deadline=dl, json_body={"lora_name": "raw", "lora_path": str(path)},
                            expect_json=False)
        row.check("vLLM loads the adapter a1 from a path", first.status == 200, first.status)
        before = _probe(raw, refs["a1"])
        again = _probe(raw, refs["a1"])
        row.check("a1 is served as its reference says (and cached)",
                  before["tokens"] == refs["a1"]["output_token_ids"] and
                  again["cached_tokens"] == 128, [before, again])
        _replace_files(adapters["a2"], path)
        inplace = raw.request("POST", "/v1/load_lora_adapter", op="control", idempotent=False,
                              deadline=time.monotonic() + 60.0,
                              json_body={"lora_name": "raw", "lora_path": str(path),
                                         "load_inplace": True}, expect_json=False)
        row.check("vLLM reloads it in place from the same path", inplace.status == 200,
                  inplace.status)
        stale = _probe(raw, refs["a2"])
        row.evidence.update(control_before=before, control_after=stale)
        row.check("the old adapter's prefix blocks are reused", stale["cached_tokens"] == 128,
                  stale["cached_tokens"])
        row.check("the output is not a2's reference", stale["tokens"] !=
                  refs["a2"]["output_token_ids"], stale["tokens"])
        row.evidence["control_equals_a1_reference"] = \
            stale["tokens"] == refs["a1"]["output_token_ids"]
        log = srv.log_path.read_text(errors="replace")
        row.evidence["vllm_warning"] = next(
            (ln[-220:] for ln in log.splitlines() if "in place from the same path" in ln), None)

        # The twin: RolloutCore's adapter update, on the same server and base weights.
        http = HttpAdapter(srv.url, lora="pol")
        base_identity = checkpoint_target(base, 1, INITIAL_LABEL).identity
        t1 = adapter_target(adapters["a1"], "pol", 1, "pol-a1", base_identity=base_identity)
        t2 = adapter_target(adapters["a2"], "pol", 2, "pol-a2", base_identity=base_identity)
        install = http.mutate(t1, time.monotonic() + 60.0)  # the engine's first adapter
        row.check("the first adapter installs (staged, digested, loaded)",
                  install.outcome.name == "COMPLETED", install.observed)
        controller, journal, _rec = open_controller(work / "journal-lora.jsonl")
        runner = LifecycleRunner(controller, http, POLICY)
        out = runner.bootstrap(t1)
        row.check("bootstrap verifies base and adapter a1", out.trigger == "bootstrap_ok",
                  out.reason)
        served = _probe(http, refs["a1"])
        warm = _probe(http, refs["a1"])
        row.check("a1 through RolloutCore's adapter, cached",
                  served["tokens"] == refs["a1"]["output_token_ids"] and
                  warm["cached_tokens"] == 128, [served, warm])
        rep = runner.update(t2)
        row.check("RolloutCore's adapter update publishes a2", rep.published,
                  [(st.step, st.outcome, st.reason) for st in rep.steps])
        after = _probe(http, refs["a2"])
        lora = http._worker_results(http.rpc("rc_lora_identity", op="test", name="pol"),
                                    "test")[0]
        row.evidence.update(twin_before=served, twin_resets=_resets(rep), twin_after=after,
                            twin_engine_adapter=lora,
                            twin_identity=http.read_identity(time.monotonic() + 30.0))
        row.check("the engine vouches for base + a2 (digest of the staged copy)",
                  row.evidence["twin_identity"] == t2.identity, row.evidence["twin_identity"])
        row.check("loaded from a fresh staged path, not the user's",
                  lora.get("path") not in (str(path), str(adapters["a2"])), lora.get("path"))
        row.check("the output is a2's reference", after["tokens"] ==
                  refs["a2"]["output_token_ids"], after)
    except Exception as e:
        row.error = f"{type(e).__name__}: {e}"
    finally:
        for closing in (raw, http, journal):
            if closing is not None:
                closing.close()
        srv.stop()
    return row


Control = Callable[[Mapping[str, Path], Path], Row]
CONTROLS: tuple[Control, ...] = (control_encoder_stale, control_encoder_crash,
                                 control_lora_inplace)


def run_all(models: Mapping[str, Path], work: Path) -> list[Row]:
    return [control(models, work) for control in CONTROLS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="write every row's checks and evidence here")
    names = {c.__name__.removeprefix("control_"): c for c in CONTROLS}
    parser.add_argument("--control", choices=sorted(names), action="append",
                        help="run only this control (repeatable; default: all)")
    args = parser.parse_args(argv)
    models = build_mm_models(DEFAULT_OUT)
    chosen = [names[n] for n in args.control] if args.control else list(CONTROLS)
    with tempfile.TemporaryDirectory(prefix="rc-cache-") as tmp:
        rows = [control(models, Path(tmp)) for control in chosen]
    for row in rows:
        print(f"{row.scenario:15} {'pass' if row.passed else 'FAIL'}")
        for failure in row.failures():
            print(f"    {failure}")
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for r in rows], indent=1) + "\n")
    if not all(r.passed for r in rows):
        print("cache controls: a check failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
