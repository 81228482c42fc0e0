"""The adapter contract over an in-process vLLM engine (``AsyncLLM``), as RL frameworks
host it (verl, OpenRLHF, NeMo RL, SkyRL put one in a Ray actor and drive it by method
calls, not HTTP).

:class:`InProcessEngine` runs vLLM's own ``AsyncLLM`` on a private event loop in this
process, built from the same command line as a server (vLLM's own argument parser, so a
flag means what it means to ``vllm serve``), and optionally serves vLLM's own OpenAI
routes on the same engine (what a gateway forwards rollouts to). :class:`InProcessAdapter`
is the lifecycle adapter over its methods. The worker extension and the load-time
identity plugin are the HTTP path's (:data:`~rolloutcore.adapters.vllm_worker.SERVER_ARGS`),
reached by ``collective_rpc``, and their results mean what they mean there (the shared
readers of :mod:`rolloutcore.adapters.http`).

What differs from the HTTP routes, read from vLLM 0.32's ``AsyncLLM``:

* Evidence still carries a status, the one vLLM's own route would answer for the same
  call: each dev-mode route awaits exactly this method and answers 200 when it returns,
  500 when it raises. So a journal of an in-process engine is decided and checked by the
  same rules as one over HTTP, and a call that did not return by its deadline is no
  answer at all (an :class:`AdapterError`; during the mutation: ambiguous).
* ``reset_prefix_cache`` returns the engine's bool (the body's ``success`` over HTTP);
  ``reset_encoder_cache`` and ``reset_mm_cache`` return nothing and are verified by the
  worker extension's count, as over HTTP.
* The running count is the engine front end's unfinished requests (queued ones too),
  not the ``vllm:num_requests_running`` gauge: stricter, and no metric lags behind it.
* ``AsyncLLM`` always runs its engine core in a child process, so every pause mode of the
  HTTP route exists here too (the scenario corpus's ``pause_semantics`` shows abort, wait
  and keep as over HTTP).
* A probe's prefix-cache hits are its own ``num_cached_tokens``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rolloutcore.adapters.contract import (
    AdapterError,
    EngineReport,
    EpochEvidence,
    FenceEvidence,
    GenerationResult,
    MutationEvidence,
    MutationOutcome,
    PauseEvidence,
    PauseMode,
    ProbeEvidence,
    ResetEvidence,
    ResumeEvidence,
    WeightTarget,
    remaining,
)
from rolloutcore.adapters.http import (
    cache_info_of,
    epoch_evidence,
    reload_failure,
    worker_identity,
)
from rolloutcore.engine.identity import CheckpointError, safetensors_files
from rolloutcore.errors import RolloutCoreError, Unreachable

T = TypeVar("T")
ABORT_POLL_S = 0.01
#: How far past its caller's deadline a held call (the ``late`` and ``hang`` faults) ends:
#: past any margin a caller keeps for the reply's trip (a Ray actor's).
HELD_PAST_S = 0.25
OK, ERROR = 200, 500  # what vLLM's own route answers when the engine call returns / raises
#: What an in-process engine's host process needs in its environment before vLLM is
#: imported: the server fixture's (dev mode, offline, one OpenMP thread per process).
ENGINE_ENV: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}


class EngineStartError(RolloutCoreError, RuntimeError):
    """The in-process engine did not start (its cause in words)."""


class NoAnswer(AdapterError, Unreachable):
    """The engine gave no answer: the call did not end by its deadline, the engine is not
    running, or nothing was sent (a deposed controller)."""


class EngineHost:
    """An ``AsyncLLM`` and the event loop it runs on, seen from other threads: what
    :class:`InProcessAdapter` drives. :meth:`call` runs one of the engine's coroutines on
    its loop and waits for it at most ``seconds``; a call that outlives that keeps
    running there (as a request a server still works on would), and the caller is told it
    has no answer."""

    engine: Any  # vllm.v1.engine.async_llm.AsyncLLM once running
    url: str | None  # its OpenAI routes, where they are served
    #: Tests' controlled causes: ``(method, args, kwargs) -> fault kind or None``
    #: (``conformance.inprocess_engine``; the in-process twin of the fault proxy).
    interceptor: Callable[[str, tuple[Any, ...], dict[str, Any]], str | None] | None
    _ids: Iterator[int]

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        raise NotImplementedError

    def alive(self) -> bool:
        loop = self.loop
        return loop is not None and not loop.is_closed() and self.engine is not None and \
            not bool(getattr(self.engine, "errored", False))

    def call(self, method: str, seconds: float, *args: Any, **kwargs: Any) -> Any:
        """``await engine.<method>(*args, **kwargs)`` on the engine's loop, within
        ``seconds``: its result or its exception; :class:`TimeoutError` when it did not end
        in time. Two names are not ``AsyncLLM`` coroutines: ``generate`` returns a
        request's final output, ``unfinished`` the front end's unfinished requests."""
        loop = self.loop
        if loop is None or self.engine is None or not self.alive():
            raise NoAnswer("the in-process engine is not running", proven_no_effect=True)
        fault = self.interceptor(method, args, kwargs) if self.interceptor else None
        if fault in ("http_500", "refuse", "hang"):  # not run: nothing reaches the engine
            if fault == "hang":
                time.sleep(seconds + HELD_PAST_S)
                raise TimeoutError(f"no answer within {seconds:.2f} s")
            if fault == "refuse":
                raise NoAnswer("the call was lost before it reached the engine")
            raise RuntimeError(f"{method} failed (an injected engine error)")
        engine = self.engine

        async def run() -> Any:
            if method == "generate":
                final = None
                async for out in engine.generate(*args, **kwargs):
                    final = out
                return final
            if method == "unfinished":
                return int(engine.get_num_unfinished_requests())
            return await getattr(engine, method)(*args, **kwargs)

        t0 = time.monotonic()
        fut = asyncio.run_coroutine_threadsafe(run(), loop)
        try:
            out = fut.result(timeout=max(seconds, 0.001))
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no answer within {seconds:.2f} s") from None
        if fault == "late":  # done, but the answer comes after the caller gave up
            time.sleep(max(seconds - (time.monotonic() - t0), 0.0) + HELD_PAST_S)
            raise TimeoutError(f"no answer within {seconds:.2f} s")
        if fault == "drop":
            raise NoAnswer("the engine's answer was lost")
        if fault in ("empty_body", "fail_body"):
            return None if fault == "empty_body" else False
        return out

    def request_id(self, op: str) -> str:
        return f"rolloutcore-{op}-{os.getpid()}-{next(self._ids)}"



class HostedEngine(EngineHost):
    """An ``AsyncLLM`` someone else built and runs on ``loop`` (a framework's own engine
    actor: :class:`~rolloutcore.adapters.ray_engine.AdoptedEngineActor`); calls come from
    other threads than the loop's."""

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop, url: str | None = None
                 ) -> None:
        self.engine = engine
        self._engine_loop = loop
        self.url = url
        self.interceptor = None
        self._ids = itertools.count()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._engine_loop


class InProcessEngine(EngineHost):
    """``AsyncLLM`` on a private event loop thread of this process, built from ``args`` (a
    ``vllm serve`` command line without the program: ``--model DIR ...``); with
    ``serve_http`` also vLLM's OpenAI routes on ``host:port`` over the same engine."""

    def __init__(self, args: Sequence[str], *, serve_http: bool = False) -> None:
        self.args = list(args)
        self.serve_http = serve_http
        self.engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._ids = itertools.count()
        self.interceptor = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and super().alive()

    def start(self, timeout: float = 300.0) -> InProcessEngine:
        for k, v in ENGINE_ENV.items():  # read by vLLM at import and by its engine core
            os.environ.setdefault(k, v)
        self._thread = threading.Thread(target=self._run, name="rolloutcore-engine-loop",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise EngineStartError(f"the in-process engine did not start in {timeout:.0f} s")
        if self._error is not None:
            raise EngineStartError(f"{type(self._error).__name__}: {self._error}")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:  # a failed start is reported to start()
            self._error = self._error or e
        finally:
            self._ready.set()
            loop.close()

    async def _main(self) -> None:
        import uvicorn
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.entrypoints.launchers.launcher import create_server_socket
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
        args = make_arg_parser(parser).parse_args(self.args)
        self._stop = asyncio.Event()
        async with build_async_engine_client(args) as engine:
            self.engine = engine
            server: Any = None
            serving: asyncio.Task[None] | None = None
            if self.serve_http:
                sock = create_server_socket((args.host or "127.0.0.1", args.port), reuse_port=False)
                tasks = await engine.get_supported_tasks()
                app = build_app(args, tasks, engine.model_config)
                await init_app_state(engine, app.state, args, tasks)
                server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
                serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
                while not server.started and not serving.done():
                    await asyncio.sleep(0.01)
                if serving.done():
                    serving.result()  # raises why it stopped
                self.url = f"http://{args.host or '127.0.0.1'}:{args.port}"
            self._ready.set()
            await self._stop.wait()
            if server is not None and serving is not None:
                server.should_exit = True
                await serving

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None \
                and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout)


def engine_args(model: str | Path, *, served_model_name: str = "tiny", port: int | None = None,
                extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of an in-process engine for ``model``: the test server fixture's
    (``adapters.launch``) flags, the worker extension and loader, ``extra_args``."""
    from rolloutcore.adapters.launch import DEFAULT_FLAGS, free_port
    from rolloutcore.adapters.vllm_worker import SERVER_ARGS

    return ["--model", str(model), "--served-model-name", served_model_name,
            "--host", "127.0.0.1", "--port", str(port if port is not None else free_port()),
            *DEFAULT_FLAGS, "--block-size", "32", "--distributed-executor-backend", "uni",
            *SERVER_ARGS, *extra_args]


class InProcessAdapter:
    """The lifecycle adapter for an :class:`EngineHost` (the worker extension loaded:
    ``rc_reload_weights``, ``rc_identity``, ``rc_cache_info``, ``rc_fence``)."""

    def __init__(self, engine: EngineHost, *, check_source_exists: bool = True,
                 mutation_method: str = "rc_reload_weights") -> None:
        from rolloutcore.adapters.http import MUTATION_METHODS

        if mutation_method not in MUTATION_METHODS:
            raise ValueError(f"mutation_method must be one of {MUTATION_METHODS}")
        self.host = engine
        self.check_source_exists = check_source_exists
        #: ``rc_reload_weights`` (the worker extension: identity of the loaded bytes,
        #: refuses before touching the model) or vLLM's own ``reload_weights`` (no checks).
        self.mutation_method = mutation_method
        #: The controller's epoch, sent with every load (see fence_epoch).
        self.epoch: int | None = None
        #: Whether the controller still holds its leadership (None: no store).
        self.lease_check: Callable[[], bool] | None = None

    # ------------------------------------------------------------------ transport

    def _call(self, op: str, method: str, deadline: float | None, *args: Any,
              effect: bool = False, **kwargs: Any) -> Any:
        """One engine call within the step's deadline; AdapterError if it raised, and
        :class:`NoAnswer` if it did not end by then (``proven_no_effect`` only when
        nothing was sent)."""
        if effect and self.lease_check is not None and not self.lease_check():
            raise NoAnswer(f"{op}: not sent: this controller no longer holds the fleet's "
                           "leadership", proven_no_effect=True)
        seconds = remaining(deadline) if deadline is not None else 30.0
        try:
            return self.host.call(method, seconds, *args, **kwargs)
        except NoAnswer as e:
            raise NoAnswer(f"{op}: {e}", proven_no_effect=e.proven_no_effect) from None
        except TimeoutError as e:
            raise NoAnswer(f"{op}: {e}") from None
        except Exception as e:
            raise AdapterError(f"{op}: {type(e).__name__}: {e}") from None

    def _status(self, op: str, method: str, deadline: float, *args: Any,
                errors: list[str] | None = None, **kwargs: Any) -> tuple[int | None, Any]:
        """(what the route would answer, the call's result): 200 and the result when it
        returned, 500 when the engine raised. No answer at all raises :class:`NoAnswer`
        (as a lost reply raises over HTTP), unless ``errors`` collects it (the fence's
        best effort: status None)."""
        try:
            return OK, self._call(op, method, deadline, *args, effect=True, **kwargs)
        except NoAnswer as e:
            if errors is None:
                raise
            errors.append(str(e))
            return None, None
        except AdapterError as e:
            if errors is not None:
                errors.append(str(e))
            return ERROR, None

    def _rpc(self, method: str, deadline: float | None, op: str, *, effect: bool = False,
             **kwargs: Any) -> list[dict[str, Any]]:
        seconds = remaining(deadline) if deadline is not None else 30.0
        results = self._call(op, "collective_rpc", deadline, method, effect=effect,
                             timeout=seconds, kwargs=kwargs)
        if not isinstance(results, list) or not results or \
                not all(isinstance(r, dict) for r in results):
            raise AdapterError(f"{op}: unexpected {method} results {results!r:.200}")
        return results

    # ------------------------------------------------------------------ reads

    def read_label(self, deadline: float | None = None) -> str:
        label = self._call("read_label", "get_weight_version", deadline)
        if not isinstance(label, str):
            raise AdapterError(f"read_label: {label!r}")
        return label

    def read_paused(self, deadline: float | None = None) -> bool:
        paused = self._call("read_paused", "is_paused", deadline)
        if not isinstance(paused, bool):
            raise AdapterError(f"read_paused: {paused!r}")
        return paused

    def running_requests(self, deadline: float | None = None) -> int:
        return int(self._call("running_requests", "unfinished", deadline))

    def read_identity(self, deadline: float | None = None) -> str:
        return worker_identity(self._rpc("rc_identity", deadline, "read_identity"))

    def cache_info(self, deadline: float | None = None) -> dict[str, Any]:
        return cache_info_of(self._rpc("rc_cache_info", deadline, "cache_info"))

    def _or_none(self, read: Callable[[float | None], T], deadline: float | None) -> T | None:
        try:
            return read(deadline)
        except AdapterError:
            return None

    def read_state(self, deadline: float | None = None) -> EngineReport:
        return EngineReport(self.read_label(deadline), self.read_identity(deadline),
                            self.read_paused(deadline),
                            self._or_none(self.running_requests, deadline))

    # ------------------------------------------------------------------ pause, resume

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        mode = PauseMode(mode)
        # clear_cache=False: the caches stay until the verified resets after the mutation.
        status, _ = self._status("pause", "pause_generation", deadline, mode=mode.value,
                                 clear_cache=False)
        paused = self._or_none(self.read_paused, deadline)
        running = self._or_none(self.running_requests, deadline)
        if status == OK:
            while running and time.monotonic() + ABORT_POLL_S < deadline:
                time.sleep(ABORT_POLL_S)  # aborted requests end a moment after the pause
                running = self._or_none(self.running_requests, deadline)
        return PauseEvidence(mode, status, None, paused, running)

    def resume(self, deadline: float) -> ResumeEvidence:
        status, _ = self._status("resume", "resume_generation", deadline)
        return ResumeEvidence(status, None, self._or_none(self.read_paused, deadline))

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        """Pause in abort mode and relabel; read both back. Every failure is evidence."""
        errors: list[str] = []
        pause_status, _ = self._status("fence_pause", "pause_generation", deadline,
                                       errors=errors, mode="abort", clear_cache=False)
        label_status, _ = self._status("fence_label", "update_weight_version", deadline, label,
                                       errors=errors)
        running = self._or_none(self.running_requests, deadline)
        while running and time.monotonic() + ABORT_POLL_S < deadline:
            time.sleep(ABORT_POLL_S)
            running = self._or_none(self.running_requests, deadline)
        return FenceEvidence(label, pause_status, label_status,
                             self._or_none(self.read_paused, deadline),
                             self._or_none(self.read_label, deadline), running,
                             "; ".join(errors) or None)

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence:
        try:
            results = self._rpc("rc_fence", deadline, "fence_epoch", epoch=int(epoch))
        except AdapterError as e:
            return EpochEvidence(epoch, False, None, str(e))
        ev = epoch_evidence(epoch, results)
        if ev.accepted:
            self.epoch = int(epoch)
        return ev

    # ------------------------------------------------------------------ caches

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        if tier == "prefix":
            # Refused (False) while running requests hold blocks: not reset from under them.
            status, ok = self._status("reset_prefix", "reset_prefix_cache", deadline,
                                      reset_running_requests=False, reset_connector=False)
            return ResetEvidence(tier, status, ok if isinstance(ok, bool) else None)
        if tier not in ("encoder", "mm"):
            raise AdapterError(f"unknown cache tier {tier!r}", proven_no_effect=True)
        status, _ = self._status(f"reset_{tier}", f"reset_{tier}_cache", deadline)
        entries: int | None = None
        absent = False
        if status == OK:
            info = self._or_none(self.cache_info, deadline)
            if info is not None:
                absent = info["multimodal"] is False  # the engine's word: no encoder at all
                entries = info["encoder_entries" if tier == "encoder" else
                               "mm_receiver_entries"]
        return ResetEvidence(tier, status, None, entries_after=entries, tier_absent=absent)

    # ------------------------------------------------------------------ generation

    def _generate(self, prompt: tuple[int, ...], max_tokens: int, op: str,
                  deadline: float | None, *, scored: bool = False) -> Any:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0,
                                logprobs=0, prompt_logprobs=0 if scored else None)
        return self._call(op, "generate", deadline, TokensPrompt(prompt_token_ids=list(prompt)),
                          params, self.host.request_id(op), effect=op != "generate")

    @staticmethod
    def _parse(out: Any, prompt: tuple[int, ...]) -> tuple[
            tuple[int, ...], str | None, tuple[float, ...] | None]:
        try:
            choice = out.outputs[0]
            tokens = tuple(int(t) for t in choice.token_ids)
            lps = choice.logprobs
            logprobs = None if lps is None else tuple(
                float(step[t].logprob) for step, t in zip(lps, tokens, strict=True))
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            raise AdapterError(f"completion: unexpected output {out!r:.200}") from None
        if tuple(out.prompt_token_ids or ()) != tuple(prompt):
            raise AdapterError("completion: the engine saw a different prompt")
        return tokens, choice.finish_reason, logprobs

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        try:
            out = self._generate(prompt, max_tokens, "probe", deadline, scored=scored)
            tokens, finish, logprobs = self._parse(out, prompt)
        except AdapterError as e:
            return ProbeEvidence(prompt, None, None, None, error=str(e))
        hits = getattr(out, "num_cached_tokens", None)
        hits = hits if isinstance(hits, int) else None
        if finish != "length":  # aborted or cut short: no evidence about the weights
            return ProbeEvidence(prompt, None, OK, finish, prefix_hits=hits,
                                 error=f"probe finished with {finish!r} after {len(tokens)} "
                                 "tokens")
        scores: tuple[float | None, ...] | None = None
        if scored:
            try:
                scores = _prompt_scores(out.prompt_logprobs, prompt)
            except AdapterError as e:
                return ProbeEvidence(prompt, None, OK, finish, prefix_hits=hits,
                                     error=str(e))
        return ProbeEvidence(prompt, tokens, OK, finish, prefix_hits=hits, logprobs=logprobs,
                             prompt_logprobs=scores)

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        t0 = time.perf_counter()
        out = self._generate(prompt, max_tokens, "generate", time.monotonic() + 600.0)
        tokens, finish, logprobs = self._parse(out, prompt)
        return GenerationResult(prompt, tokens, finish, logprobs,
                                extra={"seconds": round(time.perf_counter() - t0, 4)})

    # ------------------------------------------------------------------ mutation

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        """``rc_reload_weights`` of ``target.source`` (refused by the worker before it
        touches the model unless the bytes are the target's), then the label. Never
        retried; anything short of a verified load and label is ambiguous."""
        t0 = time.perf_counter()

        def ev(outcome: MutationOutcome, observed: str, nbytes: int | None = None) -> (
                MutationEvidence):
            return MutationEvidence(outcome, observed, time.perf_counter() - t0, nbytes)

        if target.adapter is not None:
            raise AdapterError("mutate: LoRA adapter updates go over HTTP (HttpAdapter(lora="
                               "...)); refused", proven_no_effect=True)
        if self.check_source_exists:
            try:
                safetensors_files(target.source)
            except CheckpointError as e:
                raise AdapterError(f"mutate: refused before sending anything: {e}",
                                   proven_no_effect=True) from None
        method = self.mutation_method
        kwargs: dict[str, Any] = {"weights_path": str(Path(target.source))}
        if method == "rc_reload_weights":
            kwargs["expected_identity"] = target.identity
            if self.epoch is not None:
                kwargs["epoch"] = self.epoch
        try:
            seconds = remaining(deadline)
            results = self._call("mutate", "collective_rpc", deadline, method, effect=True,
                                 timeout=seconds, kwargs=kwargs)
        except AdapterError as e:
            if e.proven_no_effect:
                raise
            return ev(MutationOutcome.AMBIGUOUS, f"{method}: {e}")
        nbytes: int | None = None
        if method == "rc_reload_weights":
            if not isinstance(results, list) or not results or \
                    not all(isinstance(r, dict) for r in results):
                return ev(MutationOutcome.AMBIGUOUS, f"{method}: results {results!r:.200}")
            failed = reload_failure(results, target)
            if failed is not None:
                return ev(*failed)
            nbytes = sum(int(r.get("bytes") or 0) for r in results)
        elif not isinstance(results, list):  # vLLM's reload returns None per worker
            return ev(MutationOutcome.AMBIGUOUS, f"{method}: results {results!r:.200}")
        # The mutation's own finalisation, and only here: the label, read back.
        try:
            self._call("finalise", "update_weight_version", deadline, target.label, effect=True)
            label = self.read_label(deadline)
        except AdapterError as e:
            return ev(MutationOutcome.AMBIGUOUS, f"weights loaded, label not finalised: {e}")
        if label != target.label:
            return ev(MutationOutcome.AMBIGUOUS, f"weights loaded, label reads {label!r}")
        return ev(MutationOutcome.COMPLETED, f"{method} {target.source} and finalised as "
                  f"{target.label!r}", nbytes)


def _prompt_scores(entries: Any, prompt: tuple[int, ...]) -> tuple[float | None, ...]:
    """Each prompt token's own log-probability from ``RequestOutput.prompt_logprobs``
    (position 0 has none)."""
    try:
        out: list[float | None] = [
            None if entry is None else float(entry[prompt[i]].logprob)
            for i, entry in enumerate(entries)]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise AdapterError("probe: no prompt log-probabilities in the output") from None
    if len(out) != len(prompt):
        raise AdapterError(f"probe: {len(out)} prompt log-probabilities for {len(prompt)} "
                           "prompt tokens")
    return tuple(out)


__all__ = ["ENGINE_ENV", "EngineHost", "EngineStartError", "HostedEngine", "InProcessAdapter",
           "InProcessEngine", "NoAnswer", "engine_args"]
