"""A controller process for failover drills (Jepsen style): it campaigns for the fleet's
leadership on etcd, takes the fleet over (recovery from the shared journal, every engine
fenced with its epoch), does what it is told, and says what happened as one JSON object
on stdout. The tests start two of them against one fleet and kill, freeze and thaw them.

    python -m rolloutcore.conformance.failover_drill --fleet F.toml --id A
        [--bootstrap CKPT] [--update CKPT --generation N] [--readmit]
        [--die-after MEMBER:STEP] [--hold] [--campaign-timeout S] [--sim]

* ``--die-after MEMBER:STEP``: SIGKILL itself right after MEMBER's step STEP (as journalled;
  ``fleet:STEP`` for a fleet step): a kill at a chosen point of the update cycle, caused by
  the drill, not by timing.
* ``--hold``: after its work, keep the leadership (and the fleet) until stdin closes or
  SIGTERM, so that a test can freeze it (SIGSTOP) and thaw it (SIGCONT) later; every call it
  makes afterwards is printed as a ``late`` line when ``--late-update`` names a target.
* ``--sim``: the engines are simulated servers (checkpoints are names, see
  :mod:`rolloutcore.conformance.fixtures.sim_server`).

Each line it prints is one JSON object; the last one (``"event": "done"``) is its report:
epoch, takeover time, the fleet's phase and generation, every member's phase and
generation, and what was refused (a deposed append, a fenced load).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rolloutcore.adapters.contract import WeightTarget

_OUT = threading.Lock()


def _say(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "t": time.time(), **fields}, default=str) + "\n"
    with _OUT:  # members' threads report at once: one whole line each
        sys.stdout.write(line)
        sys.stdout.flush()


def _target_factory(sim: bool) -> Callable[[str, int, str], WeightTarget]:
    if sim:
        from rolloutcore.adapters.sim import sim_target

        return lambda source, generation, label: sim_target(generation, source, label=label)
    from rolloutcore.engine.targets import checkpoint_target

    return lambda source, generation, label: checkpoint_target(source, generation, label)


def _policy(sim: bool) -> Any:
    from rolloutcore.engine.runner import RunnerPolicy

    if not sim:  # a real server's first requests after its start can take seconds
        return RunnerPolicy()
    # Short deadlines: a held or dead engine costs the drill seconds, not minutes.
    return RunnerPolicy(step_timeout_s=5.0, pause_timeout_s=10.0, fence_timeout_s=3.0,
                        drain_timeout_s=10.0, mutation_base_s=10.0)


def run(args: argparse.Namespace) -> int:
    from rolloutcore.adapters.http import HttpAdapter
    from rolloutcore.control import (
        CampaignTimeout,
        EtcdStore,
        Leadership,
        StoreError,
        current_leader,
    )
    from rolloutcore.fleet import Fleet, FleetError, load_fleet_file
    from rolloutcore.fleet.store import EtcdJournalStore
    from rolloutcore.journal import JournalError

    cfg = load_fleet_file(args.fleet)
    assert cfg.control is not None, "a drill needs a fleet file with [control] store"
    name = args.id
    store = EtcdStore.from_url(cfg.control.store)
    lead = Leadership(store, name, ttl_s=cfg.control.lease_s)
    t0 = time.time()
    _say("campaign", id=name, leader=(lambda i: i.describe() if i else None)(
        current_leader(store)))
    try:
        epoch = lead.campaign(timeout_s=args.campaign_timeout)
    except CampaignTimeout as e:  # another controller leads: this one acts on nothing
        _say("done", id=name, error=str(e))
        return 1
    _say("elected", id=name, epoch=epoch, waited_s=round(time.time() - t0, 3))
    lead.on_lost(lambda: _say("leadership_lost", id=name, reason=lead.lost_reason))
    target_of = _target_factory(args.sim)
    adapters = {e.name: HttpAdapter(e.url, model=e.model, check_source_exists=not args.sim)
                for e in cfg.engines}
    refused: list[str] = []

    def on_step(member: str, step: str, outcome: str, seconds: float) -> None:
        _say("step", member=member, step=step, outcome=outcome)
        if args.die_after and args.die_after == f"{member}:{step}":
            _say("dying", after=args.die_after)
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        fleet = Fleet([(n, a, None) for n, a in adapters.items()],
                      journal=EtcdJournalStore(store, lead, name), min_serving=cfg.min_serving,
                      policy=_policy(args.sim), target_of=target_of, on_step=on_step,
                      max_live=cfg.max_live, min_admitting=cfg.min_admitting)
    except FleetError as e:
        _say("done", id=name, epoch=epoch, error=str(e))
        return 1
    journal_step = fleet._step

    def fleet_step(step: str, **detail: Any) -> None:  # the fleet's own steps, as kill points
        journal_step(step, **detail)
        on_step("fleet", step, "ok", 0.0)

    fleet._step = fleet_step  # type: ignore[method-assign]
    took_over = time.time()
    _say("took_over", id=name, epoch=epoch, recovered={k: str(v) for k, v in
                                                       fleet.recovered.items()},
         unfenced=sorted(fleet.unfenced), phase=fleet.phase, committed=fleet.committed)
    code = 0
    try:
        if args.bootstrap and fleet.phase == "UNINITIALIZED":
            out = fleet.bootstrap(target_of(args.bootstrap, 1, args.bootstrap_label))
            _say("bootstrap", outcomes={k: f"{o.trigger}: {o.reason}" for k, o in out.items()})
        if args.readmit:
            for m, st in ((m, m.controller.phase.value) for m in fleet.members.values()):
                if st == "TAINTED" or m.name in fleet.unfenced:
                    o = fleet.readmit(m.name, who=name)
                    _say("readmit", member=m.name, outcome=str(o.trigger), reason=o.reason)
        if args.update:
            label = args.label or f"rc-{args.generation}"
            rep = fleet.update(target_of(args.update, args.generation, label))
            _say("update", published=rep.published, aborted=rep.aborted,
                 quarantined=rep.quarantined)
        if args.hold:
            _say("holding", id=name)
            _hold(args, fleet, target_of, refused)
    except (JournalError, StoreError, FleetError) as e:
        refused.append(f"{type(e).__name__}: {e}")
        _say("refused", error=f"{type(e).__name__}: {e}")
        code = 1
    _say("done", id=name, epoch=epoch, takeover_s=round(took_over - t0, 3),
         phase=fleet.phase, committed=fleet.committed, refused=refused,
         members={s.name: {"phase": s.phase, "committed": s.committed, "serving": s.serving}
                  for s in fleet.status()})
    if not args.hold:
        fleet.close()
        lead.resign()
    return code


def _hold(args: argparse.Namespace, fleet: Any, target_of: Callable[..., WeightTarget],
          refused: list[str]) -> None:
    """Keep the leadership until stdin says ``go`` (then try ``--late-update``, as a
    controller thawed after a freeze would go on with its work) or closes."""
    got = threading.Event()

    def on_term(_sig: int, _frame: Any) -> None:
        got.set()

    signal.signal(signal.SIGTERM, on_term)
    line = sys.stdin.readline().strip()
    if line == "go" and args.late_update:
        _say("late_update", target=args.late_update)
        rep = fleet.update(target_of(args.late_update, args.late_generation,
                                     f"rc-{args.late_generation}"))
        _say("late_update_report", published=rep.published, aborted=rep.aborted)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="failover_drill")
    p.add_argument("--fleet", required=True)
    p.add_argument("--id", default=f"{socket.gethostname()}:{os.getpid()}")
    p.add_argument("--bootstrap")
    p.add_argument("--bootstrap-label", default="default")
    p.add_argument("--update")
    p.add_argument("--generation", type=int, default=2)
    p.add_argument("--label")
    p.add_argument("--readmit", action="store_true")
    p.add_argument("--die-after")
    p.add_argument("--hold", action="store_true")
    p.add_argument("--late-update")
    p.add_argument("--late-generation", type=int, default=3)
    p.add_argument("--campaign-timeout", type=float, default=60.0)
    p.add_argument("--sim", action="store_true")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
