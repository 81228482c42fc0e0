"""A simulated vLLM server: one :class:`~rolloutcore.adapters.sim.SimEngine` behind a real
HTTP socket, answering the routes, bodies and status codes that
:class:`~rolloutcore.adapters.http.HttpAdapter` uses against vLLM 0.32 (CPU build, dev
mode, our worker extension), with no vLLM import.

It exists so that controllers in *other processes* can drive simulated engines (failover
tests SIGKILL a controller while its engines live on) in milliseconds instead of the real
server's 30 s startup. Run it with::

    python -m rolloutcore.conformance.sim_server --port 0 [--host 127.0.0.1] [--initial v1]
        [--token-seconds S] [--load-seconds S] [--checkpoints v1,v2,...]

It prints its URL on stdout once it listens. :class:`SimServer` starts one in a
subprocess (or, with ``in_thread=True``, in this process) for tests.

Checkpoints are names (``v1``, ``v2``): what ``rc_reload_weights`` receives as
``weights_path`` (a :func:`~rolloutcore.adapters.sim.sim_target`'s ``source``) is the
checkpoint the engine loads, and its identity is :func:`~rolloutcore.adapters.sim.sim_identity`
of that name. An ``HttpAdapter`` driving it needs ``check_source_exists=False`` (there is
no directory to check). With ``--checkpoints`` only those names exist: the worker refuses
another one before touching anything, and vLLM's own ``reload_weights`` dies halfway on it
(the engine dies at the next generation and the server exits with rc 0 about a second
later, as observed on the real server).

Fencing (controller failover) is the worker extension's: one
:class:`~rolloutcore.adapters.epoch_gate.EpochGate` per server (the engine's own,
``SimEngine.gate``); ``rc_fence``, ``rc_epoch``,
and ``rc_reload_weights(..., epoch=)`` run the whole load inside the gate. vLLM's own
routes (pause, sleep, label, resets) carry no epoch and are not gated.

What it does not reproduce (see conformance/VLLM_OBSERVED.md for the real behaviour):

* after a 5xx the real server drops the keep-alive connection unannounced (the next
  request on it dies with "connection reset"); here the 5xx says ``connection: close``;
* sampling: output is the simulator's greedy continuation whatever the temperature,
  ``min_tokens`` is implied (no EOS: every request runs to ``max_tokens``), the text of a
  token is ``" t<id>"``, a text prompt is its UTF-8 bytes; no ``echo``, no chat route;
* a load does not stall generation (vLLM's engine core runs an RPC between steps);
* ``reset_prefix_cache?reset_running_requests=true`` is refused while requests run, as
  without it (the simulator cannot preempt); ``/sleep`` level 2 keeps the weights;
* an abort-mode pause ends the aborted requests at their next token, and a client that
  goes away ends its request at its next token (a queued or frozen one stays queued).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio.to_thread
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rolloutcore.adapters.contract import GenerationResult, PauseMode
from rolloutcore.adapters.epoch_gate import EpochGate
from rolloutcore.adapters.sim import (
    BLOCK,
    VOCAB,
    EngineDead,
    SimEngine,
    _score,
    reference_tokens,
    sim_identity,
)

MODEL = "tiny"
INITIAL_LABEL = "default"  # what a freshly started vLLM reports
#: What :func:`~rolloutcore.adapters.sim.sim_target` says a simulated checkpoint weighs.
SIM_BYTES = 1 << 20
#: Every simulated checkpoint has the same tensors (names, dtypes, shapes).
SIM_MANIFEST = hashlib.sha256(b"sim-manifest").hexdigest()
BASIS_STARTUP = "bytes loaded at startup"
BASIS_RC_RELOAD = "bytes loaded by rc_reload_weights"
BASIS_RELOAD = "bytes loaded by reload_weights"
#: vLLM exits this long after its engine core died (observed: about a second).
EXIT_AFTER_DEATH_S = 1.0
_LABELS = '{engine="0",model_name="%s"}'
_PAUSE_MODES = tuple(m.value for m in PauseMode)
_TRUE = ("1", "true", "t", "yes", "y", "on")
_FALSE = ("0", "false", "f", "no", "n", "off")
_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, *, status: int = 400,
                 kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.param, self.status, self.kind = param, status, kind


class _ClientGone(Exception):
    """Raised into a generation whose client went away: it ends there (vLLM aborts it)."""


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body; after a 5xx the connection is not kept (see the module doc)."""
    headers = {"connection": "close"} if status >= 500 else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status, headers=headers)


def _invalid(param: str, what: str, value: Any) -> _BadRequest:
    """A FastAPI validation error as vLLM renders it (400, type "Bad Request")."""
    return _BadRequest(f"1 validation error:\n  {{'type': 'validation', 'loc': '{param}', "
                       f"'msg': '{what}', 'input': {value!r}}}", param, kind="Bad Request")


def _query_bool(request: Request, name: str, default: bool) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise _invalid(f"query.{name}", "Input should be a valid boolean", raw)


def _query_mode(request: Request) -> PauseMode:
    raw = request.query_params.get("mode", "abort")
    if raw not in _PAUSE_MODES:
        raise _invalid("query.mode", "Input should be 'abort', 'wait' or 'keep'", raw)
    return PauseMode(raw)


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except ValueError as e:
        raise _BadRequest(f"JSON decode error: {e}", kind="Bad Request") from None


def _token_text(token: int) -> str:
    return f" t{token}"


# --------------------------------------------------------------------------- worker


class SimWorker:
    """Our worker extension's ``rc_*`` methods and vLLM's own ``reload_weights``, over the
    simulated engine, with the worker extension's results (one worker)."""

    def __init__(self, engine: SimEngine, gate: EpochGate, *, initial: str,
                 checkpoints: Iterable[str] | None = None, load_seconds: float = 0.0) -> None:
        self.engine = engine
        self.gate = gate
        self.checkpoints = None if checkpoints is None else frozenset(checkpoints)
        self.load_seconds = load_seconds
        self.path = initial  # vLLM's model_config.model: what a bare reload re-reads
        self.basis = BASIS_STARTUP
        self.broken: str | None = None  # why the held weights are not vouched for

    def methods(self) -> dict[str, Callable[..., Any]]:
        return {"rc_identity": self.rc_identity, "rc_reload_weights": self.rc_reload_weights,
                "rc_fence": self.rc_fence, "rc_epoch": self.rc_epoch,
                "rc_cache_info": self.rc_cache_info, "rc_param_digest": self.rc_param_digest,
                "reload_weights": self.reload_weights}

    def _exists(self, name: str) -> bool:
        return self.checkpoints is None or name in self.checkpoints

    def rc_identity(self) -> dict[str, Any]:
        if self.broken is not None:
            return {"identity": None, "reason": self.broken}
        return {"identity": self.engine.identity_reads_as, "basis": self.basis,
                "path": self.path, "manifest": SIM_MANIFEST, "tensors": 1, "bytes": SIM_BYTES}

    def rc_fence(self, epoch: int) -> dict[str, Any]:
        accepted, seen = self.gate.fence(int(epoch))
        return {"accepted": accepted, "seen": seen}

    def rc_epoch(self) -> dict[str, Any]:
        return {"seen": self.gate.seen}

    def rc_reload_weights(self, weights_path: str, expected_identity: str = "",
                          epoch: int | None = None) -> dict[str, Any]:
        # The whole load is one critical section with the fence, as in the worker extension:
        # a fence arriving meanwhile waits for it, and no load starts after a newer fence.
        with self.gate.hold(epoch) as ok:
            if not ok:
                return {"loaded": False, "fenced": True, "seen": self.gate.seen,
                        "refused": self.gate.refusal(epoch)}
            return self._rc_load(str(weights_path), str(expected_identity or ""))

    def _rc_load(self, name: str, expected: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.engine.dead:
            raise EngineDead("engine core is dead")
        if not self._exists(name):
            return {"loaded": False, "refused": f"unreadable checkpoint: no simulated "
                    f"checkpoint {name!r}"}
        identity = sim_identity(name)
        if expected and identity != expected:
            return {"loaded": False, "refused": f"identity {identity[:16]} is not the expected "
                    f"{expected[:16]}", "identity": identity}
        if self.load_seconds:
            time.sleep(self.load_seconds)  # reading and digesting the bytes takes time
        read_s = time.perf_counter() - t0
        self.engine.load(name)
        self._loaded(name, BASIS_RC_RELOAD)
        return {"loaded": True, "identity": identity, "manifest": SIM_MANIFEST, "tensors": 1,
                "bytes": SIM_BYTES, "read_s": round(read_s, 4),
                "seconds": round(time.perf_counter() - t0, 4)}

    def _loaded(self, name: str, basis: str) -> None:
        # vLLM's reload resets the encoder and multimodal caches, never the prefix cache.
        self.engine.reset_encoder_cache()
        self.engine.reset_mm_cache()
        self.path, self.basis, self.broken = name, basis, None

    def reload_weights(self, weights_iterator: Any = None, weights_path: str | None = None,
                       is_checkpoint_format: bool = True) -> None:
        """vLLM's in-place reload: no checks, not fenced; a checkpoint that is not there
        dies halfway and the engine dies at its next generation."""
        if weights_iterator is not None:
            raise TypeError("weights_iterator cannot come through the HTTP route")
        if weights_path is not None:
            self.path = str(weights_path)  # set before loading, so also on failure
        if not self._exists(self.path):
            self.broken = "parameters on the meta device (a failed load)"
            self.engine.load(self.path, fail_halfway=True)  # raises
        if self.load_seconds:
            time.sleep(self.load_seconds)
        self.engine.load(self.path)
        self._loaded(self.path, BASIS_RELOAD)

    def rc_cache_info(self) -> dict[str, Any]:
        # The real extension's shape; the simulated engine keeps one encoder table
        # (worker and scheduler halves never disagree here).
        sizes = self.engine.cache_sizes()
        return {"multimodal": False, "encoder_cache_entries": sizes["encoder"],
                "encoder_scheduler_entries": sizes["encoder"],
                "mm_receiver_entries": sizes["mm"]}

    def rc_param_digest(self) -> dict[str, Any]:
        # The weights as held (what computes), not the identity recorded at load time.
        return {"digest": sim_identity(self.engine.weights), "readable": 1,
                "bytes": SIM_BYTES, "unreadable": []}


# --------------------------------------------------------------------------- generation


@dataclass
class _Choice:
    """One choice's output as it comes out of its generation thread."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    cached: int = 0
    prompt_scores: tuple[float | None, ...] | None = None


@dataclass(frozen=True)
class _Event:
    index: int
    kind: str  # "token" (token, logprob, last), "done", "error"
    token: int = 0
    logprob: float = 0.0
    last: bool = False
    error: BaseException | None = None


@dataclass(frozen=True)
class _Params:
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None
    prompt_logprobs: int | None
    token_ids: bool

    @property
    def flat(self) -> list[tuple[int, ...]]:
        """Each choice's prompt; choice ``i`` is prompt ``i // n``'s ``i % n``-th sample."""
        return [p for p in self.prompts for _ in range(self.n)]


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    v = body.get(name, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise _invalid(f"body.{name}", f"Input should be an integer >= {minimum}", v)
    return v


def _prompt(p: Any) -> tuple[int, ...]:
    if isinstance(p, str):
        return tuple(p.encode())  # the simulator's "tokenizer": UTF-8 bytes
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                         for t in p):
        bad = [t for t in p if not 0 <= t < VOCAB]
        if bad:
            raise _BadRequest(f"Token id {bad[0]} is out of vocabulary", "prompt")
        return tuple(p)
    raise _invalid("body.prompt", "Input should be a string or a list of token ids", p)


def _params(body: Any, model: str, max_model_len: int) -> _Params:
    if not isinstance(body, dict):
        raise _invalid("body", "Input should be a valid dictionary", body)
    if body.get("model") not in (None, model):
        raise _BadRequest(f"The model `{body['model']}` does not exist.", "model",
                          status=404, kind="NotFoundError")
    raw = body.get("prompt")
    if isinstance(raw, list) and raw and all(isinstance(p, str | list) for p in raw):
        prompts = tuple(_prompt(p) for p in raw)  # a batch of prompts
    else:
        prompts = (_prompt(raw),)
    max_tokens = _int_field(body, "max_tokens", 16, 1)
    n = _int_field(body, "n", 1, 1)
    assert max_tokens is not None and n is not None
    longest = max(len(p) for p in prompts)
    if longest + max_tokens > max_model_len:
        raise _BadRequest(f"This model's maximum context length is {max_model_len} tokens. "
                          f"However, you requested {longest + max_tokens} tokens ({longest} "
                          f"in the messages, {max_tokens} in the completion).")
    stream = body.get("stream") is True
    prompt_logprobs = _int_field(body, "prompt_logprobs", None, 0)
    if stream and prompt_logprobs is not None:
        raise _BadRequest("`prompt_logprobs` are not available when `stream=True`.",
                          "prompt_logprobs")
    if body.get("echo"):
        raise _BadRequest("echo is not served by the simulated server", "echo")
    options = body.get("stream_options")
    return _Params(prompts, max_tokens, n, stream,
                   stream and isinstance(options, dict) and options.get("include_usage") is True,
                   _int_field(body, "logprobs", None, 0), prompt_logprobs,
                   body.get("return_token_ids") is True)


def _logprobs_obj(tokens: Sequence[int], values: Sequence[float], offset: int) -> dict[str, Any]:
    """The completions API's logprobs object (the sampled token is its own top entry)."""
    texts = [_token_text(t) for t in tokens]
    offsets: list[int] = []
    for t in texts:
        offsets.append(offset)
        offset += len(t)
    return {"text_offset": offsets, "token_logprobs": list(values), "tokens": texts,
            "top_logprobs": [{t: v} for t, v in zip(texts, values, strict=True)]}


def _prompt_logprobs(prompt: tuple[int, ...], scores: Sequence[float | None]) -> list[Any]:
    return [None if s is None else {str(t): {"logprob": s, "rank": 1,
                                             "decoded_token": _token_text(t)}}
            for t, s in zip(prompt, scores, strict=True)]


# --------------------------------------------------------------------------- the app


class SimVllm:
    """The ASGI app (:attr:`app`) over one simulated engine."""

    def __init__(self, engine: SimEngine, *, model: str = MODEL, initial: str = "v1",
                 gate: EpochGate | None = None, checkpoints: Iterable[str] | None = None,
                 load_seconds: float = 0.0, max_model_len: int = 512,
                 on_engine_dead: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.model = model
        self.initial = initial
        # One fencing token per server: the engine's own (the simulator's SimAdapter uses it).
        self.gate = gate if gate is not None else engine.gate
        self.worker = SimWorker(engine, self.gate, initial=initial, checkpoints=checkpoints,
                                load_seconds=load_seconds)
        self.max_model_len = max_model_len
        self.on_engine_dead = on_engine_dead
        self.asleep: set[str] = set()  # executor memory asleep (sleep level >= 1)
        self.started = int(time.time())
        self._lock = threading.Lock()
        self._in_engine = 0  # choices inside an engine call (queued, running or frozen)
        self._death_reported = False
        post = ["POST"]
        self.app = Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/metrics/", self.metrics, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=post),
            Route("/pause", self.pause, methods=post),
            Route("/resume", self.resume, methods=post),
            Route("/is_paused", self.is_paused, methods=["GET"]),
            Route("/sleep", self.sleep, methods=post),
            Route("/wake_up", self.wake_up, methods=post),
            Route("/is_sleeping", self.is_sleeping, methods=["GET"]),
            Route("/update_weight_version", self.update_weight_version, methods=post),
            Route("/weight_info", self.weight_info, methods=["GET"]),
            Route("/reset_prefix_cache", self.reset_prefix_cache, methods=post),
            Route("/reset_mm_cache", self.reset_mm_cache, methods=post),
            Route("/reset_encoder_cache", self.reset_encoder_cache, methods=post),
            Route("/collective_rpc", self.collective_rpc, methods=post),
        ], exception_handlers={_BadRequest: self._bad_request})

    @staticmethod
    async def _bad_request(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _BadRequest)
        return _error(exc.status, str(exc), exc.kind, exc.param)

    def _died(self) -> None:
        """The engine core died: the server exits a moment later (rc 0), as vLLM does."""
        with self._lock:
            if self._death_reported:
                return
            self._death_reported = True
        if self.on_engine_dead is not None:
            self.on_engine_dead()

    # ------------------------------------------------------------------ reads

    async def health(self, _request: Request) -> Response:
        return Response(status_code=503 if self.engine.dead else 200)

    async def version(self, _request: Request) -> Response:
        return JSONResponse({"version": "0.32.0"})

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.started, "owned_by": "vllm",
            "root": self.initial, "parent": None, "max_model_len": self.max_model_len,
            "permission": []}]})

    async def server_info(self, request: Request) -> Response:
        fmt = request.query_params.get("config_format", "text")
        if fmt not in ("text", "json"):
            raise _invalid("query.config_format", "Input should be 'text' or 'json'", fmt)
        config = {"model_config": {"model": self.worker.path, "served_model_name": self.model,
                                   "logprobs_mode": "raw_logprobs",
                                   "max_model_len": self.max_model_len},
                  "cache_config": {"block_size": BLOCK, "enable_prefix_caching": True},
                  "load_config": {"load_format": "rolloutcore"}}
        return JSONResponse({"vllm_config": config if fmt == "json" else str(config),
                             "vllm_env": {}, "system_env": {"simulated": True}})

    def _families(self) -> list[tuple[str, str, str, float]]:
        """(sample, type, help, value) of every metric served."""
        e = self.engine
        running = len(e.running)
        with self._lock:
            waiting = max(0, self._in_engine - running)
        return [
            ("vllm:num_requests_running", "gauge",
             "Number of requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be "
             "processed.", waiting),
            ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of "
             "number of queried tokens.", e.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of "
             "number of cached tokens.", e.prefix_hits),
        ]

    async def metrics(self, request: Request) -> Response:
        # Mounted at /metrics/ (prometheus_client: the name[] filter works there); /metrics
        # ignores the filter, as on vLLM.
        names = set(request.query_params.getlist("name[]")) if request.url.path.endswith(
            "/") else set()
        lines: list[str] = []
        for sample, kind, text, value in self._families():
            if names and sample not in names:
                continue
            family = sample.removesuffix("_total") if kind == "counter" else sample
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}",
                      f"{sample}{_LABELS % self.model} {float(value)}"]
        return Response("\n".join(lines) + "\n",
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def is_paused(self, _request: Request) -> Response:
        return JSONResponse({"is_paused": self.engine.paused})

    async def is_sleeping(self, _request: Request) -> Response:
        return JSONResponse({"is_sleeping": self.engine.paused or bool(self.asleep)})

    async def weight_info(self, _request: Request) -> Response:
        return JSONResponse({"weight_version": self.engine.label})

    # ------------------------------------------------------------------ control

    def _pause(self, mode: PauseMode, clear_cache: bool) -> None:
        """The scheduler's pause (blocks for a wait-mode drain); then, unless requests are
        kept, the prefix and multimodal caches are cleared if asked."""
        self.engine.pause(mode)
        if clear_cache and mode is not PauseMode.KEEP:
            self.engine.reset_prefix_cache()
            self.engine.reset_mm_cache()

    async def pause(self, request: Request) -> Response:
        mode = _query_mode(request)
        clear = _query_bool(request, "clear_cache", True)
        await anyio.to_thread.run_sync(self._pause, mode, clear)
        await asyncio.sleep(0.02)  # vLLM's pause_generation does (ordering, not correctness)
        return JSONResponse({"status": "paused"})

    async def resume(self, _request: Request) -> Response:
        self.engine.resume()
        return JSONResponse({"status": "resumed"})

    async def sleep(self, request: Request) -> Response:
        raw = request.query_params.get("level", "1")
        if not raw.isdigit() or int(raw) > 2:
            raise _invalid("query.level", "Input should be 0, 1 or 2", raw)
        level = int(raw)
        mode = _query_mode(request)
        # Level 0 pauses scheduling only; 1 and 2 also drop the KV cache and put the
        # executor's memory to sleep (until a wake-up names it).
        await anyio.to_thread.run_sync(self._pause, mode, level >= 1)
        if level >= 1:
            self.asleep |= {"weights", "kv_cache"}
        return JSONResponse({"status": "sleeping", "level": level})

    async def wake_up(self, request: Request) -> Response:
        tags: list[str] | None = request.query_params.getlist("tags") or None
        if tags is None:
            self.asleep.clear()
        else:
            self.asleep -= {t for t in tags if t != "scheduling"}
        # Scheduling resumes only once no executor memory is asleep.
        awake = not self.asleep
        if awake:
            self.engine.resume()
        return JSONResponse({"status": "awake" if awake else "sleeping", "tags": tags})

    async def update_weight_version(self, request: Request) -> Response:
        body = await _json_body(request)
        v = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(v, str):
            raise _invalid("body.new_version", "Field required" if v is None else
                           "Input should be a valid string", v)
        self.engine.set_label(v)
        return JSONResponse({"success": True, "new_version": v})

    async def reset_prefix_cache(self, request: Request) -> Response:
        _query_bool(request, "reset_running_requests", False)
        _query_bool(request, "reset_external", False)
        return JSONResponse({"success": bool(self.engine.reset_prefix_cache())})

    async def reset_mm_cache(self, _request: Request) -> Response:
        self.engine.reset_mm_cache()
        return Response(status_code=200)

    async def reset_encoder_cache(self, _request: Request) -> Response:
        self.engine.reset_encoder_cache()
        return Response(status_code=200)

    async def collective_rpc(self, request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise _BadRequest("Request body must be a JSON object", kind="Bad Request")
        method = body.get("method")
        if method is None:
            raise _BadRequest("Missing 'method' in request body", kind="Bad Request")
        args, kwargs = body.get("args", []), body.get("kwargs", {})
        fn = self.worker.methods().get(str(method))
        try:
            if fn is None:
                raise NotImplementedError(f"Method {method!r} is not implemented.")
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise TypeError("args must be a list and kwargs an object")
            result = await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
        except Exception as e:  # vLLM: any failure of the call is a 500 with its message
            return _error(500, f"Call to collective_rpc method failed: {e}",
                          "InternalServerError")
        return JSONResponse({"results": [result]})

    # ------------------------------------------------------------------ generation

    def _emit(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[_Event],
              event: _Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown)
            loop.call_soon_threadsafe(queue.put_nowait, event)

    def _generate(self, index: int, prompt: tuple[int, ...], p: _Params, out: _Choice,
                  gone: threading.Event, emit: Callable[[_Event], None]) -> None:
        """One choice, on its own thread: tokens go out as events as they are made."""
        def on_token(token: int, weights: str) -> None:
            if gone.is_set():
                raise _ClientGone
            out.tokens.append(token)
            # The token's log-probability as a scored prefill of the sequence so far under
            # the weights that made it would give it (the simulator's score).
            seq = prompt + tuple(out.tokens)
            out.logprobs.append(_score(weights, seq, len(seq) - 1))
            emit(_Event(index, "token", token, out.logprobs[-1],
                        last=len(out.tokens) == p.max_tokens))

        with self._lock:
            self._in_engine += 1
        try:
            if p.prompt_logprobs is not None:
                # Like vLLM, a request for prompt log-probabilities reads no prefix cache:
                # one scored prefill, and its decode is a clean engine's.
                out.prompt_scores = self.engine.score(prompt)
                weights = self.engine.weights
                for t in reference_tokens(weights, prompt, p.max_tokens):
                    on_token(t, weights)
                out.finish = "length"
            else:
                result: GenerationResult = self.engine.generate(prompt, p.max_tokens,
                                                                on_token=on_token)
                out.finish = result.finish_reason
                out.cached = int(result.extra.get("cached_tokens", 0))
            emit(_Event(index, "done"))
        except _ClientGone:
            emit(_Event(index, "done"))
        except Exception as e:
            emit(_Event(index, "error", error=e))
        finally:
            with self._lock:
                self._in_engine -= 1

    def _start(self, p: _Params, gone: threading.Event) -> tuple[list[_Choice],
                                                                 asyncio.Queue[_Event]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Event] = asyncio.Queue()
        choices = [_Choice() for _ in p.flat]
        for i, prompt in enumerate(p.flat):
            threading.Thread(target=self._generate, name=f"sim-gen-{i}", daemon=True,
                             args=(i, prompt, p, choices[i], gone,
                                   lambda ev: self._emit(loop, queue, ev))).start()
        return choices, queue

    def _failure(self, e: BaseException | None) -> tuple[int, str, str]:
        if isinstance(e, EngineDead):
            self._died()
            return 500, _DEAD_MESSAGE, "InternalServerError"
        return 500, f"{type(e).__name__}: {e}", "InternalServerError"

    def _usage(self, p: _Params, choices: list[_Choice]) -> dict[str, Any]:
        prompt_tokens = sum(len(q) for q in p.prompts)
        completion = sum(len(c.tokens) for c in choices)
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
                # --enable-prompt-tokens-details (SERVER_ARGS): the last prompt's choice 0
                "prompt_tokens_details": {"cached_tokens": choices[-p.n].cached}}

    async def completions(self, request: Request) -> Response:
        p = _params(await _json_body(request), self.model, self.max_model_len)
        gone = threading.Event()
        choices, queue = self._start(p, gone)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model}
        if p.stream:
            return StreamingResponse(self._stream(p, head, choices, queue, gone),
                                     media_type="text/event-stream")
        watcher = asyncio.ensure_future(self._watch_disconnect(request, gone))
        failure: BaseException | None = None
        try:
            pending = len(choices)
            while pending:
                ev = await queue.get()
                if ev.kind == "token":
                    continue
                pending -= 1
                if ev.kind == "error" and failure is None:
                    failure = ev.error or RuntimeError("generation failed")
                    gone.set()  # the other choices end too
        finally:
            watcher.cancel()
            gone.set()
        if failure is not None:
            return _error(*self._failure(failure))
        out = []
        for i, c in enumerate(choices):
            prompt = p.flat[i]
            out.append({
                "index": i, "text": "".join(map(_token_text, c.tokens)),
                "logprobs": None if p.logprobs is None else _logprobs_obj(c.tokens,
                                                                          c.logprobs, 0),
                "finish_reason": c.finish, "stop_reason": None,
                "token_ids": list(c.tokens) if p.token_ids else None,
                "prompt_logprobs": None if c.prompt_scores is None else _prompt_logprobs(
                    prompt, c.prompt_scores),
                "prompt_token_ids": list(prompt) if p.token_ids else None})
        return JSONResponse({**head, "choices": out, "system_fingerprint": None,
                             "usage": self._usage(p, choices)})

    @staticmethod
    async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
        """vLLM aborts a request whose client went away: so does this, at its next token."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    async def _stream(self, p: _Params, head: dict[str, Any], choices: list[_Choice],
                      queue: asyncio.Queue[_Event], gone: threading.Event
                      ) -> AsyncIterator[str]:
        """vLLM's event stream: one event per token (the last one carries its finish
        reason), an empty one for an abort after some tokens, the usage if asked, [DONE]."""
        def event(obj: dict[str, Any]) -> str:
            return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"

        sent = [0] * len(choices)
        offsets = [0] * len(choices)
        try:
            done = 0
            while done < len(choices):
                ev = await queue.get()
                i = ev.index
                if ev.kind == "error":
                    status, message, kind = self._failure(ev.error)
                    yield event({"error": {"message": message, "type": kind, "param": None,
                                           "code": status}})
                    break
                if ev.kind == "done":
                    done += 1
                    finish = choices[i].finish
                    if finish is None or finish == "length" or not sent[i]:
                        continue  # ended with its last token, or nothing was ever sent
                    toks: list[int] = []
                else:
                    finish = "length" if ev.last else None
                    toks = [ev.token]
                lp = None
                if p.logprobs is not None:
                    lp = _logprobs_obj(toks, [ev.logprob] if toks else [], offsets[i])
                    offsets[i] += sum(len(_token_text(t)) for t in toks)
                first = sent[i] == 0
                sent[i] += len(toks)
                yield event({**head, "choices": [{
                    "index": i, "text": "".join(map(_token_text, toks)), "logprobs": lp,
                    "finish_reason": finish, "stop_reason": None,
                    "prompt_token_ids": list(p.flat[i]) if p.token_ids and first else None,
                    "token_ids": toks if p.token_ids else None}]})
            else:
                if p.include_usage:
                    yield event({**head, "choices": [], "usage": self._usage(p, choices)})
            yield "data: [DONE]\n\n"
        finally:
            gone.set()  # the client went away (or the stream ended): stop generating


# --------------------------------------------------------------------------- serving


class _Server(uvicorn.Server):
    """uvicorn, telling when it listens."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_ready()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: a free one, chosen here, so nothing races for it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def build(*, initial: str = "v1", token_seconds: float = 0.0, load_seconds: float = 0.0,
          model: str = MODEL, label: str = INITIAL_LABEL,
          checkpoints: Iterable[str] | None = None, max_model_len: int = 512) -> SimVllm:
    """A fresh engine on checkpoint ``initial`` behind a new app."""
    engine = SimEngine(initial, token_seconds=token_seconds, label=label)
    return SimVllm(engine, model=model, initial=initial, checkpoints=checkpoints,
                   load_seconds=load_seconds, max_model_len=max_model_len)


def _later(seconds: float, fn: Callable[[], None]) -> None:
    t = threading.Timer(seconds, fn)
    t.daemon = True
    t.start()


def _config(sim: SimVllm) -> uvicorn.Config:
    # Streams still open at shutdown are cut after a second (the engine is gone anyway).
    return uvicorn.Config(sim.app, log_level="warning", access_log=False, lifespan="off",
                          timeout_graceful_shutdown=1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rolloutcore.conformance.sim_server",
                                 description="A simulated vLLM server (dev mode, worker "
                                 "extension) over the RolloutCore simulator.")
    ap.add_argument("--port", type=int, required=True, help="0: a free port")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--initial", default="v1", help="the checkpoint loaded at startup")
    ap.add_argument("--token-seconds", type=float, default=0.0, help="pace of generation")
    ap.add_argument("--load-seconds", type=float, default=0.0, help="how long a load takes")
    ap.add_argument("--model", default=MODEL, help="the served model name")
    ap.add_argument("--label", default=INITIAL_LABEL, help="the startup weight version")
    ap.add_argument("--checkpoints", default=None,
                    help="comma-separated names that exist (default: any name)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--exit-with-parent", action="store_true",
                    help="exit when the process that started this one is gone")
    a = ap.parse_args(argv)
    sim = build(initial=a.initial, token_seconds=a.token_seconds, load_seconds=a.load_seconds,
                model=a.model, label=a.label, max_model_len=a.max_model_len,
                checkpoints=None if a.checkpoints is None else [
                    c for c in a.checkpoints.split(",") if c])
    sock = _bind(a.host, a.port)
    server = _Server(_config(sim), lambda: print(_url(sock), flush=True))

    sim.on_engine_dead = lambda: _later(EXIT_AFTER_DEATH_S, functools.partial(
        setattr, server, "should_exit", True))
    if a.exit_with_parent:
        parent = os.getppid()

        def watch() -> None:
            while os.getppid() == parent and not server.should_exit:
                time.sleep(0.2)
            server.should_exit = True

        threading.Thread(target=watch, name="sim-parent-watch", daemon=True).start()
    # uvicorn re-raises SIGTERM after its graceful shutdown: exit 0 then, as vLLM does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run(sockets=[sock])
    finally:
        sim.engine.kill()  # generation threads still waiting (paused, frozen) end now
    return 0


# --------------------------------------------------------------------------- for tests


class SimServer:
    """A simulated vLLM server for tests: in a subprocess by default (it lives on while
    the test kills other processes around it; :meth:`kill` is its own SIGKILL), or in a
    thread of this process (``in_thread=True``: faster to start, and :attr:`sim` gives the
    engine itself for white-box checks)::

        with SimServer(initial="v1", token_seconds=0.002) as srv:
            adapter = HttpAdapter(srv.url, check_source_exists=False)
    """

    def __init__(self, *, initial: str = "v1", token_seconds: float = 0.0,
                 load_seconds: float = 0.0, model: str = MODEL, label: str = INITIAL_LABEL,
                 checkpoints: Iterable[str] | None = None, max_model_len: int = 512,
                 host: str = "127.0.0.1", port: int = 0, in_thread: bool = False,
                 startup_timeout_s: float = 30.0, exit_with_parent: bool = True) -> None:
        self.initial, self.token_seconds, self.load_seconds = initial, token_seconds, load_seconds
        self.model, self.label, self.max_model_len = model, label, max_model_len
        self.checkpoints = None if checkpoints is None else list(checkpoints)
        self.host, self.port, self.in_thread = host, port, in_thread
        self.startup_timeout_s = startup_timeout_s
        self.exit_with_parent = exit_with_parent
        self.url = ""
        self.sim: SimVllm | None = None  # in-thread only
        self.proc: subprocess.Popen[str] | None = None
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "rolloutcore.conformance.sim_server", "--host", self.host,
               "--port", str(self.port), "--initial", self.initial,
               "--token-seconds", repr(self.token_seconds),
               "--load-seconds", repr(self.load_seconds), "--model", self.model,
               "--label", self.label, "--max-model-len", str(self.max_model_len)]
        if self.checkpoints is not None:
            cmd += ["--checkpoints", ",".join(self.checkpoints)]
        if self.exit_with_parent:
            cmd.append("--exit-with-parent")
        return cmd

    def start(self) -> SimServer:
        deadline = time.monotonic() + self.startup_timeout_s
        if self.in_thread:
            self._start_thread(deadline)
        else:
            self._start_process(deadline)
        self._await_health(deadline)
        return self

    def _start_thread(self, deadline: float) -> None:
        self.sim = build(initial=self.initial, token_seconds=self.token_seconds,
                         load_seconds=self.load_seconds, model=self.model, label=self.label,
                         checkpoints=self.checkpoints, max_model_len=self.max_model_len)
        sock = _bind(self.host, self.port)
        self.url = _url(sock)
        ready = threading.Event()
        server = self._server = _Server(_config(self.sim), ready.set)
        self.sim.on_engine_dead = lambda: _later(EXIT_AFTER_DEATH_S, functools.partial(
            setattr, server, "should_exit", True))
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name="sim-server", daemon=True)
        self._thread.start()
        if not ready.wait(max(0.0, deadline - time.monotonic())):
            self.stop()
            raise RuntimeError("the in-thread simulated server did not start")

    def _start_process(self, deadline: float) -> None:
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        url_seen = threading.Event()

        def drain() -> None:  # keeps the pipe from filling; the URL is the first URL line
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line.rstrip())
                if not url_seen.is_set() and line.startswith("http"):
                    self.url = line.strip()
                    url_seen.set()

        threading.Thread(target=drain, name="sim-server-output", daemon=True).start()
        while not url_seen.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the simulated server did not start: "
                                   + " | ".join(self.output))

    def _await_health(self, deadline: float) -> None:
        last = ""
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0, trust_env=False
                             ).status_code == 200:
                    return
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the simulated server at {self.url} never answered /health "
                           f"({last}): {' | '.join(self.output)}")

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self._thread is not None and self._thread.is_alive()

    def kill(self) -> None:
        """SIGKILL the server process (the engine dies with it)."""
        if self.proc is None:
            raise RuntimeError("an in-thread server cannot be killed; stop() it")
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM (then SIGKILL past ``timeout_s``); the return code, None in-thread."""
        if self._server is not None:
            self._server.should_exit = True
            if self.sim is not None:
                self.sim.engine.kill()  # requests held by a pause end now
            if self._thread is not None:
                self._thread.join(timeout_s)
            return None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


__all__ = ["MODEL", "SimServer", "SimVllm", "SimWorker", "build", "main"]


if __name__ == "__main__":
    sys.exit(main())
