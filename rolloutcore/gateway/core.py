"""The gateway's control half, without HTTP: admission through a bounded queue, the
fleet-wide staleness floor, admin operations on a worker thread, and status.

Every method that can block (admission, release, updates) is synchronous and meant to
run on a worker thread; the ASGI half (:mod:`rolloutcore.gateway.app`) calls them
through ``anyio.to_thread``.

Durability: the fleet's journal is switched to group commit, and admissions and releases
are journalled inside :meth:`Journal.deferred`: the fleet admits under its own lock, so a
durability wait there would serialise every admission on one fsync each. Each call
returns only once its record is durable, and nothing is forwarded or answered before.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.engine.controller import AdmissionCancelled, AdmissionTimeout, Binding
from rolloutcore.engine.postconditions import Outcome
from rolloutcore.errors import GatewayRefused, Refused
from rolloutcore.fleet import Fleet, FleetCycleReport, FleetError, Lease, TargetFactory
from rolloutcore.gateway.collector import RecordWriter
from rolloutcore.gateway.episodes import Episodes
from rolloutcore.gateway.metrics import GatewayMetrics
from rolloutcore.journal import JournalError, JournalReader
from rolloutcore.spec.fleet import admission_floor
from rolloutcore.spec.lifecycle import Phase

log = logging.getLogger("rolloutcore.gateway")


class StaleMode(StrEnum):
    WAIT = "wait"  # a request above the committed generation waits in the queue
    REFUSE = "refuse"  # ... or is refused at once with 409


@dataclass(frozen=True)
class GatewayConfig:
    model: str  # the served model name requests must name ("model")
    queue_depth: int = 64  # requests waiting for admissions to open, at most
    queue_wait_s: float = 30.0  # how long one of them waits, at most
    stale: StaleMode = StaleMode.WAIT
    max_body_bytes: int = 16 << 20
    admin_token: str | None = field(default=None, repr=False)
    records: Path | None = None
    retry_after_s: int = 1  # Retry-After on a 503
    connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 600.0  # between two bytes of an engine's answer
    engine_tokens: dict[str, str] = field(default_factory=dict, repr=False)
    episode_idle_s: float = 600.0  # an agentic episode idle that long is ended (expired)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a non-empty string")
        if self.queue_depth < 0:
            raise ValueError(f"queue_depth must be >= 0, got {self.queue_depth}")
        if not self.queue_wait_s >= 0:
            raise ValueError(f"queue_wait_s must be >= 0, got {self.queue_wait_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not self.episode_idle_s > 0:
            raise ValueError(f"episode_idle_s must be > 0, got {self.episode_idle_s}")
        if self.admin_token is not None and not self.admin_token:
            raise ValueError("admin_token must not be empty (None: no token)")


class Refusal(GatewayRefused):
    """A request the gateway answers itself (nothing forwarded): status, OpenAI error."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None,
                 retry_after: int | None = None, extra: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(message, code=code, status=status)
        self.message = message
        self.type = type
        self.param = param
        self.retry_after = retry_after
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": {"message": self.message, "type": self.type,
                                         "param": self.param, "code": self.code}}
        if self.extra:
            out["rolloutcore"] = self.extra
        return out


@dataclass(frozen=True)
class Queued:
    """A place in the admission queue, taken by :meth:`Gateway.admit_now`."""

    rollout_id: str
    endpoint: str
    floor: int
    exclude: tuple[str, ...] = ()
    max_staleness: int | None = None  # generations behind the frontier it accepts


T = TypeVar("T")
#: How many failed admin jobs ``/admin/status`` keeps (the newest).
FAILED_JOBS_KEPT = 20


class Busy(Refused):
    """An admin operation is already running (one at a time)."""


class Gateway:
    """A :class:`Fleet` behind the gateway: admission, release, floor, admin ops."""

    def __init__(self, fleet: Fleet, config: GatewayConfig, *, target_of: TargetFactory,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``target_of(checkpoint, generation, label)`` describes an update's target and
        raises ValueError for a checkpoint it cannot (the admin API's 400). Build the
        gateway before the fleet is used from other threads: it switches the fleet's
        journal to group commit (the Fleet builds its journal itself)."""
        self.fleet = fleet
        self.config = config
        self.target_of = target_of
        fleet.journal.use_group_commit()
        self.metrics = GatewayMetrics(fleet, floor=lambda: self.floor, clock=clock)
        self.records = RecordWriter(config.records) if config.records else None
        self.floor = 0  # fleet-wide minimum generation (admin API)
        self.started = int(time.time())  # /v1/models' "created"
        self._lock = threading.Lock()
        self._queued = 0
        self._waiting: set[threading.Event] = set()
        self._closing = False
        self._prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._admin = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-admin")
        # Admissions and releases (quick: a lock, a journal line, a shared fsync) and
        # queued waits (up to the queue depth) on pools of their own: a full queue can
        # never hold up the releases an update's drain is waiting for.
        self.quick = ThreadPoolExecutor(max_workers=32, thread_name_prefix="gateway")
        self.waits = ThreadPoolExecutor(max_workers=max(1, config.queue_depth),
                                        thread_name_prefix="gateway-queue")
        self._busy: str | None = None  # the admin operation running, if any
        #: Streams that may move when their member drains: token -> (member, signal).
        self._movable: dict[int, tuple[str, Callable[[], None]]] = {}
        self._tokens = itertools.count(1)
        fleet.drain_listeners.append(self._draining)
        self.episodes = Episodes(fleet, idle_s=config.episode_idle_s,
                                 queue_wait_s=config.queue_wait_s, pool=self.quick, clock=clock)
        if fleet.recovered:  # episodes its predecessor left live (a file or etcd journal)
            with fleet.store.replay_path() as path:
                self.episodes.recover(rec for _line, rec in JournalReader(path))
        self._reaper_stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="gateway-episodes",
                                        daemon=True)
        self._reaper.start()
        self.last_report: FleetCycleReport | None = None
        self.last_error: str | None = None  # the last admin job's failure, until one succeeds
        self.failed_jobs: list[dict[str, Any]] = []  # the latest FAILED_JOBS_KEPT failures

    # ------------------------------------------------------------------ admission

    @property
    def queued(self) -> int:
        return self._queued

    def new_rollout_id(self) -> str:
        return f"gw-{self._prefix}-{next(self._ids)}"

    def admit(self, rollout_id: str, endpoint: str, min_generation: int,
              cancel: threading.Event, max_staleness: int | None = None) -> Lease:
        """Admit now, or wait in the bounded queue; raise :class:`Refusal` otherwise.
        Returns once the admission is durable in the journal."""
        first = self.admit_now(rollout_id, endpoint, min_generation, (), max_staleness)
        return first if isinstance(first, Lease) else self.admit_queued(first, cancel)

    def admit_now(self, rollout_id: str, endpoint: str, min_generation: int,
                  exclude: tuple[str, ...] = (), max_staleness: int | None = None
                  ) -> Lease | Queued:
        """Admit at once if admissions are open (durably: returns once journalled), or
        take a place in the queue (then :meth:`admit_queued`, always), or refuse. Never
        waits for admissions: the ASGI half runs this on a pool of its own, so that
        queued requests cannot starve admissions and releases of threads. ``exclude``:
        engines this request failed on already. ``max_staleness``: serve it only on a
        member at most that many generations behind the frontier."""
        floor = admission_floor(self.fleet.committed, min_generation, floor=self.floor)
        if self._closing:
            raise Refusal(503, "the gateway is shutting down", type="server_error",
                          code="shutting_down", retry_after=self.config.retry_after_s)
        try:
            with self.fleet.journal.deferred():
                return self.fleet.admit(rollout_id, min_generation=floor, exclude=exclude,
                                        max_staleness=max_staleness,
                                        detail={"via": "gateway", "endpoint": endpoint})
        except AdmissionTimeout:
            pass  # closed for an update, or below the floor: queue (or refuse)
        committed = self.fleet.committed
        if committed < floor and self.config.stale is StaleMode.REFUSE:
            self.metrics.stale_refusals.inc()
            raise Refusal(409, f"committed generation {committed} is below the required "
                          f"minimum generation {floor}", code="stale_generation",
                          param="X-RolloutCore-Min-Generation",
                          extra={"committed_generation": committed, "min_generation": floor})
        with self._lock:
            if self._queued >= self.config.queue_depth:
                self.metrics.queue_rejections.labels("full").inc()
                raise Refusal(503, f"admissions are closed ({self._why(floor)}) and the "
                              f"queue is full ({self.config.queue_depth} waiting)",
                              type="server_error", code="queue_full",
                              retry_after=self.config.retry_after_s)
            self._queued += 1
            self.metrics.queue_depth.set(self._queued)
        return Queued(rollout_id, endpoint, floor, exclude, max_staleness)

    def admit_queued(self, q: Queued, cancel: threading.Event) -> Lease:
        """Wait in the queue place ``q`` (bounded by the configured wait; ``cancel`` ends
        it: the client left, or shutdown). Frees the place, whatever happens."""
        t0 = time.monotonic()
        outcome = "admitted"
        with self._lock:
            self._waiting.add(cancel)
            if self._closing:
                cancel.set()
        try:
            with self.fleet.journal.deferred():
                return self.fleet.admit(q.rollout_id, wait=self.config.queue_wait_s,
                                        min_generation=q.floor, cancel=cancel,
                                        max_staleness=q.max_staleness,
                                        exclude=q.exclude,
                                        detail={"via": "gateway", "endpoint": q.endpoint})
        except AdmissionTimeout:
            outcome = "timeout"
            self.metrics.queue_rejections.labels("timeout").inc()
            raise Refusal(503, f"admissions stayed closed ({self._why(q.floor)}) for "
                          f"{self.config.queue_wait_s:g} s", type="server_error",
                          code="queue_timeout", retry_after=self.config.retry_after_s
                          ) from None
        except AdmissionCancelled:
            outcome = "cancelled"
            why = "the gateway is shutting down" if self._closing else "cancelled"
            raise Refusal(503, f"{why} while the request was queued", type="server_error",
                          code="shutting_down" if self._closing else "cancelled",
                          retry_after=self.config.retry_after_s) from None
        finally:
            with self._lock:
                self._queued -= 1
                self._waiting.discard(cancel)
                self.metrics.queue_depth.set(self._queued)
            self.metrics.queue_wait.labels(outcome).observe(time.monotonic() - t0)

    def _why(self, floor: int) -> str:
        f = self.fleet
        if f.committed < floor:
            return f"committed generation {f.committed} is below {floor}"
        return f"the fleet is {f.phase}"

    def release(self, lease: Lease, detail: dict[str, Any] | None = None) -> Binding:
        """Release a lease. Not waited for in a file journal: the next flush anyone waits
        for covers it (an admission's, a step's), and lost in a crash it is conservative:
        recovery ends the rollouts in flight with the gateway's crash."""
        with self.fleet.journal.unawaited():
            return self.fleet.release(lease, detail)

    def _reap(self) -> None:
        """End idle episodes past their deadline (a tenth of it apart, at most 1 s)."""
        period = min(1.0, self.config.episode_idle_s / 10)
        while not self._reaper_stop.wait(period):
            try:
                self.episodes.expire_due()
            except Exception as e:  # the journal failed: said, and tried again next time
                log.error("ending idle episodes failed: %s: %s", type(e).__name__, e)

    # ------------------------------------------------------------------ migration

    def watch_drain(self, engine: str, signal: Callable[[], None]) -> int:
        """Call ``signal`` (from any thread; it must not block) when ``engine`` starts to
        drain for an update, or at once if it drains already. Returns the token to
        :meth:`unwatch_drain` with."""
        token = next(self._tokens)
        with self._lock:
            self._movable[token] = (engine, signal)
        if self.fleet.members[engine].controller.phase is Phase.DRAINING:
            signal()
        return token

    def unwatch_drain(self, token: int) -> None:
        with self._lock:
            self._movable.pop(token, None)

    def _draining(self, engine: str) -> None:
        with self._lock:
            signals = [sig for name, sig in self._movable.values() if name == engine]
        for sig in signals:
            sig()

    def migrate(self, lease: Lease) -> Lease | None:
        """Move a stream's rollout off its draining member (the fleet's ``migrate``): the
        new lease, durable; None when the spec allows no move now (nothing changed)."""
        try:
            with self.fleet.journal.deferred():
                moved = self.fleet.migrate(lease, {"via": "gateway"})
        except FleetError as e:
            self.metrics.migrations.labels("stayed").inc()
            log.info("%s stays on %s: %s", lease.rollout_id, lease.engine, e)
            return None
        self.metrics.migrations.labels("moved").inc()
        log.info("%s moved from %s to %s (generation %d)", lease.rollout_id, lease.engine,
                 moved.engine, moved.generation)
        return moved

    def set_floor(self, generation: int) -> None:
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"min_generation must be an integer >= 0, got {generation!r}")
        self.floor = generation
        log.info("fleet-wide minimum generation set to %d", generation)

    # ------------------------------------------------------------------- admin ops

    def _claim(self, what: str) -> None:
        with self._lock:
            if self._closing:
                raise Busy("the gateway is shutting down")
            if self._busy is not None:
                raise Busy(f"{self._busy} is running")
            self._busy = what

    def _free(self) -> None:
        with self._lock:
            self._busy = None

    def start_update(self, checkpoint: object, label: object, min_serving: object = None
                     ) -> Future[FleetCycleReport]:
        """Validate the target (raises ValueError: nothing changed), then run one fleet
        update on the admin worker; the gateway keeps serving meanwhile."""
        if not isinstance(label, str) or not label:
            raise ValueError("label must be a non-empty string")
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ValueError("checkpoint must be a non-empty path string")
        n = len(self.fleet.members)
        if min_serving is not None and (isinstance(min_serving, bool) or not isinstance(
                min_serving, int) or not 1 <= min_serving <= n):
            raise ValueError(f"min_serving must be an integer in 1..{n}")
        if min_serving is not None and self.fleet.rolling:
            raise ValueError("min_serving: a rolling fleet (max_live >= 2) keeps its quorum")
        self._claim(f"update to {label}")
        try:
            target = self.target_of(checkpoint, self.fleet.committed + 1, label)
        except BaseException:
            self._free()
            raise
        return self._admin.submit(self._update, target, min_serving)

    def start_update_to(self, target: WeightTarget) -> Future[FleetCycleReport]:
        """One fleet update (or roll) to a target described by the caller (a trainer
        publishing its live weights), on the admin worker like the admin API's."""
        if target.generation != self.fleet.committed + 1:
            raise ValueError(f"the target is generation {target.generation}, the next one "
                             f"is {self.fleet.committed + 1}")
        self._claim(f"update to {target.label}")
        return self._admin.submit(self._update, target, None)

    def _job(self, what: str, fn: Callable[[], T]) -> T:
        """Run admin job ``what`` on the admin worker (its slot claimed by the caller):
        whatever it raises is logged and kept for ``/admin/status`` (``last_error`` and
        ``failed_jobs``), even when nobody waits for its result (``wait: false``)."""
        try:
            out = fn()
        except FleetError as e:  # refused: nothing was changed
            self._failed(what, str(e))
            log.warning("%s refused: %s", what, e)
            raise
        except JournalError as e:  # deposed, or the store failed: the owner says it once
            self._failed(what, str(e))
            log.warning("%s stopped: %s", what, e)
            raise
        except Exception as e:  # a bug or an I/O error: never silent
            self._failed(what, f"{type(e).__name__}: {e}")
            log.exception("%s failed", what)
            raise
        finally:
            self._free()
        self.last_error = None
        return out

    def _failed(self, what: str, error: str) -> None:
        self.last_error = f"{what}: {error}"
        self.failed_jobs.append({"job": what, "error": error[:500], "at": time.time()})
        del self.failed_jobs[:-FAILED_JOBS_KEPT]
        self.metrics.admin_failures.labels(what.split(" ", 1)[0]).inc()

    def _update(self, target: WeightTarget, min_serving: int | None) -> FleetCycleReport:
        t0 = time.perf_counter()
        try:
            report = self._job(f"update to {target.label}", functools.partial(
                self.fleet.update, target, min_serving=min_serving))  # journalled with it
        except FleetError:
            self.metrics.cycle.labels("refused").observe(time.perf_counter() - t0)
            raise
        outcome = ("published" if report.published else "aborted" if report.aborted
                   else "not_published")
        self.metrics.cycle.labels(outcome).observe(report.total_s)
        for name in report.quarantined:
            self.metrics.quarantines.labels(name).inc()
        self.last_report = report
        log.info("update to %s (generation %d): %s on %s, quarantined %s, %.2f s",
                 target.label, target.generation, outcome, report.committed_on,
                 report.quarantined, report.total_s)
        return report

    def start_readmit(self, engine: str, who: str) -> Future[Outcome]:
        if engine not in self.fleet.members:
            raise KeyError(engine)
        self._claim(f"readmission of {engine}")
        return self._admin.submit(self._readmit, engine, who)

    def _readmit(self, engine: str, who: str) -> Outcome:
        out = self._job(f"readmission of {engine}",
                        functools.partial(self.fleet.readmit, engine, who=who))
        self.metrics.readmissions.labels(engine, out.trigger).inc()
        log.info("readmission of %s: %s (%s)", engine, out.trigger, out.reason)
        return out

    def start_audit(self, engines: object) -> Future[dict[str, Outcome]]:
        """Audit the named engines (None: every READY member) on the admin worker:
        label, identity, run state and a probe against the committed generation."""
        if engines is not None and (not isinstance(engines, list) or not engines or not all(
                isinstance(e, str) for e in engines)):
            raise ValueError("engines must be a non-empty list of engine names")
        unknown = sorted(set(engines or ()) - set(self.fleet.members))
        if unknown:
            raise KeyError(", ".join(unknown))
        self._claim("audit")
        return self._admin.submit(self._audit, engines)

    def _audit(self, engines: list[str] | None) -> dict[str, Outcome]:
        out = self._job("audit", functools.partial(self.fleet.audit, engines,
                                                   why="gateway admin API"))
        for name, o in out.items():
            self.metrics.audits.labels(name, o.trigger).inc()
            log.info("audit of %s: %s (%s)", name, o.trigger, o.reason)
        return out

    def report_engine_failure(self, lease: Lease, error: str, *, retried: bool) -> None:
        """The engine of ``lease`` could not be reached, or answered 5xx: suspect it (no
        admission until an audit passes; one starts at once)."""
        self.metrics.engine_failures.labels(lease.engine, str(retried).lower()).inc()
        if self.fleet.report_unreachable(lease, error):
            log.warning("%s suspected (%s): no admission until an audit passes",
                        lease.engine, error)

    # ---------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        f = self.fleet
        paused = self.metrics.paused_seconds()
        engines = []
        for s in f.status():
            row = s.as_json()
            row["paused_s"] = round(paused.get(s.name, 0.0), 3)
            engines.append(row)
        report = self.last_report
        out: dict[str, Any] = {
            "fleet": {"phase": f.phase, "committed": f.committed,
                      "min_serving": f.min_serving, "min_generation_floor": self.floor,
                      "floor": f.floor, "max_live": f.max_live,
                      "min_admitting": f.min_admitting},
            "engines": engines,
            "queue": {"depth": self._queued, "max_depth": self.config.queue_depth,
                      "max_wait_s": self.config.queue_wait_s, "stale": self.config.stale},
            "admin": {"running": self._busy, "last_error": self.last_error,
                      "failed_jobs": list(self.failed_jobs),
                      "last_cycle": report.as_json() if report else None},
            "episodes": self.episodes.status(),
            "journal": {"path": str(f.journal.path), "last_seq": f.journal.last_seq,
                        "group_commit": f.journal.group_commit,
                        "fsyncs": f.journal.fsyncs},
        }
        lead = getattr(f.store, "leadership", None)  # a fleet over the control store
        if lead is not None:
            out["role"] = "leader"
            out["leader"] = {"id": f.store.controller, "epoch": f.epoch,
                             "lease_s_left": round(lead.remaining_s(), 3)}
        return out

    # -------------------------------------------------------------------- shutdown

    def begin_shutdown(self) -> None:
        """Refuse new requests and admin operations; wake every queued request."""
        with self._lock:
            self._closing = True
            waiting = list(self._waiting)
        for ev in waiting:
            ev.set()

    def close(self) -> None:
        """After the server stopped: let a running admin operation finish (an update
        closed mid-way would leave the fleet to recovery), then close the fleet."""
        self.begin_shutdown()
        self._reaper_stop.set()
        self._reaper.join()
        self.episodes.close()
        self._admin.shutdown(wait=True)
        self.waits.shutdown(wait=True)
        self.quick.shutdown(wait=True)
        if self.records is not None:
            self.records.close()
        self.fleet.close()


__all__ = ["Busy", "Gateway", "GatewayConfig", "Queued", "Refusal", "StaleMode"]
