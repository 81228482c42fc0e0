"""The fleet: its jobs composed into one object, built over its members and journal."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from rolloutcore.adapters.contract import LifecycleAdapter, PeerSource
from rolloutcore.engine.controller import Controller
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy
from rolloutcore.fleet.admission import Admission
from rolloutcore.fleet.base import UNINITIALIZED, Member, StepHook, TargetFactory
from rolloutcore.fleet.readmission import Readmission
from rolloutcore.fleet.recovery import Recovery
from rolloutcore.fleet.store import JournalStore, as_store
from rolloutcore.fleet.updates import Updates
from rolloutcore.spec.fleet import FLEET, update_policy_error


class Fleet(Admission, Readmission, Updates, Recovery):
    """N members, one fleet state, one journal. Thread-safe."""

    def __init__(self, members: Sequence[tuple[str, LifecycleAdapter, str | None]], *,
                 journal: str | Path | JournalStore, min_serving: int | None = None,
                 policy: RunnerPolicy | None = None, fsync: bool = True,
                 clock: Callable[[], float] = time.time,
                 on_step: StepHook | None = None,
                 target_of: TargetFactory | None = None,
                 watchdog_s: float | None = None, max_live: int = 1,
                 min_admitting: int = 0, peer_sources: bool = False) -> None:
        """A fleet over ``members`` (name, adapter, URL). A new journal starts a fresh
        fleet (to bootstrap); an existing one is recovered (see :meth:`_recover`), which
        needs ``target_of`` to describe the generations it names. A journal store with
        an epoch (etcd, under a leadership this controller won) makes it a takeover: every
        member is fenced with the epoch before anything else (:meth:`_take_over`).
        ``watchdog_s``: audit
        every READY member, and re-admit fenced quarantined ones, that often (see
        :meth:`start_watchdog`). ``max_live`` K >= 2 makes
        updates roll (:meth:`update`): at most K generations served at once, at least
        ``min_admitting`` members serving throughout; a recovered fleet keeps the ones its
        journal opened with. ``peer_sources``: a staged update's bytes travel from the
        trainer to one member, the others stage from it (see :meth:`_stage_from_peer`);
        every member must be a :class:`PeerSource`, and all are given one peer token."""
        names = [n for n, _a, _u in members]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"members need distinct names: {names}")
        self.min_serving = len(names) if min_serving is None else min_serving
        if not 1 <= self.min_serving <= len(names):
            raise ValueError(f"min_serving must be in 1..{len(names)}")
        bad = update_policy_error(max_live, min_admitting, len(names))
        if bad:
            raise ValueError(bad)
        self.max_live, self.min_admitting = max_live, min_admitting
        if peer_sources:
            cannot = [n for n, a, _u in members if not isinstance(a, PeerSource)]
            if cannot:
                raise ValueError(f"peer_sources: member(s) {cannot} cannot serve a peer")
            token = secrets.token_hex(16)
            for _n, a, _u in members:
                cast(PeerSource, a).peer_token = token
        self.peer_sources = peer_sources
        store = as_store(journal)
        self.store = store
        self.epoch = store.epoch
        self.unfenced = set()
        existing = store.has_records()
        self.policy = policy = policy or RunnerPolicy()
        self._clock = clock
        self.on_step = on_step
        self.drain_listeners = []
        self.members = {}
        # Every member step is taken under the fleet's lock (see the lock order in
        # rolloutcore.fleet): a decision reads all members at once, and journals in order.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        for name, adapter, url in members:
            ctl = Controller(step_lock=self._lock)
            runner = LifecycleRunner(ctl, adapter, policy, on_step=self._hook(name))
            self.members[name] = Member(name, adapter, url, ctl, runner)
        self._watch_views()
        self.phase = UNINITIALIZED
        self.committed = 0
        self.target = 0
        self.floor = 0
        self.down = frozenset()
        self.last_report = None
        self.recovered = {}
        if existing:
            with store.replay_path() as path:
                self._replay(path, target_of)
        self.journal = store.open(fsync=fsync, clock=clock, spec_name=FLEET.name)
        self._deciding = None
        for m in self.members.values():
            m.controller.trace = self._member_sink(m.name)
            m.controller.guard = self._member_guard(m.name)
        self._pool = ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="fleet")
        self._update_lock = threading.Lock()
        self._readmissions_due = 0
        self._quorum = None
        self._watchdog = None
        self._watchdog_stop = threading.Event()
        if self.epoch is not None:
            self._take_over()
        if existing:
            with self._lock:
                self._restart()
                self._suspect_unfenced()
            self._fence_recovered()
        if watchdog_s is not None:
            self.start_watchdog(watchdog_s)

    def close(self) -> None:
        """Stop the watchdog, let cycles the fleet decided without end (a tainted member's
        fence, bounded by its deadline), close the journal."""
        self.stop_watchdog()
        for m in self.members.values():
            m.settle_work(self.policy.fence_timeout_s + 5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.journal.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
