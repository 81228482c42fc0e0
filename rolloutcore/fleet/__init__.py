"""The fleet controller: one transactional policy update across N engines, quarantine,
verified re-admission, and admission of rollouts onto serving members only.

It executes the fleet spec (:mod:`rolloutcore.spec.fleet`): every member is a
single-engine :class:`~rolloutcore.engine.controller.Controller` driven by its own
:class:`~rolloutcore.engine.runner.LifecycleRunner` (so each member's steps are the ones the
single-engine spec proves), and the fleet's own decisions use the spec's predicates
(:func:`~rolloutcore.spec.fleet.validated`, :func:`~rolloutcore.spec.fleet.settled`,
:func:`~rolloutcore.spec.fleet.serving`) on the members' controller states.

One journal holds the whole fleet: every member's records tagged with its name, the
fleet's own steps untagged, one hash chain and one sequence. A publish is one group:
the ``fleet_publish`` record names the members it commits, and their ``publish``
records follow it before anything else (the fleet's lock is held across the group).

The fleet decides an update (publish or abort) once every participant has ended its
cycle or is TAINTED (settled, in the spec): a tainted member's fence may still be in
flight, bounded by its deadline, and holds nobody closed; :meth:`Fleet.update` returns its
report once that fence has ended too, with admissions open meanwhile. A fleet recovered
from its journal fences every member it restarts TAINTED before it is returned.

Members are addressed by URL (any launcher: Kubernetes, Ray, a shell script); a fleet
file (TOML) names them: ``[[engine]] name, url, model, token, transfer``.

An engine whose process is replaced behind the fleet's back (a new process, possibly
other weights) looks the same to the controllers until someone looks: :meth:`Fleet.audit`
reads every READY member again (label, identity, run state, a probe; see
:meth:`LifecycleRunner.audit`), and the optional watchdog (``watchdog_s``) does so periodically
and then re-admits every quarantined member whose fence is confirmed (ahead of the
trainer's next update: :meth:`Fleet.readmit_quarantined`).
A member whose audit finds another engine is quarantined (fenced; served again only
after verified re-admission), one that cannot be reached stops serving until an audit
passes, and so does one the application reports unreachable
(:meth:`Fleet.report_unreachable`, which also audits it at once). Between a replacement
and the next audit nobody can know: the watchdog's period bounds that window.

Locks, and the one order they are taken in (never the other way round, so no deadlock):

1. ``Fleet._update_lock``: one update, re-admission or audit at a time; held across
   engine calls (it orders fleet operations, it guards no data read elsewhere);
2. ``Fleet._lock`` (``_changed`` is its condition): the fleet's phase, generations,
   members' ``outstanding`` counts, every fleet journal step (a publish group among
   them) and every member step but a release (each member ``Controller`` takes it as its
   ``step_lock`` before its own lock): a fleet decision reads every member's state and
   journals its step with no member step in between, and no member step lands inside a
   publish group (a release may: it commutes with one, as the fleet checker says);
3. a member ``Controller``'s lock: its control state and bindings. Everything that reads
   a member's state for a decision reads it once, with its bindings, under that lock
   (:meth:`Member.view`, i.e. :meth:`Controller.snapshot`): a release on another thread
   cannot change the bindings mid-read;
4. an update's :class:`PendingDecision` lock: a member's trace sink settles it, under the
   member's controller lock;
5. the ``Journal``'s lock, innermost (a controller journals its steps under its own lock).

A thread holding one of these takes only later ones.
"""


from rolloutcore.fleet.base import (
    FleetCycleReport,
    FleetDeposed,
    FleetError,
    Lease,
    Member,
    MemberStatus,
    MigrationLost,
    StepHook,
    TargetFactory,
)
from rolloutcore.fleet.composed import Fleet
from rolloutcore.fleet.config import (
    TRANSFERS,
    EngineConfig,
    FleetConfig,
    FleetFileError,
    load_fleet_file,
)

__all__ = ["TRANSFERS", "EngineConfig", "Fleet", "FleetConfig", "FleetCycleReport",
           "FleetDeposed", "FleetError", "FleetFileError", "Lease", "Member", "MemberStatus",
           "MigrationLost", "StepHook", "TargetFactory", "load_fleet_file"]
