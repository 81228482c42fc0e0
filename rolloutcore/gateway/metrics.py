"""Prometheus metrics of the gateway and its fleet, in a registry of their own.

Counters and histograms are updated where things happen (requests, the queue, the
fleet's ``on_step`` hook, admin operations); the fleet's state (phases, serving,
generations, how long an engine has been paused) is read at scrape time by a collector,
so it is never stale.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rolloutcore.fleet import Fleet, Member
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            120.0, 300.0, 600.0)


def engine_paused(m: Member) -> bool:
    """May the member's engine be paused? From its controller: a pause not yet undone by
    a verified resume (the spec's ``resumed`` evidence), or fenced (TAINTED)."""
    c = m.controller.control
    if c.phase is Phase.UNINITIALIZED:
        return False
    return c.phase is Phase.TAINTED or "resumed" not in c.evidence


class GatewayMetrics:
    def __init__(self, fleet: Fleet, *, floor: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fleet = fleet
        self.clock = clock
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "rolloutcore_gateway_requests", "Requests answered, by endpoint, the generation "
            "they were bound to (none: refused before admission) and HTTP status",
            ["endpoint", "generation", "code"], registry=r)
        self.queue_depth = Gauge("rolloutcore_gateway_queue_depth",
                                 "Requests waiting for admissions to open", registry=r)
        self.queue_wait = Histogram(
            "rolloutcore_gateway_queue_wait_seconds", "Time requests spent in the queue, by "
            "how the wait ended (admitted, timeout, cancelled)", ["outcome"],
            buckets=_SECONDS, registry=r)
        self.queue_rejections = Counter(
            "rolloutcore_gateway_queue_rejections", "Requests refused with 503 by the queue "
            "(full, timeout)", ["reason"], registry=r)
        self.stale_refusals = Counter(
            "rolloutcore_gateway_stale_refusals", "Requests refused with 409: the committed "
            "generation was below their minimum generation", registry=r)
        self.client_disconnects = Counter(
            "rolloutcore_gateway_client_disconnects", "Clients gone before their answer "
            "ended (the engine request is aborted, then released)", registry=r)
        self.migrations = Counter(
            "rolloutcore_gateway_migrations", "Streams whose member drained for an update, "
            "by outcome (moved: continued on a member of the same generation; stayed: no "
            "such member, the drain waits for it)", ["outcome"], registry=r)
        self.records = Counter("rolloutcore_gateway_records", "Trajectory records, by "
                               "result (written, skipped)", ["result"], registry=r)
        self.cycle = Histogram(
            "rolloutcore_update_cycle_duration_seconds", "Fleet update cycles, by outcome "
            "(published, aborted, not_published, refused)", ["outcome"], buckets=_SECONDS,
            registry=r)
        self.drain = Histogram("rolloutcore_drain_wait_seconds", "Time an update waited for "
                               "an engine's bound rollouts to finish", ["engine"],
                               buckets=_SECONDS, registry=r)
        self.steps = Histogram("rolloutcore_step_duration_seconds", "Lifecycle steps, by "
                               "engine, step and outcome", ["engine", "step", "outcome"],
                               buckets=_SECONDS, registry=r)
        self.quarantines = Counter("rolloutcore_quarantines", "Engines quarantined (TAINTED) "
                                   "by an update", ["engine"], registry=r)
        self.readmissions = Counter("rolloutcore_readmissions", "Re-admissions, by engine and "
                                    "outcome", ["engine", "outcome"], registry=r)
        self.engine_failures = Counter(
            "rolloutcore_gateway_engine_failures", "Requests whose engine could not be reached "
            "or answered 5xx (the member is suspected: no admission until an audit passes), "
            "by engine and whether the request was retried on another member",
            ["engine", "retried"], registry=r)
        self.audits = Counter("rolloutcore_audits", "Audits asked through the admin API, by "
                              "engine and outcome", ["engine", "outcome"], registry=r)
        self.admin_failures = Counter(
            "rolloutcore_gateway_admin_failures", "Admin jobs (update, readmission, audit) "
            "that were refused or failed, waited for or not", ["job"], registry=r)
        self._paused_since: dict[str, float] = {}
        self._lock = threading.Lock()
        r.register(_FleetCollector(self, floor))
        previous = fleet.on_step

        def on_step(member: str, step: str, outcome: str, seconds: float) -> None:
            self.on_step(member, step, outcome, seconds)
            if previous is not None:
                previous(member, step, outcome, seconds)

        fleet.on_step = on_step

    def on_step(self, member: str, step: str, outcome: str, seconds: float) -> None:
        outcome = outcome.split(" ", 1)[0]  # "aborted 3" -> "aborted"
        self.steps.labels(member, step, outcome).observe(seconds)
        if step == "drain":
            self.drain.labels(member).observe(seconds)
        self.paused_seconds()  # a pause or resume just happened: note when

    def paused_seconds(self) -> dict[str, float]:
        """Per engine, how long it has been (possibly) paused; 0 when it runs."""
        now = self.clock()
        out: dict[str, float] = {}
        with self._lock:
            for name, m in self.fleet.members.items():
                if engine_paused(m):
                    out[name] = now - self._paused_since.setdefault(name, now)
                else:
                    self._paused_since.pop(name, None)
                    out[name] = 0.0
        return out

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _FleetCollector(Collector):
    """The fleet's state at scrape time."""

    def __init__(self, metrics: GatewayMetrics, floor: Callable[[], int]) -> None:
        self.metrics = metrics
        self.floor = floor

    def collect(self) -> Iterator[Any]:
        fleet = self.metrics.fleet
        paused = self.metrics.paused_seconds()
        phase = GaugeMetricFamily("rolloutcore_engine_phase", "1 for the lifecycle phase each "
                                  "engine's controller is in", labels=["engine", "phase"])
        serving = GaugeMetricFamily("rolloutcore_engine_serving", "1 if the engine serves the "
                                    "committed generation (admissions go to it)",
                                    labels=["engine"])
        quarantined = GaugeMetricFamily("rolloutcore_engine_quarantined", "1 if the engine is "
                                        "TAINTED (quarantined until re-admitted)",
                                        labels=["engine"])
        generation = GaugeMetricFamily("rolloutcore_engine_generation", "The engine's "
                                       "committed generation", labels=["engine"])
        outstanding = GaugeMetricFamily("rolloutcore_engine_outstanding_rollouts", "Rollouts "
                                        "bound to the engine", labels=["engine"])
        paused_s = GaugeMetricFamily("rolloutcore_engine_paused_seconds", "How long the "
                                     "engine has been paused (0: running); alert on an "
                                     "engine left paused", labels=["engine"])
        for s in fleet.status():
            for p in Phase:
                phase.add_metric([s.name, p.value], 1.0 if s.phase == p.value else 0.0)
            serving.add_metric([s.name], float(s.serving))
            quarantined.add_metric([s.name], float(s.quarantined))
            generation.add_metric([s.name], float(s.committed))
            outstanding.add_metric([s.name], float(s.outstanding))
            paused_s.add_metric([s.name], paused.get(s.name, 0.0))
        yield from (phase, serving, quarantined, generation, outstanding, paused_s)
        fphase = GaugeMetricFamily("rolloutcore_fleet_phase", "1 for the fleet's phase",
                                   labels=["phase"])
        for name in ("UNINITIALIZED", FleetPhase.READY, FleetPhase.UPDATING,
                     FleetPhase.ABORTING):
            fphase.add_metric([name], 1.0 if fleet.phase == name else 0.0)
        yield fphase
        yield GaugeMetricFamily("rolloutcore_committed_generation", "The fleet's committed "
                                "generation", value=float(fleet.committed))
        yield GaugeMetricFamily("rolloutcore_min_generation_floor", "The fleet-wide minimum "
                                "generation set through the admin API", value=float(self.floor()))


__all__ = ["GatewayMetrics", "engine_paused"]
