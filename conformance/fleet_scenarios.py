"""Fleet scenarios: one transactional update across three engines, quarantine, verified
re-admission. Each runs unchanged on three real vLLM servers and on a simulated fleet;
the members' step sequences (from the one fleet journal) must be identical, the journal
must pass the fleet trace checker, and every rollout's tokens must equal the reference
of the generation it was bound to.

The rig's servers run the gloo weight-transfer worker extension (a superset of the
RolloutCore one), so the same three servers serve the reload path (every engine loads
the checkpoint from its own path) and the transfer path (this process broadcasts to each
engine through vLLM's trainer-side API).
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rolloutcore.adapters.contract import LifecycleAdapter, PauseMode, WeightTarget
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.conformance.engines import HarnessEngine, SimHarnessEngine
from rolloutcore.conformance.harness import Check, wait_until
from rolloutcore.engine.controller import IllegalTransition
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.fleet import Fleet, FleetCycleReport, FleetError, Lease
from rolloutcore.journal import JournalReader
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Trigger

NAMES = ("a", "b", "c")
VERSION = {1: "v1", 2: "v2"}  # generation -> checkpoint
#: The transfer scenario's deadlines: the transfer's own, and the runner's mutation
#: deadline just above it (the adapter's evidence is what the runner sees).
TRANSFER_BASE_S = 5.0
TAINT_MARGIN_S = 1.0
#: The frozen-member scenario's deadlines (a frozen engine answers nothing: each of its
#: steps ends at its deadline).
FROZEN_MUTATION_S = 3.0
FROZEN_FENCE_S = 8.0  # long beside the others' cycles: the order below has a margin


# --------------------------------------------------------------------------- the rig


class FleetRig:
    """Three engines of one kind, the fleets built over them, their restarts."""

    def __init__(self, engines: Mapping[str, HarnessEngine], work: Path) -> None:
        if len(engines) < 2:
            raise ValueError("a fleet rig needs at least two engines")
        self.engines = dict(engines)
        self.work = work
        self.kind = next(iter(self.engines.values())).kind
        self.names = list(self.engines)
        self.victim = self.names[-1]  # the member the fault scenarios break
        self.others = self.names[:-1]

    @staticmethod
    def member_names(n: int) -> tuple[str, ...]:
        return NAMES if n == len(NAMES) else tuple(f"e{i}" for i in range(n))

    @classmethod
    def sim(cls, work: Path, n: int = 3) -> FleetRig:
        return cls({name: SimHarnessEngine() for name in cls.member_names(n)}, work)

    @classmethod
    def vllm(cls, models: Mapping[str, Path], work: Path, n: int = 3, *,
             pool: Any = None) -> FleetRig:
        """``n`` servers started in parallel, with the gloo transfer extension, or leased
        from ``pool`` (a :class:`~rolloutcore.conformance.fixtures.server_pool.ServerPool`)."""
        from rolloutcore.conformance.engines import VllmHarnessEngine
        from rolloutcore.conformance.transfer_scenarios import GLOO

        if n < 2:  # before anything is leased or started: a raise leaks nothing
            raise ValueError("a fleet rig needs at least two engines")
        names = cls.member_names(n)
        if pool is not None:
            servers = pool.lease(n)
            try:
                return cls({name: VllmHarnessEngine(srv, models, work_dir=work / name,
                                                    release=pool.release)
                            for name, srv in zip(names, servers, strict=True)}, work)
            except BaseException:
                for srv in servers:
                    pool.release(srv)
                raise
        with ThreadPoolExecutor(n) as pool:
            futures = {name: pool.submit(VllmHarnessEngine.start, models, work / name,
                                         server_args=GLOO.server_args()) for name in names}
            engines: dict[str, HarnessEngine] = {}
            try:
                for name, f in futures.items():
                    engines[name] = f.result()
            except BaseException:
                for e in engines.values():
                    e.close()
                raise
        return cls(engines, work)

    def close(self) -> None:
        for e in self.engines.values():
            e.close()

    def restore(self) -> None:
        """Every engine back to v1, startup label, running (between scenarios)."""
        for e in self.engines.values():
            if not e.alive():
                e.restart_process("v1")
            e.restore()
            e.disarm()

    def urls(self) -> dict[str, str | None]:
        return {n: getattr(getattr(e, "server", None), "url", None)
                for n, e in self.engines.items()}

    def targets(self, generation: int) -> dict[str, WeightTarget]:
        return {n: (e.initial_target() if generation == 1 else
                    e.target(generation, VERSION[generation]))
                for n, e in self.engines.items()}

    def adapters(self) -> dict[str, LifecycleAdapter]:
        return {n: e.adapter for n, e in self.engines.items()}

    def target_of(self, source: str, generation: int, label: str) -> WeightTarget:
        """What a recovering fleet needs: the target a journal's checkpoint names."""
        e = next(iter(self.engines.values()))
        models: Mapping[str, Path] = getattr(e, "models", {})
        version = next((v for v, p in models.items() if str(p) == source), source)
        return e.target(generation, version, label=label)

    def transfer_adapters(self) -> dict[str, LifecycleAdapter]:
        """Each member's mutation a weight transfer from this process (vLLM: gloo; the
        simulator has no transfer: its reload stands in, faults injected the same way)."""
        if self.kind == "sim":
            return self.adapters()
        from rolloutcore.adapters.weight_transfer import TransferAdapter, TransferPolicy

        out: dict[str, LifecycleAdapter] = {}
        for n, e in self.engines.items():
            http = e.http  # type: ignore[attr-defined]
            out[n] = TransferAdapter(http, base_url=e.server.url,  # type: ignore[attr-defined]
                                     policy=TransferPolicy(base_s=TRANSFER_BASE_S),
                                     http_timeout_s=120.0)
        return out

    def open(self, name: str, *, min_serving: int, policy: RunnerPolicy | None = None,
             adapters: Mapping[str, LifecycleAdapter] | None = None,
             recover: bool = False, max_live: int = 1, min_admitting: int = 0) -> Fleet:
        """A fleet over the rig's engines on journal ``<name>-<kind>.jsonl``: a new one,
        or with ``recover`` the one there (a restarted fleet controller)."""
        ads = adapters or self.adapters()
        journal = self.work / f"{name}-{self.kind}.jsonl"
        if not recover:
            journal.unlink(missing_ok=True)
        urls = self.urls()
        members = [(n, ads[n], urls[n]) for n in self.engines]
        return Fleet(members, journal=journal, min_serving=min_serving,
                     policy=policy or POLICY, fsync=False, target_of=self.target_of,
                     max_live=max_live, min_admitting=min_admitting)


#: Deadlines generous enough never to decide an outcome (faults decide them).
POLICY = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=120.0, drain_timeout_s=300.0,
                      mutation_base_s=120.0)


# -------------------------------------------------------------------------- results


@dataclass
class FleetResult:
    name: str
    kind: str
    checks: list[Check] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    member_steps: dict[str, list[str]] = field(default_factory=dict)
    journal: str | None = None
    trace: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def failures(self) -> list[str]:
        out = [f"{c.description}: observed {c.observed!r}" for c in self.checks if not c.ok]
        return out + ([f"error: {self.error}"] if self.error else [])

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.kind, "passed": self.passed,
                "checks": [c.as_json() for c in self.checks], "evidence": self.evidence,
                "member_steps": self.member_steps, "journal": self.journal,
                "trace": self.trace, "error": self.error, "seconds": round(self.seconds, 2)}


class FleetContext:
    def __init__(self, rig: FleetRig, result: FleetResult,
                 say: Callable[[str], None] | None = None) -> None:
        self.rig = rig
        self.result = result
        self.fleet: Fleet | None = None
        self.say = say

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.result.checks.append(Check(description, bool(ok), observed))
        if self.say is not None:
            self.say(f"  [{'ok' if ok else 'FAIL'}] {description}"
                     + ("" if ok or observed is None else f": {observed!r}"[:400]))
        return bool(ok)

    def open(self, *, min_serving: int, policy: RunnerPolicy | None = None,
             adapters: Mapping[str, LifecycleAdapter] | None = None, name: str | None = None,
             recover: bool = False, max_live: int = 1, min_admitting: int = 0) -> Fleet:
        self.fleet = self.rig.open(name or self.result.name, min_serving=min_serving,
                                   policy=policy, adapters=adapters, recover=recover,
                                   max_live=max_live, min_admitting=min_admitting)
        self.result.journal = str(self.fleet.journal.path)
        return self.fleet

    def bootstrap(self, fleet: Fleet) -> None:
        out = fleet.bootstrap(self.rig.targets(1))
        self.check("every member bootstraps on v1 and the fleet opens",
                   all(o.trigger == Trigger.BOOTSTRAP_OK for o in out.values())
                   and fleet.phase == FleetPhase.READY,
                   {n: o.trigger for n, o in out.items()})

    def _generate(self, fleet: Fleet, lease: Lease) -> tuple[Lease, bool]:
        """Generate on the lease's engine (directly: the rollout's own client), release;
        whether the tokens are the bound generation's reference."""
        e = self.rig.engines[lease.engine]
        try:
            out = e.raw_generate(e.prompt("rollout"), e.rollout_tokens)
        finally:
            fleet.release(lease)
        return lease, out.tokens == e.reference(VERSION[lease.generation], "rollout")

    def rollout(self, fleet: Fleet, rid: str) -> tuple[Lease, bool]:
        return self._generate(fleet, fleet.admit(rid, wait=60.0))

    def spread(self, fleet: Fleet, prefix: str, n: int) -> list[tuple[Lease, bool]]:
        """``n`` rollouts admitted together (least loaded first), generated in parallel."""
        leases = [fleet.admit(f"{prefix}-{i}", wait=60.0) for i in range(n)]
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda lease: self._generate(fleet, lease), leases))

    def members_serve(self, fleet: Fleet, names: list[str], generation: int) -> None:
        want = self.rig.targets(generation)
        seen = {}
        for n in names:
            e = self.rig.engines[n]
            seen[n] = {"label": e.label(), "identity_ok": e.identity() == want[n].identity,
                       "paused": e.is_paused_raw(),
                       "phase": fleet.members[n].controller.phase.value,
                       "committed": fleet.members[n].controller.control.committed}
        self.check(f"{', '.join(names)} serve generation {generation}: READY, label, "
                   "identity, running", all(
                       s["label"] == want[n].label and s["identity_ok"] and not s["paused"]
                       and s["phase"] == Phase.READY.value and s["committed"] == generation
                       for n, s in seen.items()), seen)

    def report(self, key: str, rep: FleetCycleReport) -> None:
        self.result.evidence[key] = {
            "published": rep.published, "aborted": rep.aborted,
            "committed_on": rep.committed_on, "quarantined": rep.quarantined,
            "rolled_back": rep.rolled_back, "phase": rep.phase,
            "total_s": round(rep.total_s, 3),
            "members": {n: [f"{s.step}:{s.outcome}" for s in r.steps]
                        for n, r in rep.members.items()}}


Scenario = Callable[[FleetContext], None]


# -------------------------------------------------------------------------- scenarios


def _seen(leases: list[tuple[Lease, bool]]) -> list[tuple[str, int, bool]]:
    return [(lease.engine, lease.generation, ok) for lease, ok in leases]


def _all_on(leases: list[tuple[Lease, bool]], generation: int) -> bool:
    """Every rollout bound to ``generation``, with that generation's tokens."""
    return all(lease.generation == generation and ok for lease, ok in leases)


def s_clean_update_live(ctx: FleetContext) -> None:
    """Live rollouts on every server while the fleet updates: the drain holds, each
    finishes on v1 bound to generation 1; after the publish every server serves v2.

    The rollouts outlast the update's request by a cause the scenario controls, not by
    how fast the machine generates: every engine is paused in ``keep`` mode (outside the
    fleet) before the rollouts are sent, so each request waits in its engine; the update
    is requested, and only once every member drains are the engines resumed."""
    names = ctx.rig.names
    engines = ctx.rig.engines
    fleet = ctx.open(min_serving=len(names))
    ctx.bootstrap(fleet)
    for e in engines.values():
        e.pause_raw(PauseMode.KEEP)
    with ThreadPoolExecutor(2 * len(names)) as pool:
        futs = [pool.submit(ctx.rollout, fleet, f"live-{i}") for i in range(len(names))]
        # A paused engine schedules nothing: no rollout can end before the resume below.
        ctx.check("a rollout is admitted on every server when the update is requested",
                  wait_until(lambda: all(m.outstanding == 1 for m in fleet.members.values()),
                             60.0) and not any(f.done() for f in futs),
                  {n: m.outstanding for n, m in fleet.members.items()})
        update = pool.submit(fleet.update, ctx.rig.targets(2))
        try:
            draining = wait_until(lambda: all(m.controller.phase is Phase.DRAINING
                                              for m in fleet.members.values()), 60.0)
            ctx.check("the update waits for the rollouts: every member drains, nothing done "
                      "yet", draining and not any(f.done() for f in futs),
                      {n: m.controller.phase.value for n, m in fleet.members.items()})
        finally:  # whatever happened, nothing may stay held (the pool joins on it)
            for e in engines.values():
                e.resume_raw()
        rep = update.result()
        live = [f.result() for f in futs]
    ctx.report("update", rep)
    ctx.check("published on every member at once", rep.published and
              sorted(rep.committed_on) == sorted(names), rep.committed_on)
    ctx.check("every live rollout: bound to generation 1, one per server, v1's tokens",
              _all_on(live, 1) and {lease.engine for lease, _ in live} == set(names),
              _seen(live))
    after = ctx.spread(fleet, "after", len(names))
    ctx.check("rollouts after the publish: generation 2 on every server, v2's tokens",
              _all_on(after, 2) and {lease.engine for lease, _ in after} == set(names),
              _seen(after))
    ctx.members_serve(fleet, names, 2)


def _on_generation(m: Any, generation: int) -> bool:
    return bool(m.controller.control.committed == generation)


def _draining(fleet: Fleet) -> str | None:
    return next((n for n, m in fleet.members.items()
                 if m.controller.phase is Phase.DRAINING), None)


def s_rolling_update_migrated(ctx: FleetContext) -> None:
    """A rolling update (max_live 2, min_admitting 2) under held rollouts: admissions never
    close; the wave member's rollout, half generated, moves to a member on generation 1
    and ends there with exactly the greedy tokens of an unmigrated v1 rollout; the members
    left behind catch up one at a time, moving their rollouts while another member serves
    generation 1; the floor rises; no strict update step is ever taken.

    The rollouts outlast each drain by a cause the scenario controls: it holds their
    leases, and moves or releases them only once their member drains."""
    names = ctx.rig.names
    engines = ctx.rig.engines
    fleet = ctx.open(min_serving=2, max_live=2, min_admitting=2)
    ctx.bootstrap(fleet)
    held = {lease.engine: lease for lease in (fleet.admit(f"held-{i}") for i in range(3))}
    ctx.check("a held rollout on every member", sorted(held) == sorted(names), sorted(held))
    with ThreadPoolExecutor(1) as pool:
        rolling = pool.submit(fleet.update, ctx.rig.targets(2))
        try:
            ctx.check("the wave drains one member while the fleet rolls",
                      wait_until(lambda: _draining(fleet) is not None, 60.0)
                      and fleet.phase == FleetPhase.ROLLING, fleet.phase)
            wave = str(_draining(fleet))
            during = fleet.admit("during-wave")
            e_during = engines[during.engine]
            out = e_during.raw_generate(e_during.prompt("rollout"), e_during.rollout_tokens)
            fleet.release(during)
            ctx.check("admissions stay open during the wave: generation 1 elsewhere, v1's "
                      "tokens", during.engine != wave and during.generation == 1
                      and out.tokens == e_during.reference("v1", "rollout"),
                      (during.engine, during.generation))
            # The straggler: half its tokens on the wave member, the rest where it moves.
            src, lease = engines[wave], held.pop(wave)
            prompt, n = src.prompt("rollout"), src.rollout_tokens
            first = src.raw_generate(prompt, n // 2).tokens
            moved = fleet.migrate(lease)
            dst = engines[moved.engine]
            rest = dst.raw_generate((*prompt, *first), n - len(first)).tokens
            segments = [(wave, lease.generation, 0, len(first)),
                        (moved.engine, moved.generation, len(first), n)]
            ctx.result.evidence["segments"] = segments
            ctx.check("the migrated rollout: both segments on generation 1, its tokens the "
                      "greedy v1 reference", moved.generation == lease.generation == 1
                      and moved.engine != wave
                      and (*first, *rest) == src.reference("v1", "rollout"), segments)
            leases = [moved, *held.values()]
            ctx.check("the wave publishes on its member; the floor stays",
                      wait_until(lambda: fleet.committed == 2, 120.0) and fleet.floor == 1,
                      (fleet.committed, fleet.floor))
            newest = fleet.admit("newest")
            e_new = engines[newest.engine]
            out = e_new.raw_generate(e_new.prompt("rollout"), e_new.rollout_tokens)
            fleet.release(newest)
            ctx.check("new rollouts go to the frontier: generation 2 on the wave member, "
                      "v2's tokens", newest.engine == wave and newest.generation == 2
                      and out.tokens == e_new.reference("v2", "rollout"),
                      (newest.engine, newest.generation))
            moves = 1
            for _ in range(len(names) - 1):  # each member left behind, one at a time
                if not wait_until(lambda: _draining(fleet) is not None, 120.0):
                    break
                behind = str(_draining(fleet))
                mine = [x for x in leases if x.engine == behind]
                leases = [x for x in leases if x.engine != behind]
                for x in mine:
                    try:
                        leases.append(fleet.migrate(x))
                        moves += 1
                    except FleetError:  # no other member serves generation 1: let it end
                        fleet.release(x)
                wait_until(functools.partial(_on_generation, fleet.members[behind], 2), 120.0)
        finally:
            for x in list(held.values()):
                if x.rollout_id in fleet.members[x.engine].controller.bindings:
                    fleet.release(x)
        rep = rolling.result()
    for x in leases:
        if x.rollout_id in fleet.members[x.engine].controller.bindings:
            fleet.release(x)
    ctx.report("roll", rep)
    ctx.result.evidence["waves"] = rep.waves
    ctx.check("the rolling update publishes everywhere, wave by wave, and the floor rises",
              rep.published and len(rep.waves) == len(names) and fleet.committed == 2
              and fleet.floor == 2 and fleet.phase == FleetPhase.READY,
              (rep.waves, fleet.committed, fleet.floor, fleet.phase))
    steps = member_steps(Path(str(ctx.result.journal))).get("fleet", [])
    ctx.check("admissions never closed: no strict update, close or abort; the moves are "
              "journalled", not {"fleet_request_update", "fleet_close", "fleet_abort"}
              & set(steps) and steps.count("migrate") == moves >= 2, steps)
    ctx.members_serve(fleet, names, 2)


def _admits_while_preparing(journal: Path) -> list[tuple[str, int]]:
    """(member, seq) of every admission to a member that was not READY just before it
    (draining, preparing, quarantined): the journal's own word that no rollout joined a
    member that had left service."""
    phase: dict[str, str] = {}
    bad = []
    for _, rec in JournalReader(journal):
        member = rec.get("engine")
        if not isinstance(member, str):
            continue
        if rec.get("step") == "admit" and phase.get(member) != Phase.READY.value:
            bad.append((member, int(rec["seq"])))
        phase[member] = str(rec.get("phase"))
    return bad


class _Load:
    """Steady load: one rollout after another, admitted without waiting (a refusal is a
    closed admission, counted), generated on its member, released; each noted with
    whether its tokens are its generation's reference."""

    def __init__(self, ctx: FleetContext, fleet: Fleet) -> None:
        self.ctx, self.fleet = ctx, fleet
        self.done: list[tuple[str, int, bool]] = []
        self.refused = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)

    def __enter__(self) -> _Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120.0)

    def _run(self) -> None:
        from rolloutcore.engine.controller import AdmissionTimeout

        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                lease = self.fleet.admit(f"load-{i}")
            except AdmissionTimeout:
                self.refused += 1
                continue
            e = self.ctx.rig.engines[lease.engine]
            try:
                out = e.raw_generate(e.prompt("probe"), e.probe_tokens)
            finally:
                self.fleet.release(lease)
            self.done.append((lease.engine, lease.generation,
                              out.tokens == e.reference(VERSION[lease.generation], "probe")))

    def wait_for(self, more: int) -> bool:
        """Wait until ``more`` further rollouts have ended."""
        want = len(self.done) + more
        return wait_until(lambda: len(self.done) >= want, 120.0)


def s_rolling_steady_load(ctx: FleetContext) -> None:
    """A rolling update (max_live 2, min_admitting 2) under steady load: rollout after
    rollout is admitted without ever waiting, none on a member that is preparing, each
    with its generation's greedy tokens; generation 2 is served while the others still
    serve 1; the floor rises once every member caught up.

    Each member's drain lasts as long as the scenario holds a rollout of its own there,
    released only once the load has run three more rollouts during that drain."""
    names = ctx.rig.names
    fleet = ctx.open(min_serving=2, max_live=2, min_admitting=2)
    ctx.bootstrap(fleet)
    held = {lease.engine: lease for lease in (fleet.admit(f"held-{i}") for i in range(3))}
    ctx.check("a held rollout on every member", sorted(held) == sorted(names), sorted(held))
    with _Load(ctx, fleet) as load, ThreadPoolExecutor(1) as pool:
        rolling = pool.submit(fleet.update, ctx.rig.targets(2))
        during: list[tuple[str, int, bool]] = []
        try:
            for _ in names:  # the wave, then each member left behind
                if not wait_until(lambda: _draining(fleet) is not None, 120.0):
                    break
                member = str(_draining(fleet))
                start = len(load.done)
                load.wait_for(3)
                during += load.done[start:]
                fleet.release(held.pop(member))
                wait_until(functools.partial(_on_generation, fleet.members[member], 2),
                           120.0)
        finally:
            for x in held.values():
                fleet.release(x)
        rep = rolling.result()
        load.wait_for(3)
    ctx.report("roll", rep)
    ctx.check("the rolling update publishes everywhere, wave by wave, and the floor rises",
              rep.published and len(rep.waves) == len(names) and fleet.committed == 2
              and fleet.floor == 2 and fleet.phase == FleetPhase.READY,
              (rep.waves, fleet.committed, fleet.floor, fleet.phase))
    ctx.result.evidence["load"] = {"rollouts": len(load.done), "refused": load.refused,
                                   "during_drains": len(during)}
    ctx.check("admissions never closed: no rollout of the load was refused",
              load.refused == 0 and len(load.done) >= 3 * len(names) + 3, load.refused)
    ctx.check("every rollout of the load has its generation's greedy tokens",
              all(ok for _e, _g, ok in load.done),
              [x for x in load.done if not x[2]][:5])
    ctx.check("during the drains generation 2 is served beside generation 1",
              {g for _e, g, _ok in during} == {1, 2}, sorted({(e, g) for e, g, _ in during}))
    bad = _admits_while_preparing(Path(str(ctx.result.journal)))
    ctx.check("the journal: no admission to a member between its request_update and its "
              "publish", not bad, bad)
    steps = member_steps(Path(str(ctx.result.journal))).get("fleet", [])
    ctx.check("no strict update, close or abort: admissions stayed open",
              not {"fleet_request_update", "fleet_close", "fleet_abort"} & set(steps), steps)
    ctx.members_serve(fleet, names, 2)


def s_rolling_wave_fails_validation(ctx: FleetContext) -> None:
    """A rolling update whose wave member loads other weights than its target declares
    (the target names v2's identity; the mutation installs v1 and reports success):
    validation catches it, the member is quarantined, nothing is published, the fleet
    stays on one live generation, no rollout is admitted to it, and verified
    re-admission brings it back onto generation 1."""
    names = ctx.rig.names
    fleet = ctx.open(min_serving=2, max_live=2, min_admitting=2)
    ctx.bootstrap(fleet)
    # The wave is the least loaded member: a rollout held on each of the others makes it
    # the first, whatever the load holds at that moment.
    held = [fleet.admit(f"held-{n}", exclude=names[:1]) for n in names[1:]]
    ctx.check("a held rollout on every member but the first",
              sorted(x.engine for x in held) == sorted(names[1:]), [x.engine for x in held])
    targets = {n: ctx.rig.engines[n].arm_wrong_checkpoint(t, "v1")
               for n, t in ctx.rig.targets(2).items()}
    with _Load(ctx, fleet) as load:
        try:
            rep = fleet.update(targets)
        finally:
            for e in ctx.rig.engines.values():
                e.disarm()
            for x in held:
                fleet.release(x)
        load.wait_for(3)
    ctx.report("roll", rep)
    ctx.check("the wave's one member, quarantined; nothing published; one live generation",
              not rep.published and rep.quarantined == [names[0]] and rep.waves == [
                  rep.quarantined] and fleet.committed == 1 and fleet.floor == 1
              and fleet.phase == FleetPhase.READY,
              (rep.waves, rep.quarantined, fleet.committed, fleet.floor, fleet.phase))
    bad_member = rep.quarantined[0] if rep.quarantined else names[0]
    steps = [f"{s.step}:{s.outcome}" for s in rep.members[bad_member].steps] \
        if bad_member in rep.members else []
    ctx.check(f"{bad_member}: its validation found other weights than the target's",
              any(x.startswith("validate:") and not x.endswith(str(Trigger.VALIDATE_OK))
                  for x in steps), steps)
    ctx.check(f"the load: never refused, generation 1's tokens, none on {bad_member} once "
              "it left service", load.refused == 0 and all(ok for *_x, ok in load.done)
              and {g for _e, g, _ok in load.done} == {1}, ctx.result.evidence.setdefault(
                  "load", {"rollouts": len(load.done), "refused": load.refused}))
    bad = _admits_while_preparing(Path(str(ctx.result.journal)))
    ctx.check("the journal: no admission to a member between its request_update and its "
              "re-admission", not bad, bad)
    out = fleet.readmit(bad_member, who="operator")
    ctx.check(f"{bad_member} re-admitted onto generation 1, verified",
              out.trigger == Trigger.READMIT_OK, out.trigger)
    ctx.members_serve(fleet, names, 1)
    after = ctx.spread(fleet, "after", len(names))
    ctx.check("rollouts: generation 1 on every member, v1's tokens",
              _all_on(after, 1) and {lease.engine for lease, _ in after} == set(names),
              _seen(after))


def s_one_refuses(ctx: FleetContext) -> None:
    """The last member refuses the load (min_serving: all): the fleet aborts; the others,
    which validated v2, are rolled back to v1 by verified re-admission; everything
    serves v1 again."""
    rig, v = ctx.rig, ctx.rig.victim
    fleet, rep = _update_with_victim(ctx, len(rig.names), rig.engines[v].arm_refused_mutation)
    ctx.check("not published: the fleet aborted and reopened on generation 1",
              rep.aborted and not rep.published and fleet.phase == FleetPhase.READY
              and fleet.committed == 1, {"phase": fleet.phase, "committed": fleet.committed})
    steps = [f"{s.step}:{s.outcome}" for s in rep.members[v].steps]
    ctx.check(f"{v}'s load was refused with proof of no effect; it resumed v1",
              f"mutate:{Trigger.MUTATE_REFUSED}" in steps
              and steps[-1] == f"resume:{Trigger.RESUME_OK}", steps)
    ctx.check(f"{', '.join(rig.others)} re-admitted onto generation 1, verified",
              rep.rolled_back == dict.fromkeys(rig.others, Trigger.READMIT_OK),
              rep.rolled_back)
    ctx.members_serve(fleet, rig.names, 1)
    after = ctx.spread(fleet, "after", len(rig.names))
    ctx.check("rollouts: generation 1, v1's tokens", _all_on(after, 1), _seen(after))


def _update_with_victim(ctx: FleetContext, min_serving: int,
                        arm: Callable[[WeightTarget], WeightTarget]) -> tuple[
                            Fleet, FleetCycleReport]:
    """Bootstrap a fleet and update it to v2, the victim's target armed by ``arm``."""
    rig, v = ctx.rig, ctx.rig.victim
    fleet = ctx.open(min_serving=min_serving)
    ctx.bootstrap(fleet)
    targets = rig.targets(2)
    targets[v] = arm(targets[v])
    rep = fleet.update(targets)
    rig.engines[v].disarm()
    ctx.report("update", rep)
    return fleet, rep


def _dies_halfway(ctx: FleetContext, min_serving: int) -> tuple[Fleet, FleetCycleReport]:
    rig, v = ctx.rig, ctx.rig.victim
    fleet, rep = _update_with_victim(ctx, min_serving, rig.engines[v].arm_failing_mutation)
    c = rep.members[v]
    ctx.check(f"{v}'s load died halfway: ambiguous, quarantined (TAINTED), fenced",
              v in rep.quarantined and c.final_phase is Phase.TAINTED and bool(c.fenced)
              and any(s.outcome == Trigger.MUTATE_AMBIGUOUS for s in c.steps),
              {"quarantined": rep.quarantined, "fenced": c.fenced})
    e = rig.engines[v]
    label, paused = e.label(), e.is_paused_raw()
    ctx.check(f"{v}'s engine is paused under the taint label", paused and bool(label)
              and str(label).startswith("tainted:"), {"label": label, "paused": paused})
    return fleet, rep


def _restart_and_readmit(ctx: FleetContext, fleet: Fleet, generation: int) -> None:
    """The operator restarts the quarantined server (a new process on v1) and asks for
    its re-admission: label, identity and probe verified, then catch-up if the fleet
    moved on meanwhile."""
    v = ctx.rig.victim
    e = ctx.rig.engines[v]
    pid = e.pid()
    e.restart_process("v1")
    ctx.check(f"{v}'s server is a new process on v1", e.alive() and (
        e.kind == "sim" or e.pid() != pid), {"pid_before": pid, "pid_after": e.pid()})
    out = fleet.readmit(v, who=f"operator: after restarting {v}")
    ctx.result.evidence[f"readmit_{v}"] = out.trigger
    ctx.check(f"{v} re-admitted (verified) and serving generation {generation}",
              out.trigger == Trigger.READMIT_OK and
              fleet.members[v].controller.control.committed == generation, out.reason)


def _victim_serves_again(ctx: FleetContext, fleet: Fleet, generation: int) -> None:
    """After its re-admission every member serves ``generation``, the victim included:
    it takes rollouts again, with that generation's tokens."""
    rig, v = ctx.rig, ctx.rig.victim
    ctx.members_serve(fleet, rig.names, generation)
    after = ctx.spread(fleet, "after", len(rig.names))
    ctx.check(f"after re-admission {v} takes rollouts: generation {generation}, "
              f"v{generation}'s tokens", _all_on(after, generation)
              and any(lease.engine == v for lease, _ in after), _seen(after))


def s_dies_halfway_quorum(ctx: FleetContext) -> None:
    """min_serving N-1: the last member's load dies halfway; the fleet publishes v2 on
    the others, it serves nothing; after a restart it is re-admitted, catches up, and
    takes rollouts on v2."""
    rig, v = ctx.rig, ctx.rig.victim
    fleet, rep = _dies_halfway(ctx, len(rig.names) - 1)
    ctx.check(f"published on {', '.join(rig.others)}", rep.published
              and sorted(rep.committed_on) == sorted(rig.others), rep.committed_on)
    during = ctx.spread(fleet, "quarantined", 2 * len(rig.names))
    ctx.check(f"no rollout on {v} while it is quarantined; v2's tokens on the others",
              _all_on(during, 2) and all(lease.engine != v for lease, _ in during),
              _seen(during))
    _restart_and_readmit(ctx, fleet, 2)
    _victim_serves_again(ctx, fleet, 2)


def s_dies_halfway_no_quorum(ctx: FleetContext) -> None:
    """min_serving N: the last member's load dies halfway; the fleet aborts; the others
    are rolled back to v1, verified; without a quorum the fleet admits nothing until the
    broken member is re-admitted."""
    rig = ctx.rig
    fleet, rep = _dies_halfway(ctx, len(rig.names))
    ctx.check(f"aborted: {', '.join(rig.others)} rolled back to generation 1, verified",
              rep.aborted and not rep.published
              and rep.rolled_back == dict.fromkeys(rig.others, Trigger.READMIT_OK),
              rep.rolled_back)
    ctx.members_serve(fleet, rig.others, 1)
    try:
        fleet.admit("no-quorum")
        admitted = True
    except IllegalTransition:
        admitted = False
    ctx.check("no quorum: the fleet admits nothing", not admitted and fleet.phase ==
              FleetPhase.ABORTING, fleet.phase)
    _restart_and_readmit(ctx, fleet, 1)
    ctx.check("with the member back the fleet reopens on generation 1",
              fleet.phase == FleetPhase.READY and fleet.committed == 1, fleet.phase)
    after = ctx.spread(fleet, "after", len(rig.names))
    ctx.check("rollouts: generation 1 on every server, v1's tokens", _all_on(after, 1)
              and {lease.engine for lease, _ in after} == set(rig.names), _seen(after))


def s_restarted_out_of_band(ctx: FleetContext) -> None:
    """After a clean update to v2, the last member's server is restarted out of band onto
    v1 and relabelled with v2's label (a launcher that reuses a stale checkpoint path and
    the current version name): it claims the committed label. The fleet's audit (the
    watchdog's round) finds it by its weight identity: quarantined and fenced, it takes no
    rollout; verified re-admission brings it back on v2."""
    rig, v = ctx.rig, ctx.rig.victim
    fleet = ctx.open(min_serving=len(rig.names) - 1)
    ctx.bootstrap(fleet)
    rep = fleet.update(rig.targets(2))
    ctx.report("update", rep)
    ctx.check("published on every member", rep.published
              and sorted(rep.committed_on) == sorted(rig.names), rep.committed_on)
    e = rig.engines[v]
    pid = e.pid()
    e.restart_process("v1")
    e.relabel_outside(rig.targets(2)[v].label)
    ctx.check(f"{v}'s server is a new process on v1 claiming v2's label",
              e.alive() and (e.kind == "sim" or e.pid() != pid)
              and e.label() == rig.targets(2)[v].label
              and e.identity() == rig.targets(1)[v].identity,
              {"pid_before": pid, "pid_after": e.pid(), "label": e.label()})
    out = fleet.audit(why="watchdog")
    ctx.result.evidence["audit"] = {n: str(o.trigger) for n, o in out.items()}
    ctx.check(f"the audit finds {v} by its identity; the others pass",
              out[v].trigger == Trigger.AUDIT_MISMATCH and "identity" in out[v].reason
              and all(out[n].trigger == Trigger.AUDIT_OK for n in rig.others),
              {n: f"{o.trigger}: {o.reason}" for n, o in out.items()})
    label, paused = e.label(), e.is_paused_raw()
    ctx.check(f"{v} is quarantined and its server fenced (paused, taint label)",
              fleet.members[v].controller.phase is Phase.TAINTED and paused
              and str(label).startswith("tainted:"), {"label": label, "paused": paused})
    during = ctx.spread(fleet, "quarantined", 2 * len(rig.names))
    ctx.check(f"no rollout on {v}; v2's tokens on the others",
              _all_on(during, 2) and all(lease.engine != v for lease, _ in during),
              _seen(during))
    readmit = fleet.readmit(v, who="operator")
    ctx.result.evidence[f"readmit_{v}"] = readmit.trigger
    ctx.check(f"{v} re-admitted (reloaded onto v2, verified)",
              readmit.trigger == Trigger.READMIT_OK
              and fleet.members[v].controller.control.committed == 2, readmit.reason)
    _victim_serves_again(ctx, fleet, 2)


def s_killed_mid_broadcast(ctx: FleetContext) -> None:
    """Weights broadcast from this process to every server; the last one is SIGKILLed
    midway (the simulated one dies in the middle of its load). It is quarantined within
    the transfer deadline, the others do not wait for it and publish; restarted, it is
    re-admitted and catches up."""
    rig, v = ctx.rig, ctx.rig.victim
    adapters = rig.transfer_adapters()
    policy = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=120.0, drain_timeout_s=300.0,
                          mutation_base_s=TRANSFER_BASE_S + 1.0)
    fleet = ctx.open(min_serving=len(rig.names) - 1, policy=policy, adapters=adapters)
    ctx.bootstrap(fleet)
    e = rig.engines[v]
    box: dict[str, float] = {}
    killer = None
    if isinstance(e, SimHarnessEngine):
        e.inject_sim("mutate", "crash")  # the simulated process dies mid-load
    else:
        killer = threading.Thread(target=kill_midway, args=(adapters[v], e, box),
                                  daemon=True)
        killer.start()
    t0 = time.monotonic()
    rep = fleet.update(rig.targets(2))
    ctx.report("update", rep)
    if killer is not None:
        killer.join(60.0)
        ctx.check(f"{v}'s server was killed midway through its broadcast", "at" in box, box)
    c = rep.members[v]
    deadline = policy.mutation_deadline(rig.targets(2)[v])
    to_taint = c.tainted_after_s
    ctx.result.evidence.update(mutation_deadline_s=round(deadline, 3),
                               victim_tainted_after_s=to_taint,
                               update_s=round(time.monotonic() - t0, 3))
    ctx.check(f"{v}: ambiguous, TAINTED within the mutation deadline plus a margin",
              c.final_phase is Phase.TAINTED and to_taint is not None
              and to_taint <= deadline + TAINT_MARGIN_S
              and any(s.outcome == Trigger.MUTATE_AMBIGUOUS for s in c.steps),
              {"tainted_after_s": to_taint, "deadline_s": deadline})
    ctx.check(f"{', '.join(rig.others)} did not wait for {v}: published", rep.published
              and sorted(rep.committed_on) == sorted(rig.others), rep.committed_on)
    ctx.members_serve(fleet, rig.others, 2)
    _restart_and_readmit(ctx, fleet, 2)
    after = ctx.spread(fleet, "after", len(rig.names))
    ctx.check("rollouts: generation 2 on every server, v2's tokens", _all_on(after, 2)
              and {lease.engine for lease, _ in after} == set(rig.names), _seen(after))


class _FreezesAtMutate:
    """The victim's adapter: its engine freezes as the mutation is asked (a cause the
    scenario controls), and answers nothing from then on."""

    def __init__(self, inner: LifecycleAdapter, engine: HarnessEngine) -> None:
        self.inner, self.engine = inner, engine
        self.frozen_at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def mutate(self, target: WeightTarget, deadline: float) -> Any:
        if self.frozen_at is None:  # the update's mutation (not a later re-admission's)
            self.engine.freeze()
            self.frozen_at = time.time()
        return self.inner.mutate(target, deadline)


def _journal_t(journal: Path, engine: str | None, step: str) -> float | None:
    """The journal's time of the first ``step`` of ``engine`` (None: a fleet step)."""
    for _, rec in JournalReader(journal):
        if rec.get("engine") == engine and rec.get("step") == step:
            return float(rec["t"])
    return None


def s_frozen_member(ctx: FleetContext) -> None:
    """min_serving N-1: the last member's engine freezes as its mutation is asked (it
    answers nothing, not even the fence). The fleet decides as soon as the others have
    validated and the frozen member's mutation deadline has passed: admissions stay closed
    for that deadline once, not for the fence's deadline after it."""
    rig, v = ctx.rig, ctx.rig.victim
    e = rig.engines[v]
    frozen = _FreezesAtMutate(e.adapter, e)
    policy = RunnerPolicy(step_timeout_s=60.0, pause_timeout_s=120.0, drain_timeout_s=300.0,
                          mutation_base_s=FROZEN_MUTATION_S, fence_timeout_s=FROZEN_FENCE_S)
    fleet = ctx.open(min_serving=len(rig.names) - 1, policy=policy,
                     adapters={**rig.adapters(), v: frozen})
    ctx.bootstrap(fleet)
    try:
        rep = fleet.update(rig.targets(2))
    finally:
        e.thaw()
    ctx.report("update", rep)
    journal = fleet.journal.path
    opened = _journal_t(journal, None, "fleet_request_update")
    published = _journal_t(journal, None, "fleet_publish")
    fence_end = _journal_t(journal, v, Trigger.FENCE_FAILED)
    deadline = policy.mutation_deadline(rig.targets(2)[v])
    closed = None if opened is None or published is None else published - opened
    ctx.result.evidence.update(
        closed_s=None if closed is None else round(closed, 3),
        victim_fence_ended_s=None if fence_end is None or opened is None
        else round(fence_end - opened, 3),
        mutation_deadline_s=round(deadline, 3), fence_deadline_s=FROZEN_FENCE_S)
    ctx.check(f"{v} froze at its mutation: ambiguous at the deadline, TAINTED, its fence "
              "unanswered", frozen.frozen_at is not None and v in rep.quarantined
              and any(s.outcome == Trigger.MUTATE_AMBIGUOUS for s in rep.members[v].steps)
              and rep.members[v].fenced is False, rep.members[v].steps)
    ctx.check(f"published on {', '.join(rig.others)}", rep.published
              and sorted(rep.committed_on) == sorted(rig.others), rep.committed_on)
    ctx.check(f"the fleet published before {v}'s fence ended: its fence held nobody closed",
              published is not None and fence_end is not None and published < fence_end,
              {"published": published, "fence_ended": fence_end})
    ctx.members_serve(fleet, rig.others, 2)
    _restart_and_readmit(ctx, fleet, 2)
    _victim_serves_again(ctx, fleet, 2)


def s_recovered_tainted_fenced(ctx: FleetContext) -> None:
    """The fleet controller dies just before it publishes: every member has resumed on the
    unpublished v2, under v2's label, serving direct callers. The restarted controller
    recovers every member TAINTED from the journal and fences each (paused, taint label)
    before anyone can use the fleet; verified re-admission brings them back on v1."""
    rig = ctx.rig
    fleet = ctx.open(min_serving=len(rig.names))
    ctx.bootstrap(fleet)
    rep = fleet.update(rig.targets(2))
    ctx.check("the update reached its publish", rep.published, rep.committed_on)
    fleet.close()
    # The crash: the journal as it stood just before the fleet_publish record.
    lines = Path(fleet.journal.path).read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines)
               if json.loads(line).get("step") == "fleet_publish")
    crashed = f"{ctx.result.name}-crashed"
    (rig.work / f"{crashed}-{rig.kind}.jsonl").write_bytes(b"".join(lines[:cut]))
    want = rig.targets(2)
    seen = {n: (e.label(), e.is_paused_raw()) for n, e in rig.engines.items()}
    ctx.check("what the crash left: every engine runs the unpublished v2 under its label",
              all(seen[n] == (want[n].label, False) for n in rig.names), seen)
    fleet = ctx.open(min_serving=len(rig.names), name=crashed, recover=True)
    seen = {n: (e.label(), e.is_paused_raw()) for n, e in rig.engines.items()}
    ctx.check("recovered: every member TAINTED, the fleet closed",
              fleet.recovered == dict.fromkeys(rig.names, Trigger.RESTART_TAINTED)
              and fleet.phase == FleetPhase.ABORTING and fleet.committed == 1,
              {"recovered": fleet.recovered, "phase": fleet.phase})
    ctx.check("fenced before the fleet could be used: every engine paused under the taint "
              "label", all(seen[n] == (f"tainted:{want[n].label}", True)
                           for n in rig.names), seen)
    outs = {n: fleet.readmit(n, who="operator, after the recovery") for n in rig.names}
    ctx.check("every member re-admitted onto generation 1 (verified); the fleet reopens",
              all(o.trigger == Trigger.READMIT_OK for o in outs.values())
              and fleet.phase == FleetPhase.READY and fleet.committed == 1,
              {n: o.reason for n, o in outs.items()})
    ctx.members_serve(fleet, rig.names, 1)
    after = ctx.spread(fleet, "after", len(rig.names))
    ctx.check("rollouts: generation 1 on every server, v1's tokens", _all_on(after, 1),
              _seen(after))


def _killed_while_draining(ctx: FleetContext, *, rolling: bool) -> None:
    """The last member's server is SIGKILLed while it drains for an update, its own
    rollout still in flight (every engine holds its rollouts: paused in keep mode outside
    the fleet, a cause the scenario controls). Its pause and the resume after it are
    refused: it gives up (TAINTED, quarantined) and the fleet decides without it, on the
    others; restarted, it is re-admitted and serves again. Rolling (max_live 2,
    min_admitting 1): it drains in the first wave beside another member (the third,
    holding two rollouts, serves on and catches up after the wave)."""
    rig, v = ctx.rig, ctx.rig.victim
    engines = rig.engines
    fleet = ctx.open(min_serving=len(rig.names) - 1, max_live=2 if rolling else 1,
                     min_admitting=1 if rolling else 0)
    ctx.bootstrap(fleet)
    killed: dict[str, float] = {}

    def on_drain(name: str) -> None:
        if name == v and not killed:
            killed["at"] = time.monotonic()
            engines[v].kill()  # a signal, sent from the step's journal write

    fleet.drain_listeners.append(on_drain)
    for e in engines.values():
        e.pause_raw(PauseMode.KEEP)

    def rollout(rid: str) -> tuple[Lease, bool] | str:
        try:
            return ctx.rollout(fleet, rid)
        except Exception as err:  # the victim's request fails: its client lets go
            return f"{type(err).__name__}: {err}"[:200]

    n = len(rig.names) + (1 if rolling else 0)  # rolling: the first member holds two
    with ThreadPoolExecutor(2 * n) as pool:
        futs = [pool.submit(rollout, f"live-{i}") for i in range(n)]
        ctx.check("a rollout in flight on every member when the update is requested",
                  wait_until(lambda: sum(m.outstanding for m in fleet.members.values())
                             == n, 60.0), {x: m.outstanding for x, m in fleet.members.items()})
        update = pool.submit(fleet.update, rig.targets(2))
        try:
            ctx.check(f"{v} drains with its rollout bound, and is killed",
                      wait_until(lambda: "at" in killed, 60.0), killed)
        finally:
            for name, e in engines.items():
                if name != v:
                    e.resume_raw()
        rep = update.result()
        decided = time.monotonic()
        live = [f.result() for f in futs]
    ctx.report("update", rep)
    ctx.result.evidence["kill_to_decision_s"] = round(decided - killed.get("at", decided), 3)
    steps = [f"{s.step}:{s.outcome}" for s in rep.members[v].steps]
    ctx.check(f"{v}: its pause and the resume after it refused: it gave up, quarantined",
              v in rep.quarantined and rep.members[v].final_phase is Phase.TAINTED
              and f"pause:{Trigger.PAUSE_FAILED}" in steps
              and f"resume:{Trigger.RESUME_FAILED}" in steps, steps)
    ctx.check(f"the fleet decided without {v}: published on {', '.join(rig.others)}",
              rep.published and sorted(rep.committed_on) == sorted(rig.others)
              and fleet.phase == FleetPhase.READY and fleet.committed == 2,
              {"committed_on": rep.committed_on, "phase": fleet.phase})
    done = [x for x in live if not isinstance(x, str)]
    ctx.check(f"the others' rollouts ended on generation 1 with v1's tokens; {v}'s failed",
              _all_on(done, 1) and len(done) == n - 1
              and all(lease.engine != v for lease, _ in done), live)
    ctx.members_serve(fleet, rig.others, 2)
    _restart_and_readmit(ctx, fleet, 2)
    _victim_serves_again(ctx, fleet, 2)


def s_killed_while_draining(ctx: FleetContext) -> None:
    _killed_while_draining(ctx, rolling=False)


def s_rolling_killed_while_draining(ctx: FleetContext) -> None:
    _killed_while_draining(ctx, rolling=True)


s_killed_while_draining.__doc__ = s_rolling_killed_while_draining.__doc__ = \
    _killed_while_draining.__doc__


def kill_midway(adapter: Any, engine: Any, box: dict[str, float]) -> None:
    """Once bytes are on their way to it (a transfer, or a staging), SIGKILL its server."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        eng = adapter.active_engine
        sent = getattr(eng, "bytes_sent", None)
        if getattr(adapter, "staging_sent", 0) > 0:
            sent = adapter.staging_sent
        elif not (adapter.client.pending is not None and eng is not None):
            sent = 0
        if (sent or 0) > 0:
            box["sent"] = float(sent or 0)
            box["at"] = time.monotonic()
            engine.server.kill()
            return
        time.sleep(0.0005)


SCENARIOS: dict[str, Scenario] = {
    "clean_update_live": s_clean_update_live,
    "rolling_update_migrated": s_rolling_update_migrated,
    "rolling_steady_load": s_rolling_steady_load,
    "rolling_wave_fails_validation": s_rolling_wave_fails_validation,
    "one_refuses": s_one_refuses,
    "dies_halfway_quorum": s_dies_halfway_quorum,
    "dies_halfway_no_quorum": s_dies_halfway_no_quorum,
    "killed_mid_broadcast": s_killed_mid_broadcast,
    "killed_while_draining": s_killed_while_draining,
    "rolling_killed_while_draining": s_rolling_killed_while_draining,
    "restarted_out_of_band": s_restarted_out_of_band,
    "frozen_member": s_frozen_member,
    "recovered_tainted_fenced": s_recovered_tainted_fenced,
}


# --------------------------------------------------------------------------- running


def member_steps(journal: Path) -> dict[str, list[str]]:
    """Each member's steps, in journal order (the fleet's own steps under ``fleet``)."""
    out: dict[str, list[str]] = {}
    for _, rec in JournalReader(journal):
        if rec.get("type") == "header":
            continue
        out.setdefault(str(rec.get("engine", "fleet")), []).append(str(rec["step"]))
    return out


def run_fleet_scenario(name: str, rig: FleetRig, *,
                       printer: Callable[[str], None] | None = None,
                       narrate: bool = False) -> FleetResult:
    """Run one scenario on ``rig``; with ``narrate`` every check is printed as it is made."""
    result = FleetResult(name, rig.kind)
    ctx = FleetContext(rig, result, printer if narrate else None)
    t0 = time.perf_counter()
    try:
        rig.restore()
        SCENARIOS[name](ctx)
    except Exception as e:  # a scenario's own bug or an engine gone: reported, not raised
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if ctx.fleet is not None:
            ctx.fleet.close()
        result.seconds = time.perf_counter() - t0
    if result.journal is not None:
        path = Path(result.journal)
        result.member_steps = member_steps(path)
        verdict = check_fleet_file(path)
        result.trace = verdict.message
        ctx.check("the fleet journal passes the fleet trace checker", verdict.accepted,
                  verdict.message)
        # Time: every call ended within its declared deadline plus the slack, a frozen
        # member's included (each of its calls ends at its deadline).
        timed = check_fleet_file(path, strict=True)
        ctx.check("every call ended within its declared deadline (trace check --strict)",
                  timed.accepted or not verdict.accepted, timed.message)
    if printer is not None:
        printer(f"fleet {name} [{rig.kind}] {'PASS' if result.passed else 'FAIL'} "
                f"{result.seconds:.1f}s" + "".join(f"\n    {f}" for f in result.failures()))
    return result


__all__ = ["NAMES", "SCENARIOS", "FleetResult", "FleetRig", "member_steps",
           "run_fleet_scenario"]
