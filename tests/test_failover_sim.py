"""Controller failover, Jepsen style, with a real etcd and simulated engines.

Controllers are separate processes (:mod:`rolloutcore.conformance.failover_drill`) over
simulated vLLM servers that outlive them; the tests kill them (SIGKILL) at every step of
an update cycle, freeze them (SIGSTOP) past their lease in the middle of a mutation and
thaw them after a successor took over, start two at once, and lose etcd members under a
fleet. After each: the fleet ends READY on one generation (members left in doubt were
quarantined and then re-admitted by the successor), the journal on etcd passes the fleet
trace checker, and nothing a deposed controller did reached an engine or the journal.

Timing comes from causes the tests control: kill points are steps the drill itself dies
after; the frozen controller's mutation is held at a fault proxy until the test releases
it; the lease (3 s) is what the successor waits for. It is long enough that a
keep-alive delayed by a busy machine (the real-vLLM tier runs beside these tests) does
not cost a live leader its lease: the drills kill and freeze leaders, not the CPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import dl

from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.conformance.fault_proxy import Fault, FaultProxy
from rolloutcore.conformance.fixtures.etcd_server import EtcdServer
from rolloutcore.conformance.fixtures.sim_server import SimServer
from rolloutcore.control import EtcdStore, export_journal, iter_journal_lines

LEASE_S = 3.0
CLUSTER_LEASE_S = 3.0
#: Kill points: after each step of member a's cycle, and after the fleet's own steps.
KILL_POINTS = ("fleet:fleet_request_update", "a:drain", "a:pause", "a:mutate",
               "a:reset(prefix)", "a:reset(encoder)", "a:reset(mm)", "a:validate",
               "a:resume", "a:probe", "fleet:fleet_publish")
#: make check kills the leader at these (before, in the middle of and after a member's
#: mutation, and at the fleet's publish); make test at every one (marked deep).
QUICK_KILL_POINTS = frozenset({"a:pause", "a:mutate", "a:probe", "fleet:fleet_publish"})


@dataclass
class Rig:
    fleet_file: Path
    url: str  # the store URL (its prefix is this rig's)
    engines: dict[str, SimServer]
    proxies: dict[str, FaultProxy]
    sim: bool = True  # the engines are simulated servers (checkpoints are names)

    def drill(self, *args: str, wait: bool = True, timeout: float = 90.0
              ) -> subprocess.Popen[str] | list[dict[str, Any]]:
        cmd = [sys.executable, "-m", "rolloutcore.conformance.failover_drill",
               "--fleet", str(self.fleet_file), *(["--sim"] if self.sim else []), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.PIPE, text=True)
        if not wait:
            return proc
        out, err = proc.communicate(timeout=timeout)
        evs = events(out, err)
        assert evs and evs[-1]["event"] == "done", (proc.returncode, out, err[-3000:])
        return evs

    def journal(self, tmp: Path) -> Path:
        out = tmp / "journal.jsonl"
        export_journal(EtcdStore.from_url(self.url), out)
        return out

    def engine(self, name: str) -> HttpAdapter:
        return HttpAdapter(self.engines[name].url, check_source_exists=False)


def events(out: str, err: str) -> list[dict[str, Any]]:
    evs = []
    for line in out.splitlines():
        try:
            evs.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"drill printed a non-JSON line {line!r}; stderr: {err}"
                                 ) from None
    return evs


def read_until(proc: subprocess.Popen[str], kind: str) -> list[dict[str, Any]]:
    """The events ``proc`` printed up to and including the first ``kind`` (the rest stays
    for ``communicate``)."""
    assert proc.stdout is not None
    seen: list[dict[str, Any]] = []
    for line in proc.stdout:
        seen.append(json.loads(line))
        if seen[-1]["event"] == kind:
            return seen
    raise AssertionError(f"no {kind} before exit {proc.wait()}: {seen}; "
                         f"{proc.stderr.read() if proc.stderr else ''}")


def one(evs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [e for e in evs if e["event"] == kind]
    assert len(found) == 1, (kind, evs)
    return found[0]


@pytest.fixture
def rig(etcd: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """Two simulated engines (on v1) behind fault proxies, a fleet on a fresh etcd prefix,
    bootstrapped by a first controller that then resigns."""
    prefix = f"/rc/{re.sub(r'[^A-Za-z0-9_.-]', '-', request.node.name)}-{time.time_ns()}"
    url = etcd.url(prefix)
    with SimServer(initial="v1", in_thread=True) as a, SimServer(initial="v1",
                                                                 in_thread=True) as b, \
            FaultProxy(a.url) as pa, FaultProxy(b.url) as pb:
        fleet_file = tmp_path / "fleet.toml"
        fleet_file.write_text(
            f'[fleet]\nmin_serving = 2\n[control]\nstore = "{url}"\nlease_s = {LEASE_S}\n'
            f'[[engine]]\nname = "a"\nurl = "{pa.url}"\n'
            f'[[engine]]\nname = "b"\nurl = "{pb.url}"\n')
        r = Rig(fleet_file, url, {"a": a, "b": b}, {"a": pa, "b": pb})
        done = one(r.drill("--id", "boot", "--bootstrap", "v1"), "done")  # type: ignore[arg-type]
        assert done["phase"] == "READY" and done["committed"] == 1, done
        yield r


def _check_journal(rig: Rig, tmp: Path) -> list[dict[str, Any]]:
    path = rig.journal(tmp)
    verdict = check_fleet_file(path)
    assert verdict.accepted, verdict
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    epochs = [r["detail"]["epoch"] for r in recs if r.get("step") == "fleet_takeover"]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), epochs
    return recs


def _final_state_is_one_generation(done: dict[str, Any], rig: Rig) -> int:
    members = done["members"]
    gens = {m["committed"] for m in members.values()}
    assert done["phase"] == "READY" and len(gens) == 1, done
    assert all(m["phase"] == "READY" and m["serving"] for m in members.values()), done
    gen = gens.pop()
    want = {1: "v1", 2: "v2"}[gen]
    for name in rig.engines:  # what each engine itself says now
        state = rig.engine(name).read_state(dl())
        assert state.label == f"rc-{gen}" if gen > 1 else state.label in ("default", "rc-1")
        from rolloutcore.adapters.sim import sim_identity
        assert state.identity == sim_identity(want), (name, state)
    return gen


@pytest.mark.parametrize("kill_at", [
    k if k in QUICK_KILL_POINTS else pytest.param(k, marks=pytest.mark.deep)
    for k in KILL_POINTS])
def test_leader_killed_at_every_step_standby_takes_over(rig: Rig, tmp_path: Path,
                                                        kill_at: str) -> None:
    """kill -9 of the leader right after ``kill_at``: the standby is elected within the
    lease (plus etcd's expiry tick), fences and recovers the fleet, re-admits what the
    journal left in doubt, and the fleet ends READY on one generation; the journal checks."""
    leader = rig.drill("--id", "A", "--update", "v2", "--generation", "2",
                       "--die-after", kill_at, wait=False)
    assert isinstance(leader, subprocess.Popen)
    first = read_until(leader, "elected")  # the standby starts once A leads
    standby = rig.drill("--id", "B", "--readmit", "--campaign-timeout", "30", wait=False)
    assert isinstance(standby, subprocess.Popen)
    out_a, err_a = leader.communicate(timeout=60)
    assert leader.returncode == -signal.SIGKILL, (leader.returncode, out_a, err_a)
    died = one(first + events(out_a, err_a), "dying")
    out_b, err_b = standby.communicate(timeout=60)
    assert standby.returncode == 0, (out_b, err_b)
    evs = events(out_b, err_b)
    elected, done = one(evs, "elected"), one(evs, "done")
    took = one(evs, "took_over")
    # Lease expiry is checked by etcd every 500 ms: lease + 0.5 s, plus slack for load.
    assert elected["t"] - died["t"] < LEASE_S + 3.0, (elected["t"] - died["t"])
    assert took["t"] - elected["t"] < 5.0
    assert not done["refused"], done
    gen = _final_state_is_one_generation(done, rig)
    recs = _check_journal(rig, tmp_path)
    takeovers = [r for r in recs if r.get("step") == "fleet_takeover"]
    after = recs[recs.index(takeovers[-1]):]
    print(f"kill after {kill_at}: elected {elected['t'] - died['t']:.2f} s after the kill, "
          f"took over {took['t'] - elected['t']:.2f} s later; re-admitted "
          f"{sorted({str(r.get('engine')) for r in after if r.get('step') == 'readmit_ok'})}"
          f"; ended READY on generation {gen}")
    assert [r["detail"]["controller"] for r in takeovers] == ["boot", "A", "B"]
    assert all(not r["detail"]["unfenced"] for r in takeovers)


def test_frozen_leader_thawed_after_takeover_is_refused_where_it_lands(
        rig: Rig, tmp_path: Path) -> None:
    """The leader is frozen (SIGSTOP) past its lease while its load of v2 onto a is held
    on the wire; the standby takes over, fences, re-admits and finishes; the held load is
    then delivered and the old leader thawed: the engine refuses the load (its fence is
    the new epoch), the journal refuses its appends, and nothing it does changes an
    engine or the journal."""
    hold = Fault.hang_before("POST", "/collective_rpc").when_body("rc_reload_weights")
    rig.proxies["a"].add(hold)
    leader = rig.drill("--id", "A", "--update", "v2", "--generation", "2", "--hold",
                       "--late-update", "v3", wait=False)
    assert isinstance(leader, subprocess.Popen)
    held = rig.proxies["a"].wait_for(lambda xs: any(x.held for x in xs), timeout=30)
    (load,) = [x for x in held if x.held]
    os.kill(leader.pid, signal.SIGSTOP)
    frozen_at = time.time()
    try:
        evs = rig.drill("--id", "B", "--readmit", "--campaign-timeout", "30")
        assert isinstance(evs, list)
        elected, done = one(evs, "elected"), one(evs, "done")
        assert elected["t"] - frozen_at >= LEASE_S * 0.5  # it waited for the lease
        # Nothing was published: both members are back on v1 (a re-admitted, b rolled
        # back), so a stale load of v2 that landed would show.
        assert _final_state_is_one_generation(done, rig) == 1
        lines_before = sum(1 for _ in iter_journal_lines(EtcdStore.from_url(rig.url)))
        identity_before = {n: rig.engine(n).read_state(dl()).identity
                           for n in rig.engines}
        # The old leader's load reaches the engine now: refused there (a stays on v1).
        rig.proxies["a"].release()
        rig.proxies["a"].wait_for(lambda xs: xs[load.index].upstream_done_at is not None,
                                  timeout=30)
        assert rig.engine("a").read_state(dl()).identity == \
            identity_before["a"]
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    out, err = leader.communicate(input="go\n", timeout=60)
    evs_a = events(out, err)
    done_a = one(evs_a, "done")
    print("the thawed leader's refused calls:", *done_a["refused"], sep="\n    ")
    assert any("Deposed" in r or "no longer holds" in r or "deposed" in r
               for r in done_a["refused"]), done_a
    assert not any(e["event"] == "late_update_report" for e in evs_a), evs_a
    # Nothing it did after the thaw reached the journal or an engine.
    assert sum(1 for _ in iter_journal_lines(EtcdStore.from_url(rig.url))) == lines_before
    for n in rig.engines:
        assert rig.engine(n).read_state(dl()).identity == identity_before[n]
    _check_journal(rig, tmp_path)


def test_two_controllers_started_together_exactly_one_acts(rig: Rig, tmp_path: Path) -> None:
    """Two controllers started on purpose against one fleet, both asked to update: one
    leads and updates; the other waits and times out without touching anything."""
    procs = [rig.drill("--id", n, "--update", "v2", "--generation", "2", "--hold",
                       "--campaign-timeout", "3", wait=False) for n in ("X", "Y")]
    results: dict[str, list[dict[str, Any]]] = {}
    leader: str | None = None
    deadline = time.monotonic() + 30
    while leader is None and time.monotonic() < deadline:
        for n, p in zip(("X", "Y"), procs, strict=True):
            assert isinstance(p, subprocess.Popen)
            if p.poll() is not None and n not in results:
                results[n] = events(*p.communicate())
        recs = [json.loads(x) for x in iter_journal_lines(EtcdStore.from_url(rig.url))]
        actors = {r["detail"]["controller"] for r in recs if r.get("step") == "fleet_takeover"}
        if actors - {"boot"}:
            (leader,) = actors - {"boot"}
        time.sleep(0.05)
    assert leader in ("X", "Y")
    other = "Y" if leader == "X" else "X"
    lp, op = procs[("X", "Y").index(leader)], procs[("X", "Y").index(other)]
    assert isinstance(lp, subprocess.Popen) and isinstance(op, subprocess.Popen)
    out, err = op.communicate(timeout=30)
    refused = one(events(out, err), "done")
    assert op.returncode == 1 and "held by" in refused["error"], (out, err)
    out, err = lp.communicate(input="\n", timeout=60)
    done = one(events(out, err), "done")
    assert _final_state_is_one_generation(done, rig) == 2
    recs = _check_journal(rig, tmp_path)
    assert {r["detail"]["controller"] for r in recs if r.get("step") == "fleet_takeover"} \
        == {"boot", leader}


@pytest.mark.deep  # three etcd members started and stopped: make test
def test_three_member_etcd_loses_one_then_two(tmp_path: Path) -> None:
    """A fleet journalled on a 3-member etcd cluster: with one member lost updates go on;
    with two lost the controller stops making changes and says why (nothing unverified is
    published, nothing is sent once its lease clock runs out); with the quorum back a new
    leader takes over on the same journal, re-admits what was in doubt, and it checks."""
    from rolloutcore.adapters.sim import SimAdapter, SimEngine, sim_identity, sim_target
    from rolloutcore.conformance.fixtures.etcd_server import EtcdCluster
    from rolloutcore.control import Leadership
    from rolloutcore.fleet import Fleet
    from rolloutcore.fleet.store import EtcdJournalStore
    from rolloutcore.journal import JournalError

    def target_of(source: str, generation: int, label: str) -> Any:
        return sim_target(generation, source, label=label)

    engines = {n: SimEngine("v1", label="default") for n in ("a", "b")}
    with EtcdCluster(3) as cluster:
        url = cluster.url("/rc/cluster")

        def lead(name: str) -> tuple[Fleet, Leadership]:
            store = EtcdStore.from_url(url)
            # A lease well above etcd's election time (500 ms here): losing etcd's own
            # raft leader must not cost the controller its leadership.
            leadership = Leadership(store, name, ttl_s=CLUSTER_LEASE_S)
            leadership.campaign(timeout_s=30)
            adapters = [(n, SimAdapter(e), None) for n, e in engines.items()]
            return Fleet(adapters, journal=EtcdJournalStore(store, leadership, name),
                         target_of=target_of, fsync=False), leadership

        fleet, leadership = lead("first")
        fleet.bootstrap(sim_target(1, "v1", label="default"))
        assert fleet.update(sim_target(2, "v2", label="rc-2")).published
        cluster.kill(0)
        # The survivors elect a new raft leader (if member 0 was it) before the update: a
        # write during that election is ambiguous, and the journal would fail closed.
        cluster._wait_healthy([1, 2], time.monotonic() + 30)
        assert fleet.update(sim_target(3, "v3", label="rc-3")).published
        cluster.kill(1)  # no quorum
        t0 = time.monotonic()
        with pytest.raises((JournalError, Exception)) as failed:
            fleet.update(sim_target(4, "v4", label="rc-4"))
        assert time.monotonic() - t0 < 30, "a lost quorum must fail in bounded time"
        assert "quorum" in str(failed.value) or "unavailable" in str(failed.value) \
            or "unknown" in str(failed.value) or "refused" in str(failed.value), failed.value
        # The leadership is lost by its clock (every send checks the lease's deadline
        # itself); the event below is set by the refresher on its next tick, which a CPU
        # starved by a concurrent test tier delays (CI run C: later than 8 s), so the wait
        # is generous: it fails only if the loss is never noticed.
        assert leadership.lost.wait(CLUSTER_LEASE_S + 60), "its lease clock must run out"
        assert {e.identity_reads_as for e in engines.values()} <= {sim_identity("v3"),
                                                                  sim_identity("v4")}
        cluster.restart(1)
        cluster.restart(0)
        fleet.close()
        successor, lead2 = lead("second")
        try:
            for m in successor.members.values():
                if m.controller.phase.value == "TAINTED":
                    successor.readmit(m.name, who="test")
            assert successor.phase == "READY" and successor.committed == 3
            assert {e.identity_reads_as for e in engines.values()} == {sim_identity("v3")}
        finally:
            successor.close()
            lead2.resign()
        out = tmp_path / "j.jsonl"
        export_journal(EtcdStore.from_url(url), out)
        assert check_fleet_file(out).accepted
        recs = [json.loads(x) for x in out.read_text().splitlines()]
        assert not any(r.get("step") == "publish" and r.get("committed") == 4 for r in recs)
