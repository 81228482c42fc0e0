"""Controller failover on real vLLM servers (the subset of tests/test_failover_sim.py that
needs a real worker to be believed): a real etcd, controllers as processes, two CPU vLLM
servers behind fault proxies.

* The engine's fencing token is our worker extension's: after a fence with epoch e, a
  load with an older epoch (or none) is refused before the model is touched.
* A leader frozen past its lease while its load of v2 is held on the wire; the successor
  takes over and re-admits; the held load then reaches the real worker and is refused
  (the engine keeps v1's bytes), and the thawed leader's appends are refused by etcd.
* A leader killed right after a member's mutation: the successor re-admits the members
  left in doubt and the fleet ends READY on one generation; the journal checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_failover_sim import LEASE_S, Rig, events, one, read_until

from rolloutcore.adapters.contract import MutationOutcome
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.conformance.fault_proxy import Fault, FaultProxy
from rolloutcore.conformance.fixtures.etcd_server import EtcdServer
from rolloutcore.conformance.fixtures.server_pool import ServerPool
from rolloutcore.control import EtcdStore, iter_journal_lines
from rolloutcore.engine.identity import checkpoint_identity
from rolloutcore.engine.targets import checkpoint_target

pytestmark = pytest.mark.vllm


@pytest.fixture
def rig(vllm_pool: ServerPool, models: dict[str, Path], tmp_path: Path) -> Iterator[Rig]:
    with EtcdServer() as etcd, vllm_pool.leased(2) as (a, b), FaultProxy(a.url) as pa, \
            FaultProxy(b.url) as pb:
        url = etcd.url(f"/rc/vllm-{time.time_ns()}")
        fleet_file = tmp_path / "fleet.toml"
        fleet_file.write_text(
            f'[fleet]\nmin_serving = 2\n[control]\nstore = "{url}"\nlease_s = {LEASE_S}\n'
            f'[[engine]]\nname = "a"\nurl = "{pa.url}"\n'
            f'[[engine]]\nname = "b"\nurl = "{pb.url}"\n')
        r = Rig(fleet_file, url, {}, {"a": pa, "b": pb}, sim=False)
        evs = r.drill("--id", "boot", "--bootstrap", str(models["v1"]))
        assert isinstance(evs, list)
        assert one(evs, "done")["committed"] == 1, evs
        yield r


def identity(url: str) -> str | None:
    return HttpAdapter(url).read_state(time.monotonic() + 30).identity


def test_the_real_worker_refuses_a_load_from_an_older_epoch(
        vllm_pool: ServerPool, models: dict[str, Path]) -> None:
    with vllm_pool.leased(1) as (srv,):
        v1, v2 = checkpoint_identity(models["v1"]), checkpoint_identity(models["v2"])
        new, old = HttpAdapter(srv.url), HttpAdapter(srv.url)
        assert identity(srv.url) == v1
        fenced = new.fence_epoch(7, time.monotonic() + 30)
        assert fenced.accepted and fenced.seen == 7 and new.epoch == 7
        old.epoch = 6  # a deposed controller's adapter
        target = checkpoint_target(models["v2"], 2, "rc-2")
        ev = old.mutate(target, time.monotonic() + 60)
        assert ev.outcome is MutationOutcome.NOT_MUTATED and "fenced" in ev.observed, ev
        assert identity(srv.url) == v1
        unfenced = HttpAdapter(srv.url)  # a controller without an epoch
        assert unfenced.mutate(target, time.monotonic() + 60).outcome is \
            MutationOutcome.NOT_MUTATED
        stale = old.fence_epoch(6, time.monotonic() + 30)
        assert not stale.accepted and stale.seen == 7
        ev = new.mutate(target, time.monotonic() + 60)
        assert ev.outcome is MutationOutcome.COMPLETED, ev
        assert identity(srv.url) == v2


def test_frozen_leader_thawed_after_takeover_real_vllm(rig: Rig, models: dict[str, Path]
                                                       ) -> None:
    v1 = checkpoint_identity(models["v1"])
    rig.proxies["a"].add(Fault.hang_before("POST", "/collective_rpc")
                         .when_body("rc_reload_weights"))
    leader = rig.drill("--id", "A", "--update", str(models["v2"]), "--generation", "2",
                       "--hold", wait=False)
    assert isinstance(leader, subprocess.Popen)
    held = rig.proxies["a"].wait_for(lambda xs: any(x.held for x in xs), timeout=120)
    (load,) = [x for x in held if x.held]
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        evs = rig.drill("--id", "B", "--readmit", "--campaign-timeout", "60", timeout=300)
        assert isinstance(evs, list)
        done = one(evs, "done")
        assert done["phase"] == "READY" and done["committed"] == 1, done
        assert all(m["committed"] == 1 and m["serving"] for m in done["members"].values())
        lines = sum(1 for _ in iter_journal_lines(EtcdStore.from_url(rig.url)))
        rig.proxies["a"].release()  # the old leader's load reaches the real worker now
        rig.proxies["a"].wait_for(lambda xs: xs[load.index].upstream_done_at is not None,
                                  timeout=120)
        assert identity(str(rig.proxies["a"].upstream)) == v1  # refused: a still holds v1
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    out, err = leader.communicate(input="\n", timeout=120)
    done_a = one(events(out, err), "done")
    assert done_a["refused"], done_a
    assert sum(1 for _ in iter_journal_lines(EtcdStore.from_url(rig.url))) == lines
    assert identity(str(rig.proxies["b"].upstream)) == v1
    path = rig.journal(Path(rig.fleet_file).parent)
    assert check_fleet_file(path).accepted


def test_leader_killed_after_a_mutation_real_vllm(rig: Rig, models: dict[str, Path]) -> None:
    leader = rig.drill("--id", "A", "--update", str(models["v2"]), "--generation", "2",
                       "--die-after", "a:mutate", wait=False)
    assert isinstance(leader, subprocess.Popen)
    read_until(leader, "elected")
    standby = rig.drill("--id", "B", "--readmit", "--campaign-timeout", "60", wait=False)
    assert isinstance(standby, subprocess.Popen)
    leader.communicate(timeout=300)
    assert leader.returncode == -signal.SIGKILL
    out, err = standby.communicate(timeout=300)
    assert standby.returncode == 0, (out, err[-2000:])
    done = one(events(out, err), "done")
    gens = {m["committed"] for m in done["members"].values()}
    assert done["phase"] == "READY" and len(gens) == 1, done
    want = checkpoint_identity(models["v1" if gens == {1} else "v2"])
    assert {identity(str(p.upstream)) for p in rig.proxies.values()} == {want}
    assert check_fleet_file(rig.journal(Path(rig.fleet_file).parent)).accepted
