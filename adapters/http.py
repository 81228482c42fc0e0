"""The adapter contract over a real vLLM server's dev-mode HTTP endpoints (httpx).

Every call has its own timeout and checks status and body; nothing here decides an
outcome (see :mod:`rolloutcore.engine.postconditions`). What the wire taught us
(conformance/VLLM_OBSERVED.md) and how it is handled:

* After an engine-side 500 the server drops the keep-alive connection and the next
  request on it dies with "connection reset". The client pool is replaced after every
  5xx, and idempotent calls are retried a bounded number of times on a fresh
  connection after a connection-level error. The mutation is never retried, and it
  always starts on a fresh connection, so a stale pooled socket cannot turn it
  ambiguous.
* ``/reset_prefix_cache`` answers ``{"success": bool}`` on 0.32 and an empty 200 on
  other versions; only ``success: true`` counts. The probe reports the prefix-cache
  hits it caused (``vllm:prefix_cache_hits_total`` delta), which the postconditions
  treat as stale reuse after a mutation. ``/reset_encoder_cache`` and
  ``/reset_mm_cache`` answer an empty body: they are verified by what the engine says
  through the worker extension (no multimodal encoder at all; or both halves of the
  encoder cache, worker and scheduler, empty; the engine's multimodal receiver cache
  empty). The API server's processor cache holds preprocessed pixels, which no weight
  change makes stale, and is out of the extension's reach.
* A failed weight load is invisible to ``/health`` and kills the engine at the next
  generation: a 500, a timeout or a dropped connection during the mutation is
  ambiguous. Only a refusal proven to precede any change (the path is not there, the
  connection was never made, the worker refused before touching the model) is not.
* The version label is written only by the mutation's own finalisation
  (``/update_weight_version`` right after a successful load, inside :meth:`mutate`),
  never anywhere else; the identity comes from the engine's worker
  (:mod:`rolloutcore.adapters.vllm_worker`), not from the label.

Dev-mode routes are not protected by vLLM's ``--api-key``: a bearer token is still
sent when configured (for a proxy in front), and a plain-``http`` URL that is not
loopback is refused unless explicitly allowed.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

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
    RankStage,
    ResetEvidence,
    ResumeEvidence,
    StageEvidence,
    WeightTarget,
    remaining,
)
from rolloutcore.adapters.gateway_fence import (
    ANY_REMOTE,
    FENCE_PATH,
    LEADER_GATEWAY,
    remote_floor,
)
from rolloutcore.adapters.vllm_worker import EXTENSION_CLS, SERVER_ARGS
from rolloutcore.engine.identity import (
    ADAPTER_JOIN,
    UNSTAGED,
    CheckpointError,
    safetensors_files,
    with_adapter,
)
from rolloutcore.engine.peer import is_peer_url, peer_url

T = TypeVar("T")
MUTATION_METHODS = ("rc_reload_weights", "reload_weights")
#: How often a staging is polled for its workers' buffers (each poll is one small RPC).
STAGE_POLL_S = 0.02
_TIERS = ("prefix", "encoder", "mm")
ABORT_POLL_S = 0.01
#: How the adapter pauses and resumes: ``sleep`` is ``POST /sleep?level=0&mode=...`` and
#: ``POST /wake_up?tags=scheduling``; ``pause`` is ``POST /pause?mode=...&clear_cache=false``
#: and ``POST /resume``. Both reach the same engine call (the scheduler's pause, caches
#: kept; its resume); ``/pause`` then sleeps 20 ms in the API server before it answers
#: (vLLM: "not required for correctness"), ``/sleep`` at level 0 does not, and
#: ``/wake_up`` resumes scheduling only if no executor memory is asleep.
PAUSE_ROUTES = ("sleep", "pause")
RUNNING = "vllm:num_requests_running"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATED = "vllm:generation_tokens_total"
#: What one pause or resume sends, per route: (method, path, query).
PAUSE_WIRE: dict[str, tuple[str, str]] = {"sleep": ("POST", "/sleep"),
                                          "pause": ("POST", "/pause")}
RESUME_WIRE: dict[str, tuple[str, str]] = {"sleep": ("POST", "/wake_up"),
                                           "pause": ("POST", "/resume")}


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client this process makes: building one (httpx does it
    per client) loads the CA bundle and costs 50-80 ms, more than a whole verified cycle's
    control logic; the mutation's fresh client would pay it every time."""
    return httpx.create_ssl_context()


@dataclass(frozen=True)
class Timeouts:
    """Transport timeouts for calls that carry no step deadline (the application's
    generations, tooling reads). A lifecycle call's timeouts come from its deadline."""

    connect: float = 2.0
    read: float = 10.0
    generate: float = 600.0


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any  # parsed JSON, or None for an empty body
    text: str
    seconds: float


@dataclass(frozen=True)
class RequestLog:
    """One completed HTTP exchange (for benchmarks: which endpoints a step needs)."""

    op: str
    method: str
    path: str
    params: dict[str, Any]
    json_body: Any
    status: int
    seconds: float


RequestListener = Callable[[RequestLog], None]


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(base_url: str, *, allow_insecure_remote: bool = False) -> httpx.URL:
    url = httpx.URL(base_url)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"engine URL must be http(s), got {base_url!r}")
    if url.scheme == "http" and not is_loopback(url.host) and not allow_insecure_remote:
        raise ValueError(
            f"refusing plain-http engine URL {base_url!r}: not loopback, and vLLM's dev-mode "
            "routes (pause, weight reload) are unauthenticated; use https or pass "
            "allow_insecure_remote=True")
    return url


class _Pool:
    """One shared httpx client, replaced (not closed under its users) on demand.

    Calls run on the runner's deadline threads and the application's rollout threads
    at once; a replaced client is closed when its last user is done.
    """

    def __init__(self, factory: Callable[[], httpx.Client]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._client = factory()
        self._users: dict[httpx.Client, int] = {}
        self.created = 1

    @contextlib.contextmanager
    def lease(self) -> Iterator[httpx.Client]:
        with self._lock:
            c = self._client
            self._users[c] = self._users.get(c, 0) + 1
        try:
            yield c
        finally:
            with self._lock:
                self._users[c] -= 1
                if self._users[c] == 0:
                    del self._users[c]
                    if c is not self._client:
                        c.close()

    def replace(self, bad: httpx.Client | None = None) -> None:
        with self._lock:
            if bad is not None and bad is not self._client:
                return  # someone replaced it already
            old = self._client
            self._client = self._factory()
            self.created += 1
            if old not in self._users:
                old.close()

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _metric_sum(text: str, name: str) -> float | None:
    """Sum of every sample of ``name`` (all label sets) in Prometheus text."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                return None
            seen = True
    return total if seen else None


class HttpAdapter:
    """The lifecycle adapter for one vLLM server (dev mode, with the worker extension).

    ``mutation_method``: ``rc_reload_weights`` (the worker extension: identity computed
    from the loaded bytes, refuses before touching the model) or ``reload_weights``
    (vLLM's built-in in-place reload; no checks, dies halfway on a bad checkpoint).

    ``pause_route``: ``sleep`` (default) or ``pause``, see :data:`PAUSE_ROUTES`; with
    ``sleep``, a server without ``/sleep`` or ``/wake_up`` (404/405: no handler ran) is
    paused and resumed through ``/pause`` and ``/resume`` from then on. Counters are read with the
    Prometheus ``name[]`` filter (``GET /metrics/?name[]=...``: ~2 ms instead of ~15 ms
    for the whole 50 kB exposition), falling back to ``/metrics`` where the filter is not
    served. A probe's prefix-cache hits come from its own reply
    (``usage.prompt_tokens_details.cached_tokens``, with ``--enable-prompt-tokens-details``
    in :data:`SERVER_ARGS`), else from the counters around it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "tiny",
        token: str | None = None,
        allow_insecure_remote: bool = False,
        timeouts: Timeouts = Timeouts(),
        retries: int = 2,
        retry_backoff_s: float = 0.05,
        mutation_method: str = "rc_reload_weights",
        check_source_exists: bool = True,
        transport: httpx.BaseTransport | None = None,
        on_request: RequestListener | None = None,
        pause_route: str = "sleep",
        lora: str | None = None,
    ) -> None:
        if mutation_method not in MUTATION_METHODS:
            raise ValueError(f"mutation_method must be one of {MUTATION_METHODS}")
        if pause_route not in PAUSE_ROUTES:
            raise ValueError(f"pause_route must be one of {PAUSE_ROUTES}")
        self.pause_route = pause_route
        self._filtered_metrics = True  # GET /metrics/?name[]=... until shown otherwise
        #: Whether completions report their cached prompt tokens (None: not seen yet).
        self._usage_hits: bool | None = None
        self.url = check_url(base_url, allow_insecure_remote=allow_insecure_remote)
        #: Shown by a peer source and by the stagings that read it: a fleet hands all
        #: its members one (see Fleet's ``peer_sources``); a lone engine's is its own.
        self.peer_token = secrets.token_hex(16)
        #: The LoRA adapter the engine serves the policy through (None: the base weights):
        #: once the engine has one under this name, the identity names base and adapter
        #: and the probe goes through it; an update loads a new adapter under this name
        #: (:meth:`_mutate_adapter`). Before the first (a fresh engine: base weights
        #: only) the engine reports, and is probed as, its base weights.
        self.lora = lora
        self.base_model = model
        self.model = lora or model
        #: Whether this engine takes scored probes (prompt logprobs): not a LoRA engine,
        #: whose audits run beside served requests and vLLM CPU's LoRA logits path cannot
        #: batch prompt logprobs with others (the engine dies): it is probed greedily.
        self.scored_probes = lora is None
        self.timeouts = timeouts
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.mutation_method = mutation_method
        # The source directory is checked before the call only when the engine shares
        # this machine's filesystem (loopback); otherwise the worker checks it.
        self.check_source_exists = check_source_exists and is_loopback(self.url.host)
        self._transport = transport
        self.on_request = on_request
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._pool = _Pool(self._new_client)
        #: The controller's epoch, sent with every weight load (see fence_epoch); None
        #: until a controller with a store leads.
        self.epoch: int | None = None
        #: Whether the controller still holds its leadership (None: no store): checked
        #: before every request that is not a read.
        self.lease_check: Callable[[], bool] | None = None
        # Independent reads go out at once: one round trip's latency instead of their sum.
        self._readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rolloutcore-read")

    def _new_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self._headers, transport=self._transport,
                            trust_env=False, timeout=self._timeout(self.timeouts.read),
                            verify=_ssl_context())

    def _timeout(self, read: float) -> httpx.Timeout:
        return httpx.Timeout(read, connect=self.timeouts.connect)

    @property
    def clients_created(self) -> int:
        return self._pool.created

    def close(self) -> None:
        self._readers.shutdown(wait=False)
        self._pool.close()

    def __enter__(self) -> HttpAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def request(self, method: str, path: str, *, op: str, timeout: float | None = None,
                idempotent: bool, json_body: Any = None,
                params: Mapping[str, str] | tuple[tuple[str, str], ...] | None = None,
                fresh: bool = False, expect_json: bool = True,
                deadline: float | None = None) -> Reply:
        """One HTTP exchange. With ``deadline`` (a ``time.monotonic()`` value) every
        transport timeout is what is left of it; otherwise ``timeout`` or the default
        read timeout. Idempotent calls are retried (bounded, and only while the deadline
        leaves time) on a fresh connection after a connection-level error; timeouts are
        never retried here."""
        if method != "GET" and self.lease_check is not None and not self.lease_check():
            # A controller that no longer holds its leadership (by its own clock) sends no
            # effect: the window between its last check and the effect is what fencing
            # covers; this closes the rest (a controller thawed after a freeze).
            raise AdapterError(f"{op}: {method} {path} not sent: this controller no longer "
                               "holds the fleet's leadership", proven_no_effect=True)
        attempts = 1 + (self.retries if idempotent else 0)
        last: Exception | None = None
        query = None if params is None else httpx.QueryParams(params)
        for n in range(attempts):
            if deadline is not None:
                left = remaining(deadline)
                t = httpx.Timeout(left, connect=min(self.timeouts.connect, left))
            else:
                t = self._timeout(timeout if timeout is not None else self.timeouts.read)
            if fresh and n == 0:
                self._pool.replace()
            with self._pool.lease() as client:
                t0 = time.perf_counter()
                try:
                    r = client.request(method, path, json=json_body, params=query, timeout=t)
                except httpx.TimeoutException as e:
                    self._pool.replace(client)
                    raise AdapterError(f"{op}: {method} {path} timed out after "
                                       f"{time.perf_counter() - t0:.2f} s ({type(e).__name__})",
                                       proven_no_effect=isinstance(e, httpx.ConnectTimeout)
                                       ) from e
                except httpx.TransportError as e:
                    self._pool.replace(client)  # never reuse a connection that failed
                    last = e
                    pause_s = self.retry_backoff_s * (n + 1)
                    if n + 1 < attempts and (deadline is None
                                             or time.monotonic() + pause_s < deadline):
                        time.sleep(pause_s)
                        continue
                    raise AdapterError(
                        f"{op}: {method} {path}: {type(e).__name__}: {e or 'connection failed'}"
                        + (f" (after {attempts} attempts)" if attempts > 1 else ""),
                        proven_no_effect=isinstance(e, httpx.ConnectError)) from e
                seconds = time.perf_counter() - t0
            if self.on_request is not None:
                self.on_request(RequestLog(op, method, path, _params_dict(params), json_body,
                                           r.status_code, seconds))
            if r.status_code >= 500:
                self._pool.replace(client)  # the server drops the connection after a 5xx
            text = r.text
            body: Any = None
            if text.strip():
                try:
                    body = json.loads(text)
                except ValueError:
                    if expect_json:
                        raise AdapterError(f"{op}: {method} {path}: HTTP {r.status_code} with a "
                                           f"non-JSON body: {text[:200]!r}") from None
                    body = None
            return Reply(r.status_code, body, text, seconds)
        raise AdapterError(f"{op}: {method} {path}: {last}")  # pragma: no cover

    def rpc(self, method: str, *, op: str, idempotent: bool = True,
            timeout: float | None = None, fresh: bool = False, deadline: float | None = None,
            **kwargs: Any) -> Reply:
        return self.request("POST", "/collective_rpc", op=op, idempotent=idempotent,
                            timeout=timeout, fresh=fresh, deadline=deadline,
                            json_body={"method": method, "kwargs": kwargs})

    def _worker_results(self, reply: Reply, op: str) -> list[dict[str, Any]]:
        if reply.status != 200:
            raise AdapterError(f"{op}: HTTP {reply.status}: {_error_text(reply)}")
        results = reply.body.get("results") if isinstance(reply.body, dict) else None
        if (not isinstance(results, list) or not results
                or not all(isinstance(r, dict) for r in results)):
            raise AdapterError(f"{op}: unexpected body {reply.text[:200]!r}")
        return results

    # ------------------------------------------------------------------ reads

    def _read_field(self, op: str, path: str, key: str, kind: type[Any],
                    deadline: float | None = None) -> Any:
        """GET ``path`` and return ``body[key]``, which must be a ``kind``; else raise."""
        r = self.request("GET", path, op=op, idempotent=True, deadline=deadline)
        value = r.body.get(key) if isinstance(r.body, dict) else None
        if r.status != 200 or not isinstance(value, kind):
            raise AdapterError(f"{op}: HTTP {r.status}, body {r.text[:200]!r}")
        return value

    def read_label(self, deadline: float | None = None) -> str:
        return str(self._read_field("read_label", "/weight_info", "weight_version", str,
                                    deadline))

    def read_paused(self, deadline: float | None = None) -> bool:
        return bool(self._read_field("read_paused", "/is_paused", "is_paused", bool, deadline))

    def read_metrics(self, deadline: float | None = None,
                     names: Sequence[str] = ()) -> str:
        """The Prometheus exposition; with ``names``, only those samples where the server
        serves the ``name[]`` filter (vLLM mounts prometheus_client's app at ``/metrics/``;
        ``/metrics`` itself ignores it), else all of it."""
        if names and self._filtered_metrics:
            r = self.request("GET", "/metrics/", op="read_metrics", idempotent=True,
                             expect_json=False, deadline=deadline,
                             params=tuple(("name[]", n) for n in names))
            if r.status == 200 and all(n in r.text for n in names):
                return r.text
            self._filtered_metrics = False  # not served here: read the whole exposition
        r = self.request("GET", "/metrics", op="read_metrics", idempotent=True,
                         expect_json=False, deadline=deadline)
        if r.status != 200:
            raise AdapterError(f"read_metrics: HTTP {r.status}")
        return r.text

    def running_requests(self, deadline: float | None = None) -> int | None:
        v = _metric_sum(self.read_metrics(deadline, (RUNNING,)), RUNNING)
        return None if v is None else int(v)

    def generated_tokens(self, deadline: float | None = None) -> int:
        """Tokens the engine has generated since it started (every request's)."""
        v = _metric_sum(self.read_metrics(deadline, (GENERATED,)), GENERATED)
        if v is None:
            raise AdapterError(f"read_metrics: no {GENERATED}")
        return int(v)

    def prefix_counters(self, deadline: float | None = None) -> tuple[int, int]:
        """(queries, hits) of the prefix cache, in tokens, summed over engines."""
        text = self.read_metrics(deadline, (PREFIX_QUERIES, PREFIX_HITS))
        q = _metric_sum(text, PREFIX_QUERIES)
        h = _metric_sum(text, PREFIX_HITS)
        if q is None or h is None:
            raise AdapterError("read_metrics: no vllm:prefix_cache_{queries,hits}_total")
        return int(q), int(h)

    def read_identity(self, deadline: float | None = None) -> str:
        """Identity of the weights the engine holds, as every worker reports it."""
        results = self._worker_results(
            self.rpc("rc_identity", op="read_identity", deadline=deadline), "read_identity")
        out = worker_identity(results)
        if self.lora is None:
            return out
        results = self._worker_results(self.rpc("rc_lora_identity", op="read_identity",
                                                deadline=deadline, name=self.lora),
                                       "read_identity")
        if all(r.get("loaded") is False for r in results):
            self.model = self.base_model  # nothing under the name yet: the base serves
            return out
        others = sorted({str(r.get("path")) for r in results
                         if r.get("loaded") is True and r.get("identity") is None
                         and r.get("basis") is None and r.get("path")})
        if others:
            # vLLM loaded an adapter under the name from a path RolloutCore did not stage
            # (reloaded in place behind the controller's back): definitely not one it
            # vouches for, so an identity that matches none (an audit's mismatch).
            self.model = self.lora
            return with_adapter(out, UNSTAGED + ",".join(others))
        adapters = {r.get("identity") for r in results}
        if len(adapters) != 1 or not isinstance(next(iter(adapters)), str):
            reasons = "; ".join(str(r.get("reason", r.get("identity"))) for r in results)
            raise AdapterError(f"read_identity: no single vouched-for adapter {self.lora!r}: "
                               f"{reasons}")
        self.model = self.lora
        return with_adapter(out, str(next(iter(adapters))))

    def cache_info(self, deadline: float | None = None) -> dict[str, Any]:
        return cache_info_of(self._worker_results(
            self.rpc("rc_cache_info", op="cache_info", deadline=deadline), "cache_info"))

    def _at_once(self, *reads: Callable[[], Any]) -> list[Any]:
        """Independent reads, sent together; each ends (within its own deadline) before
        this returns. The first failure in argument order is raised."""
        futures = [self._readers.submit(read) for read in reads]
        wait_all(futures)
        return [f.result() for f in futures]

    @staticmethod
    def _or_none(read: Callable[[float | None], T], deadline: float | None) -> T | None:
        """``read(deadline)``, or None where it fails (the evidence then says unknown)."""
        try:
            return read(deadline)
        except AdapterError:
            return None

    def read_state(self, deadline: float | None = None) -> EngineReport:
        label, identity, paused, running = self._at_once(
            lambda: self.read_label(deadline), lambda: self.read_identity(deadline),
            lambda: self.read_paused(deadline),
            lambda: self._or_none(self.running_requests, deadline))
        return EngineReport(label, identity, paused, running)

    # ------------------------------------------------------------------ pause, resume

    def pause(self, mode: PauseMode, deadline: float) -> PauseEvidence:
        mode = PauseMode(mode)
        r: Reply | None = None
        if self.pause_route == "sleep":
            # Level 0: the scheduler's pause only (caches kept, no memory released).
            r = self.request("POST", "/sleep", op="pause", idempotent=True, deadline=deadline,
                             params={"level": "0", "mode": mode.value})
            if r.status in (404, 405):  # no such route here: no handler ran
                self.pause_route, r = "pause", None
        if r is None:
            # clear_cache=false: the caches stay as the spec models them until the verified
            # resets after the mutation (a clear at pause time has no body to verify it by).
            r = self.request("POST", "/pause", op="pause", idempotent=True, deadline=deadline,
                             params={"mode": mode.value, "clear_cache": "false"})
        paused, running = self._read_back(deadline)
        if r.status == 200:
            running = self._await_idle(running, deadline)
        return PauseEvidence(mode, r.status, _as_map(r.body), paused, running)

    def _await_idle(self, running: int | None, deadline: float) -> int | None:
        """Aborted requests end a moment after the abort-mode pause returns, and the
        running gauge follows the engine's last step by a moment (``/pause`` sleeps 20 ms
        for it, ``/sleep`` does not): read the running count again (within the step's
        deadline) until it shows them gone."""
        while running and time.monotonic() + ABORT_POLL_S < deadline:
            time.sleep(ABORT_POLL_S)
            running = self._or_none(self.running_requests, deadline)
        return running

    def resume(self, deadline: float) -> ResumeEvidence:
        r: Reply | None = None
        if self.pause_route == "sleep":
            r = self.request("POST", "/wake_up", op="resume", idempotent=True,
                             deadline=deadline, params={"tags": "scheduling"})
            if r.status in (404, 405):
                self.pause_route, r = "pause", None
        if r is None:
            r = self.request("POST", "/resume", op="resume", idempotent=True,
                             deadline=deadline)
        paused, _ = self._read_back(deadline, running=False)
        return ResumeEvidence(r.status, _as_map(r.body), paused)

    def _read_back(self, deadline: float, running: bool = True) -> tuple[bool | None,
                                                                          int | None]:
        if not running:
            return self._or_none(self.read_paused, deadline), None
        paused, n = self._at_once(lambda: self._or_none(self.read_paused, deadline),
                                  lambda: self._or_none(self.running_requests, deadline))
        return paused, n

    def fence(self, label: str, deadline: float) -> FenceEvidence:
        """Pause in abort mode (in-flight requests end now) and relabel; read both back.
        Best effort on an engine that may be broken or dead: every failure is evidence."""
        pause_status: int | None = None
        label_status: int | None = None
        errors: list[str] = []
        try:
            r = self.request("POST", "/pause", op="fence_pause", idempotent=True,
                             deadline=deadline, params={"mode": "abort", "clear_cache": "false"})
            pause_status = r.status
        except AdapterError as e:
            errors.append(str(e))
        try:
            r = self.request("POST", "/update_weight_version", op="fence_label",
                             idempotent=True, deadline=deadline, json_body={"new_version": label})
            label_status = r.status
        except AdapterError as e:
            errors.append(str(e))
        paused, running = self._read_back(deadline)
        try:
            read_label: str | None = self.read_label(deadline)
        except AdapterError:
            read_label = None
        return FenceEvidence(label, pause_status, label_status, paused, read_label, running,
                             "; ".join(errors) or None)

    # ------------------------------------------------------------------ caches

    def fence_epoch(self, epoch: int, deadline: float) -> EpochEvidence:
        """Raise the engine's fencing token to ``epoch`` (every worker's), then the gateway
        fences of the leader's gateway and of every remote gateway an earlier leader
        registered (:mod:`.gateway_fence`): accepted only if every worker took it and the
        engine serves no request a deposed leader's gateways stamped. From then on this
        adapter sends ``epoch`` with its loads."""
        try:
            reply = self.rpc("rc_fence", op="fence_epoch", idempotent=True, deadline=deadline,
                             epoch=int(epoch))
            results = self._worker_results(reply, "fence_epoch")
        except AdapterError as e:
            return EpochEvidence(epoch, False, None, str(e))
        ev = epoch_evidence(epoch, results)
        if not ev.accepted:
            return ev
        why = self.fence_gateway(LEADER_GATEWAY, int(epoch), deadline) or \
            self.fence_gateway(ANY_REMOTE, remote_floor(epoch), deadline)
        if why is not None:
            return replace(ev, accepted=False, error=f"gateway fence: {why}")
        self.epoch = int(epoch)
        return ev

    def fence_gateway(self, gateway: str, epoch: int, deadline: float) -> str | None:
        """Raise ``gateway``'s fence on the engine to ``epoch``; None once the engine says
        its fence is at least that and nothing below it runs, else why not."""
        try:
            r = self.request("POST", FENCE_PATH, op="fence_epoch", idempotent=True,
                             deadline=deadline, json_body={"gateway": gateway, "epoch": epoch})
        except AdapterError as e:
            return str(e)
        body = r.body if isinstance(r.body, dict) else {}
        fence, left = body.get("fence"), body.get("running_below")
        if r.status != 200 or not isinstance(fence, int) or fence < epoch or left != 0:
            return f"HTTP {r.status}: {str(r.body)[:200]}"
        return None

    def reset_cache(self, tier: str, deadline: float) -> ResetEvidence:
        if tier not in _TIERS:
            raise AdapterError(f"unknown cache tier {tier!r}", proven_no_effect=True)
        if tier == "prefix":
            # Refused (success:false) while running requests hold blocks: that is a signal,
            # so running requests are not reset from under the engine.
            r = self.request("POST", "/reset_prefix_cache", op="reset_prefix", idempotent=True,
                             deadline=deadline, params={"reset_running_requests": "false",
                                                        "reset_external": "false"})
            return ResetEvidence(tier, r.status, _success(r.body))
        path = "/reset_encoder_cache" if tier == "encoder" else "/reset_mm_cache"
        r = self.request("POST", path, op=f"reset_{tier}", idempotent=True, deadline=deadline)
        entries: int | None = None
        absent = False
        if r.status == 200:
            try:
                info = self.cache_info(deadline)
            except AdapterError:
                info = None
            if info is not None:
                # Only the engine's own word: its model has no multimodal encoder.
                absent = info["multimodal"] is False
                entries = info["encoder_entries" if tier == "encoder" else
                               "mm_receiver_entries"]
        return ResetEvidence(tier, r.status, _success(r.body), entries_after=entries,
                             tier_absent=absent)

    # ------------------------------------------------------------------ generation

    def _completion(self, prompt: tuple[int, ...], max_tokens: int, op: str, *,
                    deadline: float | None = None, scored: bool = False) -> Reply:
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt), "max_tokens": max_tokens,
            "min_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True,
            "logprobs": 0}
        if scored:
            body["prompt_logprobs"] = 0  # each prompt token's own log-probability
        if op == "probe":
            body["user"] = "rolloutcore:probe"  # names the request in logs and proxies
        # Not retried: a request that reached the engine may still be running there.
        return self.request("POST", "/v1/completions", op=op, idempotent=False,
                            json_body=body, timeout=self.timeouts.generate, deadline=deadline)

    @staticmethod
    def _parse_completion(reply: Reply, prompt: tuple[int, ...]) -> tuple[
            tuple[int, ...], str | None, tuple[float, ...] | None]:
        try:
            choice = reply.body["choices"][0]
            tokens = tuple(int(t) for t in choice["token_ids"])
            seen = choice.get("prompt_token_ids")
            finish = choice.get("finish_reason")
            lp = (choice.get("logprobs") or {}).get("token_logprobs")
        except (KeyError, IndexError, TypeError, ValueError):
            raise AdapterError(f"completion: unexpected body {reply.text[:200]!r}") from None
        if seen is not None and tuple(seen) != tuple(prompt):
            raise AdapterError("completion: the engine saw a different prompt")
        logprobs = tuple(float(x) for x in lp) if isinstance(lp, list) else None
        return tokens, finish, logprobs

    def probe(self, prompt: tuple[int, ...], max_tokens: int, deadline: float, *,
              scored: bool = False) -> ProbeEvidence:
        before: tuple[int, int] | None = None
        if not self._usage_hits:  # the reply may not say: read the counters around it
            try:
                before = self.prefix_counters(deadline)
            except AdapterError:
                before = None
        try:
            reply = self._completion(prompt, max_tokens, "probe", deadline=deadline,
                                     scored=scored)
        except AdapterError as e:
            return ProbeEvidence(prompt, None, None, None, error=str(e))
        if reply.status != 200:
            return ProbeEvidence(prompt, None, reply.status, None,
                                 error=f"HTTP {reply.status}: {_error_text(reply)}")
        try:
            tokens, finish, logprobs = self._parse_completion(reply, prompt)
        except AdapterError as e:
            return ProbeEvidence(prompt, None, reply.status, None, error=str(e))
        # The hits this request caused: its own reply's cached prompt tokens, else the
        # counters' delta around it.
        hits = _cached_tokens(reply.body)
        self._usage_hits = hits is not None
        if hits is None and before is not None:
            try:
                hits = self.prefix_counters(deadline)[1] - before[1]
            except AdapterError:
                hits = None
        if finish != "length":  # aborted or cut short: no evidence about the weights
            return ProbeEvidence(prompt, None, reply.status, finish, prefix_hits=hits,
                                 error=f"probe finished with {finish!r} after {len(tokens)} "
                                 "tokens")
        scores: tuple[float | None, ...] | None = None
        if scored:
            try:
                scores = _prompt_scores(reply.body, prompt)
            except AdapterError as e:
                return ProbeEvidence(prompt, None, reply.status, finish, prefix_hits=hits,
                                     error=str(e))
        return ProbeEvidence(prompt, tokens, reply.status, finish, prefix_hits=hits,
                             logprobs=logprobs, prompt_logprobs=scores)

    def generate(self, prompt: tuple[int, ...], max_tokens: int) -> GenerationResult:
        reply = self._completion(prompt, max_tokens, "generate")
        if reply.status != 200:
            raise AdapterError(f"generate: HTTP {reply.status}: {_error_text(reply)}")
        tokens, finish, logprobs = self._parse_completion(reply, prompt)
        return GenerationResult(prompt, tokens, finish, logprobs,
                                extra={"seconds": round(reply.seconds, 4)})

    # ------------------------------------------------------------------ mutation

    def mutate(self, target: WeightTarget, deadline: float) -> MutationEvidence:
        """Load ``target.source`` in place, then finalise with ``target.label``. Never
        retried; anything between "certainly nothing moved" and "loaded and finalised"
        is ambiguous."""
        t0 = time.perf_counter()

        def ev(outcome: MutationOutcome, observed: str, nbytes: int | None = None) -> (
                MutationEvidence):
            return MutationEvidence(outcome, observed, time.perf_counter() - t0, nbytes)

        if target.adapter is not None or self.lora is not None:
            return self._mutate_adapter(target, deadline, ev)
        if self.check_source_exists:
            try:
                safetensors_files(target.source)
            except CheckpointError as e:
                raise AdapterError(f"mutate: refused before sending anything: {e}",
                                   proven_no_effect=True) from None
        kwargs: dict[str, Any] = {"weights_path": str(Path(target.source))}
        if self.mutation_method == "rc_reload_weights":
            kwargs["expected_identity"] = target.identity
            if self.epoch is not None:
                kwargs["epoch"] = self.epoch
        return self._load_and_finalise(self.mutation_method, kwargs, target, deadline, ev)

    def _load_and_finalise(self, method: str, kwargs: dict[str, Any], target: WeightTarget,
                           deadline: float, ev: Callable[..., MutationEvidence]
                           ) -> MutationEvidence:
        try:
            # A fresh connection: a pooled one may be the one the server just dropped.
            reply = self.rpc(method, op="mutate", idempotent=False, fresh=True,
                             deadline=deadline, **kwargs)
        except AdapterError as e:
            if e.proven_no_effect:  # the connection was never made: nothing was sent
                raise
            return ev(MutationOutcome.AMBIGUOUS, f"{method}: {e}")
        if reply.status != 200:
            return ev(MutationOutcome.AMBIGUOUS, f"{method}: HTTP {reply.status}: "
                      f"{_error_text(reply)}")
        nbytes: int | None = None
        if method != "reload_weights":
            try:
                results = self._worker_results(reply, "mutate")
            except AdapterError as e:
                return ev(MutationOutcome.AMBIGUOUS, str(e))
            failed = reload_failure(results, target)
            if failed is not None:
                return ev(*failed)
            nbytes = sum(int(r.get("bytes") or 0) for r in results)
        elif reply.body is not None and not (
                isinstance(reply.body, dict) and isinstance(reply.body.get("results"), list)):
            # vLLM's reload returns None per worker: {"results": [null]} or an empty 200.
            return ev(MutationOutcome.AMBIGUOUS, f"reload_weights: unexpected body "
                      f"{reply.text[:200]!r}")
        return self._finalise(target, deadline, ev, f"{method} {target.source}", nbytes)

    # ------------------------------------------------------------ staged updates

    @property
    def stages_updates(self) -> bool:
        """Base-weight updates stage (spec/staged.py); an adapter update stages its own
        read-only copy already (:meth:`_mutate_adapter`)."""
        return self.lora is None

    def stage_ranks(self, deadline: float) -> int:
        """How many workers the engine has (each answers every ``collective_rpc``)."""
        reply = self.rpc("rc_epoch", op="stage", idempotent=True, deadline=deadline)
        return len(self._worker_results(reply, "stage"))

    def stage(self, target: WeightTarget, deadline: float, *,
              rank_sources: Mapping[int, str] | None = None) -> StageEvidence:
        """Every worker stages ``target.source`` into a host-memory buffer on a background
        thread while the engine serves (``rc_stage`` returns at once), then is polled
        (``rc_stage_status``) until all are done or the deadline passes. What each
        worker's buffer holds is its evidence; nothing here decides. ``rank_sources``:
        where a rank reads instead of ``target.source`` (1-based rank -> directory)."""
        t0 = time.perf_counter()
        peer = is_peer_url(target.source)
        kwargs: dict[str, Any] = {"weights_path": target.source if peer else
                                  str(Path(target.source))}
        if peer:
            kwargs["peer_token"] = self.peer_token
        if rank_sources:
            kwargs["rank_paths"] = {str(r): str(Path(p)) for r, p in rank_sources.items()}
        if self.epoch is not None:
            kwargs["epoch"] = self.epoch
        started = self._worker_results(
            self.rpc("rc_stage", op="stage", idempotent=False, fresh=True, deadline=deadline,
                     **kwargs), "stage")
        return self.stage_evidence(started, deadline, t0,
                                   f"rc_stage {target.source} on {len(started)} worker(s)")

    def peer_source(self, identity: str, deadline: float) -> str:
        """Where another engine of the fleet stages ``identity`` from this one (its
        complete staging, or what it installed from one): the first worker's peer server,
        on the interface this adapter reaches the engine at (``rc_peer_serve``)."""
        host = self.url.host
        reply = self._worker_results(self.rpc(
            "rc_peer_serve", op="stage", idempotent=True, deadline=deadline, host=host,
            token=self.peer_token), "stage")
        port = reply[0].get("port") if reply else None
        if not isinstance(port, int):
            raise AdapterError(f"rc_peer_serve: no port in {reply!r}")
        return peer_url(host, port, identity)

    def stage_evidence(self, started: Sequence[Mapping[str, Any]], deadline: float,
                       t0: float, observed: str) -> StageEvidence:
        """Each worker's staging buffer, from its answer to the call that started it
        (``started``: refused or not) and then ``rc_stage_status``, polled until every
        started worker is done or the deadline passes."""
        stages: dict[int, RankStage] = {}
        for i, r in enumerate(started, 1):
            if r.get("started") is not True:
                rank = _rank_of(r, i)
                stages[rank] = RankStage(rank, None, True, error=f"refused: {r.get('refused')}")
        status: list[dict[str, Any]] = []
        while len(stages) < len(started):
            status = self._worker_results(
                self.rpc("rc_stage_status", op="stage", idempotent=True, deadline=deadline),
                "stage")
            if all(r.get("done") is True for r in status) or time.monotonic() >= deadline:
                break
            time.sleep(min(STAGE_POLL_S, remaining(deadline)))
        for i, r in enumerate(status, 1):
            rank = _rank_of(r, i)
            if rank in stages:
                continue
            if r.get("done") is not True:
                stages[rank] = RankStage(rank, None, False, error="not done by the deadline")
                continue
            identity = r.get("identity")
            stages[rank] = RankStage(
                rank, identity if isinstance(identity, str) else None,
                r.get("complete") is True, int(r.get("tensors") or 0),
                int(r.get("bytes") or 0),
                None if r.get("error") is None else str(r.get("error")),
                float(r.get("seconds") or 0.0))
        return StageEvidence(len(started), tuple(stages[k] for k in sorted(stages)),
                             observed, time.perf_counter() - t0)

    def install(self, target: WeightTarget, deadline: float, *,
                check_identity: bool = True) -> MutationEvidence:
        """Install the staged buffers (``rc_install_staged``: vLLM's own reload from the
        staged tensors), then finalise the label. Never retried; as :meth:`mutate`."""
        t0 = time.perf_counter()

        def ev(outcome: MutationOutcome, observed: str, nbytes: int | None = None) -> (
                MutationEvidence):
            return MutationEvidence(outcome, observed, time.perf_counter() - t0, nbytes)

        kwargs: dict[str, Any] = {"expected_identity": target.identity}
        if not check_identity:  # the negative control (see rc_install_staged)
            kwargs["check_identity"] = False
        if self.epoch is not None:
            kwargs["epoch"] = self.epoch
        return self._load_and_finalise("rc_install_staged", kwargs, target, deadline, ev)

    def discard_stage(self, deadline: float) -> None:
        self.rpc("rc_stage_discard", op="stage", idempotent=True, deadline=deadline)

    def _finalise(self, target: WeightTarget, deadline: float,
                  ev: Callable[..., MutationEvidence], done: str,
                  nbytes: int | None) -> MutationEvidence:
        # The mutation's own finalisation: the label, and only here. Setting it is
        # idempotent, so this step (unlike the load) is retried on a fresh connection.
        try:
            fin = self.request("POST", "/update_weight_version", op="finalise", idempotent=True,
                               deadline=deadline, json_body={"new_version": target.label})
        except AdapterError as e:
            return ev(MutationOutcome.AMBIGUOUS, f"weights loaded, label not finalised: {e}")
        body = fin.body if isinstance(fin.body, dict) else {}
        if fin.status != 200 or body.get("success") is not True or \
                body.get("new_version") != target.label:
            return ev(MutationOutcome.AMBIGUOUS, f"weights loaded, label not finalised: HTTP "
                      f"{fin.status} {fin.text[:200]!r}")
        return ev(MutationOutcome.COMPLETED, f"{done} and finalised as {target.label!r}",
                  nbytes)

    def _mutate_adapter(self, target: WeightTarget, deadline: float,
                        ev: Callable[..., MutationEvidence]) -> MutationEvidence:
        """A LoRA adapter update: the worker stages a digested read-only copy (refused,
        nothing changed, unless its digest is the target's), vLLM drops the old adapter
        and loads the copy under the same name from its fresh path (fresh prefix-cache
        keys; ``load_inplace`` is never used: it re-reads the path at every step)."""
        if target.adapter is None or target.adapter != self.lora:
            raise AdapterError(f"mutate: the engine serves adapter {self.lora!r}, the target "
                               f"is {target.adapter!r}: refused", proven_no_effect=True)
        _base, sep, adapter_identity = target.identity.partition(ADAPTER_JOIN)
        if not sep:
            raise AdapterError("mutate: an adapter target's identity names no adapter",
                               proven_no_effect=True)
        kwargs: dict[str, Any] = {"source": str(Path(target.source)),
                                  "expected_identity": adapter_identity}
        if self.epoch is not None:
            kwargs["epoch"] = self.epoch
        try:
            reply = self.rpc("rc_stage_lora", op="mutate", idempotent=False, fresh=True,
                             deadline=deadline, **kwargs)
        except AdapterError as e:
            raise AdapterError(f"mutate: staging failed: {e}", proven_no_effect=True) from None
        if reply.status != 200:  # staging writes only a private directory: nothing served
            raise AdapterError(f"mutate: staging failed: HTTP {reply.status}: "
                               f"{_error_text(reply)}", proven_no_effect=True)
        results = self._worker_results(reply, "mutate")
        staged = {r.get("staged") for r in results}
        if len(staged) != 1 or not isinstance(next(iter(staged)), str):
            return ev(MutationOutcome.NOT_MUTATED, "staging refused before anything was "
                      "loaded: " + "; ".join(str(r.get("refused")) for r in results))
        path = str(next(iter(staged)))
        try:
            gone = self.request("POST", "/v1/unload_lora_adapter", op="mutate",
                                idempotent=False, deadline=deadline,
                                json_body={"lora_name": self.lora}, expect_json=False)
        except AdapterError as e:
            return ev(MutationOutcome.AMBIGUOUS, f"unload of {self.lora!r}: {e}")
        # 404: nothing was loaded under the name (the first install); 200: it is gone.
        if gone.status not in (200, 404):
            return ev(MutationOutcome.AMBIGUOUS, f"unload of {self.lora!r}: HTTP "
                      f"{gone.status}: {_error_text(gone)}")
        try:
            load = self.request("POST", "/v1/load_lora_adapter", op="mutate", idempotent=False,
                                deadline=deadline,
                                json_body={"lora_name": self.lora, "lora_path": path},
                                expect_json=False)
        except AdapterError as e:
            return ev(MutationOutcome.AMBIGUOUS, f"load of {self.lora!r} from {path}: {e}")
        if load.status != 200:
            return ev(MutationOutcome.AMBIGUOUS, f"load of {self.lora!r}: HTTP {load.status}: "
                      f"{_error_text(load)}")
        self.model = self.lora  # from here on the policy is served through the adapter
        return self._finalise(target, deadline, ev, f"adapter {self.lora!r} staged at {path} "
                              f"(digest {adapter_identity[:16]}) and loaded", None)


# ---------------------------------------------------------------- worker results
# What the worker extension's results mean (one dict per worker), for every adapter that
# reaches the extension: through ``/collective_rpc`` here, in-process in ``.inprocess``.


def _rank_of(result: Mapping[str, Any], position: int) -> int:
    """The 1-based rank a worker's result names (its position where it names none)."""
    rank = result.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else position


def worker_identity(results: Sequence[Mapping[str, Any]]) -> str:
    """The one identity every worker vouches for (``rc_identity``); else AdapterError."""
    ids = {r.get("identity") for r in results}
    out = next(iter(ids)) if len(ids) == 1 else None
    if not isinstance(out, str):
        reasons = "; ".join(str(r.get("reason", r.get("identity"))) for r in results)
        raise AdapterError(f"read_identity: the engine vouches for no single identity: "
                           f"{reasons}")
    return out


def cache_info_of(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The engine's weight-dependent caches as its workers report them (``rc_cache_info``)."""
    worker = _sum_or_none(r.get("encoder_cache_entries") for r in results)
    scheduler = _sum_or_none(r.get("encoder_scheduler_entries") for r in results)
    return {"multimodal": any(r.get("multimodal") is not False for r in results),
            "encoder_cache_entries": worker,
            "encoder_scheduler_entries": scheduler,
            # Both halves, or unknown: a worker emptied under a scheduler that still
            # lists an image is exactly the state that crashes the engine.
            "encoder_entries": None if worker is None or scheduler is None
            else worker + scheduler,
            "mm_receiver_entries": _sum_or_none(r.get("mm_receiver_entries") for r in results),
            "encoder_cache_keys": sorted({k for r in results
                                         for k in r.get("encoder_cache_keys") or ()}),
            "encoder_scheduler_keys": sorted({
                k for r in results for k in r.get("encoder_scheduler_keys") or ()})}


def epoch_evidence(epoch: int, results: Sequence[Mapping[str, Any]]) -> EpochEvidence:
    """The workers' answer to ``rc_fence(epoch)``: accepted only if every worker took it."""
    accepted = [r.get("accepted") for r in results]
    seen = [r.get("seen") for r in results]
    if not results or not all(isinstance(x, bool) for x in accepted) or \
            not all(isinstance(x, int) and not isinstance(x, bool) for x in seen):
        return EpochEvidence(epoch, False, None, f"rc_fence: malformed results {results!r}")
    return EpochEvidence(epoch, all(accepted), max(int(x) for x in seen))  # type: ignore[arg-type]


def reload_failure(results: Sequence[Mapping[str, Any]], target: WeightTarget
                   ) -> tuple[MutationOutcome, str] | None:
    """What ``rc_reload_weights``'s results say when they are not a load of exactly
    ``target``'s bytes on every worker (None: they are)."""
    loaded = [r.get("loaded") for r in results]
    if all(x is False for x in loaded):
        return (MutationOutcome.NOT_MUTATED, "every worker refused before touching the model: "
                + "; ".join(str(r.get("refused")) for r in results))
    if not all(x is True for x in loaded):
        return MutationOutcome.AMBIGUOUS, f"workers disagree: loaded={loaded}"
    ids = {r.get("identity") for r in results}
    if ids != {target.identity}:
        return (MutationOutcome.AMBIGUOUS, f"loaded identity {sorted(map(str, ids))} is not "
                f"the target's {target.identity[:16]}")
    return None


def _cached_tokens(body: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of a completion (prompt tokens served
    from the prefix cache); None where the server does not report it."""
    try:
        n = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    except (KeyError, TypeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _prompt_scores(body: Any, prompt: tuple[int, ...]) -> tuple[float | None, ...]:
    """Each prompt token's own log-probability from a ``prompt_logprobs: 0`` reply
    (position 0 has none): ``[null, {"<id>": {"logprob": ...}}, ...]``."""
    try:
        entries = body["choices"][0]["prompt_logprobs"]
        out: list[float | None] = []
        for i, entry in enumerate(entries):
            if entry is None:
                out.append(None)
                continue
            out.append(float(entry[str(prompt[i])]["logprob"]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise AdapterError("probe: no prompt log-probabilities in the reply") from None
    if len(out) != len(prompt):
        raise AdapterError(f"probe: {len(out)} prompt log-probabilities for {len(prompt)} "
                           "prompt tokens")
    return tuple(out)


def _params_dict(params: Mapping[str, str] | tuple[tuple[str, str], ...] | None) -> (
        dict[str, Any]):
    if params is None:
        return {}
    if isinstance(params, Mapping):
        return dict(params)
    out: dict[str, Any] = {}
    for k, v in params:  # a repeated key (name[]) keeps every value
        out[k] = [*out[k], v] if k in out and isinstance(out[k], list) else (
            [out[k], v] if k in out else v)
    return out


def _as_map(body: Any) -> Mapping[str, Any] | None:
    return body if isinstance(body, dict) else None


def _success(body: Any) -> bool | None:
    s = body.get("success") if isinstance(body, dict) else None
    return s if isinstance(s, bool) else None


def _sum_or_none(values: Any) -> int | None:
    total = 0
    for v in values:
        if not isinstance(v, int):
            return None
        total += v
    return total


def _error_text(reply: Reply) -> str:
    if isinstance(reply.body, dict):
        err = reply.body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:300]
        if "detail" in reply.body:
            return str(reply.body["detail"])[:300]
    return reply.text[:300] or "(empty body)"


__all__ = ["EXTENSION_CLS", "SERVER_ARGS", "HttpAdapter", "Reply", "RequestLog", "Timeouts",
           "cache_info_of", "check_url", "epoch_evidence", "is_loopback", "reload_failure",
           "worker_identity"]
