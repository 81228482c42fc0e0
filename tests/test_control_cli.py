"""The controller's failover surface on the command line (a fleet file with ``[control]
store``), with a real etcd and simulated engines (subprocesses).

What a command says and how it exits: ``fleet status`` shows the leader (or none), a
fleet command while another controller leads exits 1 naming it, a store that cannot be
reached exits 3 within seconds, a bad store URL is bad input (2), the journal on etcd
exports to the very JSONL file a local journal is and every journal command reads it
from its URL; two ``serve`` processes on one fleet: one leads, the other answers as a
standby until the leader is killed, then takes over with a higher epoch; a leader that
loses its leadership stops with exit 3.

The fleets are bootstrapped in-process (a :class:`Fleet` over the etcd journal). The
command line describes a journal's generations from checkpoint directories
(:func:`rolloutcore.engine.targets.checkpoint_target`), so the simulated engines hold a
"checkpoint" named by a real directory: its probe reference is the simulated engine's
own, but its content identity (a digest of its safetensors file) is not the one the
engine reports (the simulator's is a hash of the name). A controller recovered by the
command line therefore expects another identity than the engines show: these tests
exercise leadership, takeover, standby and exit codes, never an audit, a re-admission,
an update or a rollout on a command-line controller (``serve --no-watchdog``), which
would find that mismatch (and rightly quarantine the engines).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_until

from rolloutcore import cli
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.adapters.sim import sim_target
from rolloutcore.conformance.fixtures.etcd_server import EtcdCluster, EtcdServer
from rolloutcore.conformance.fixtures.sim_server import SimServer, write_checkpoint
from rolloutcore.control import (
    EtcdStore,
    Leadership,
    current_leader,
    iter_journal_lines,
)
from rolloutcore.control.etcd import b64
from rolloutcore.fleet import Fleet
from rolloutcore.fleet.store import EtcdJournalStore

REPO = Path(__file__).resolve().parents[1]
#: The leader key's lease in these fleets: a killed leader is replaced after about this.
LEASE_S = 2.0
#: Any wait on a condition: far above what it takes, so only a failure reaches it.
BOUND = 30.0


# -------------------------------------------------------------------------- rig


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    """Two simulated engines holding the checkpoint named by a directory the command
    line can describe (see the module's doc); yields (that directory, engine URLs)."""
    name = write_checkpoint(tmp_path_factory.mktemp("ckpt") / "v1")
    with SimServer(initial=name) as a, SimServer(initial=name) as b:
        yield name, [a.url, b.url]


@dataclass
class Rig:
    fleet_file: Path
    url: str  # the store URL: this test's own prefix

    def store(self) -> EtcdStore:
        return EtcdStore.from_url(self.url)

    def leader(self) -> Any:
        with self.store() as s:
            return current_leader(s)


def _fleet_file(path: Path, store_url: str, urls: list[str], extra: str = "") -> Path:
    path.write_text(f'[fleet]\nmin_serving = 2\n[control]\nstore = "{store_url}"\n'
                    f"lease_s = {LEASE_S}\n{extra}"
                    + "".join(f'[[engine]]\nname = "{n}"\nurl = "{u}"\n'
                              for n, u in zip("ab", urls, strict=True)))
    return path


@pytest.fixture
def rig(etcd: EtcdServer, engines: tuple[str, list[str]], tmp_path: Path,
        request: pytest.FixtureRequest) -> Rig:
    """A fleet on a fresh prefix, bootstrapped on generation 1 by an in-process
    controller ("boot") that then resigns: no leader, a journal to take over."""
    ckpt, urls = engines
    url = etcd.url(f"/cli/{request.node.name}-{time.time_ns()}")
    r = Rig(_fleet_file(tmp_path / "fleet.toml", url, urls), url)
    with r.store() as store:
        lead = Leadership(store, "boot", ttl_s=LEASE_S)
        lead.campaign(timeout_s=BOUND)
        try:
            fleet = Fleet([(n, HttpAdapter(u, check_source_exists=False), u)
                           for n, u in zip("ab", urls, strict=True)],
                          journal=EtcdJournalStore(store, lead, "boot"), min_serving=2)
            fleet.bootstrap(sim_target(1, ckpt, label="default"))
            assert fleet.phase == "READY", fleet.phase
            fleet.close()
        finally:
            lead.resign()
    return r


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_cli(*argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process (exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "rolloutcore.cli", *argv],
                          capture_output=True, text=True, env=_env(), timeout=timeout)


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


class Serve:
    """``rolloutcore serve`` in a subprocess; its output collected as it comes."""

    def __init__(self, fleet_file: Path, *extra: str) -> None:
        watchdog = () if "--watchdog" in extra else ("--no-watchdog",)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rolloutcore.cli", "serve", "--fleet", str(fleet_file),
             "--port", "0", *watchdog, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        self.out: list[str] = []
        self.err: list[str] = []
        self._pumps = [threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
                       for stream, sink in ((self.proc.stdout, self.out),
                                            (self.proc.stderr, self.err))]
        for t in self._pumps:
            t.start()
        first = wait_until(lambda: self.out[:1] or self.proc.poll() is not None,
                           "serve's first line")
        assert self.out, (self.proc.returncode, self.err)
        m = re.search(r"http://127\.0\.0\.1:(\d+)", first[0])
        assert m is not None, first
        self.url = f"http://127.0.0.1:{m.group(1)}"

    @staticmethod
    def _pump(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line.rstrip("\n"))

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10.0)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=10.0)

    def status(self) -> dict[str, Any] | None:
        """/admin/status, or None while the server is switching (connection refused)."""
        try:
            data: dict[str, Any] = self.get("/admin/status").json()
            return data
        except (httpx.TransportError, ValueError):
            return None

    def leading(self) -> dict[str, Any] | None:
        s = self.status()
        return s if s is not None and s.get("role") == "leader" else None

    def wait_exit(self, timeout: float = BOUND) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self._pumps:  # every line it wrote
            t.join(timeout)
        return rc

    def stderr_lines(self) -> list[str]:
        return [ln for ln in self.err if not re.match(r"\d{4}-\d\d-\d\d ", ln)]  # log lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(BOUND)


@pytest.fixture
def serves() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        s.kill()


# ----------------------------------------------------------------- read-only commands


def test_status_shows_the_leader_or_none_and_a_command_names_it(
        rig: Rig, capsys: pytest.CaptureFixture[str]) -> None:
    """status: "no leader", then (while another controller holds the key) its id, epoch
    and lease; a fleet command exits 1 naming it, at once or after ``--wait``."""
    assert cli.main(["fleet", "status", "--fleet", str(rig.fleet_file)]) == 0
    out = capsys.readouterr().out
    assert f"no leader (store {rig.url})" in out and "fleet READY, committed generation 1" \
        in out, out
    with rig.store() as store:
        holder = Leadership(store, "holder-x", ttl_s=LEASE_S)
        epoch = holder.campaign(timeout_s=BOUND)
        try:
            assert cli.main(["fleet", "status", "--fleet", str(rig.fleet_file),
                             "--json"]) == 0
            data = json.loads(capsys.readouterr().out)
            assert data["store"] == rig.url and data["fleet"]["phase"] == "READY"
            leader = data["leader"]
            assert leader["id"] == "holder-x" and leader["epoch"] == epoch
            assert 0 < leader["lease_s_left"] <= LEASE_S and leader["pid"] == os.getpid()
            assert [m["phase"] for m in data["members"]] == ["READY", "READY"]
            assert cli.main(["fleet", "status", "--fleet", str(rig.fleet_file)]) == 0
            assert re.search(rf"leader: holder-x \(pid {os.getpid()} on .*\), epoch {epoch}, "
                             r"lease [0-9.]+ s left", capsys.readouterr().out)
            for argv in (["fleet", "audit"], ["fleet", "readmit", "--engine", "a"]):
                assert cli.main([*argv, "--fleet", str(rig.fleet_file)]) == 1
                line = one_error_line(capsys.readouterr().err)
                assert line.startswith(f"error: another controller leads: holder-x at "
                                       f"epoch {epoch} (lease "), line
                assert line.endswith("ask it (its admin API) or --wait"), line
            t0 = time.monotonic()
            assert cli.main(["fleet", "audit", "--fleet", str(rig.fleet_file), "--wait",
                             "1", "--json"]) == 1
            waited = time.monotonic() - t0
            out, err = capsys.readouterr()
            assert 1.0 <= waited < 1.0 + BOUND / 3, waited
            assert json.loads(out)["leader"]["id"] == "holder-x"
            assert "(waited 1 s)" in one_error_line(err)
        finally:
            holder.resign()
    assert rig.leader() is None  # the commands that failed to lead left nothing behind


def test_journal_export_and_every_journal_command_on_a_url(
        rig: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``journal export`` writes the etcd journal as the file a local journal is; trace
    check, journal verify and records verify read it there, or from the URL itself."""
    out = tmp_path / "exported.jsonl"
    assert cli.main(["journal", "export", rig.url, str(out)]) == 0
    with rig.store() as store:
        lines = list(iter_journal_lines(store))
    assert out.read_bytes() == b"".join(lines)
    assert capsys.readouterr().out.strip() == (f"exported {len(lines)} records from "
                                               f"{rig.url} to {out}")
    assert [p.name for p in tmp_path.iterdir()] == ["exported.jsonl", "fleet.toml"]  # atomic
    for argv in (["journal", "verify"], ["trace", "check"]):
        assert cli.main([*argv, str(out)]) == 0
        file_verdict = capsys.readouterr().out
        assert cli.main([*argv, rig.url]) == 0  # the URL directly: the same verdict
        assert capsys.readouterr().out == file_verdict
        assert cli.main([*argv, rig.url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["file"] == rig.url
    # records verify against the URL (these records were not bound by this fleet: 1)
    from rolloutcore.adapters.contract import GenerationResult
    from rolloutcore.engine.controller import Binding
    from rolloutcore.trajectories.format import Decoding, Timing, dumps, record_from

    rec = record_from(Binding("r1", 1, None, 5), "default", (1, 2, 3),
                      GenerationResult((1, 2, 3), (4, 5), "length", (-0.5, -0.25)),
                      Decoding(0.0), Timing(1.0, 0.5))
    records = tmp_path / "records.jsonl"
    records.write_text(dumps(rec) + "\n")
    assert cli.main(["records", "verify", str(records), "--journal", rig.url]) == 1
    assert capsys.readouterr().out.startswith(f"journal {rig.url}: {len(lines)} records, "
                                              "chain intact")
    # a prefix with no journal, or a bad URL: bad input, one line, nothing written
    empty = rig.url + "-nothing"
    for argv in (["journal", "export", empty, str(tmp_path / "x.jsonl")],
                 ["trace", "check", empty], ["journal", "verify", empty],
                 ["journal", "export", "etcd://127.0.0.1:99999/p", str(tmp_path / "x")]):
        assert cli.main(argv) == 2, argv
        line = one_error_line(capsys.readouterr().err)
        assert "no journal under" in line or "bad endpoint" in line, line
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x").exists()


def test_an_unreachable_store_is_said_in_one_line_within_seconds(
        engines: tuple[str, list[str]], tmp_path: Path) -> None:
    """Every command that needs the store exits 3 at once when nobody answers there."""
    with socket.socket() as s:  # bound, not listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        dead = f"etcd://127.0.0.1:{s.getsockname()[1]}/cli/dead"
        fleet = _fleet_file(tmp_path / "fleet.toml", dead, engines[1])
        for argv in (["fleet", "status", "--fleet", str(fleet)],
                     ["fleet", "audit", "--fleet", str(fleet)],
                     ["fleet", "readmit", "--fleet", str(fleet), "--engine", "a"],
                     ["serve", "--fleet", str(fleet), "--port", "0"],
                     ["journal", "export", dead, str(tmp_path / "out.jsonl")],
                     ["trace", "check", dead], ["journal", "verify", dead]):
            t0 = time.monotonic()
            r = run_cli(*argv)
            took = time.monotonic() - t0
            assert r.returncode == 3, (argv, r.returncode, r.stdout, r.stderr)
            line = one_error_line(r.stderr)
            assert dead.split("/cli")[0] in line and "unavailable" in line, (argv, line)
            assert took < 10.0, (argv, took)  # the interpreter's start included
    assert not (tmp_path / "out.jsonl").exists()


def test_a_store_without_a_quorum_is_said_in_one_line_within_seconds(
        engines: tuple[str, list[str]], tmp_path: Path) -> None:
    """Two of three etcd members gone: the one left answers but cannot serve a
    linearizable read. Reads time out at the store's bound, a campaign is refused at
    once (the member says it has no leader): exit 3 either way, never a hang."""
    with EtcdCluster(3) as cluster:
        url = cluster.url("/cli/quorum")
        fleet = _fleet_file(tmp_path / "fleet.toml", url, engines[1])
        cluster.kill(1)
        cluster.kill(2)
        for argv in (["fleet", "status", "--fleet", str(fleet)],
                     ["fleet", "update", "--fleet", str(fleet), "--checkpoint", engines[0],
                      "--label", "v2"],
                     ["journal", "verify", url]):
            t0 = time.monotonic()
            r = run_cli(*argv)
            took = time.monotonic() - t0
            assert r.returncode == 3, (argv, r.returncode, r.stdout, r.stderr)
            line = one_error_line(r.stderr)
            assert "unavailable" in line, (argv, line)
            assert took < 15.0, (argv, took)  # the store's bound, the interpreter's start


def test_a_bad_store_url_in_the_fleet_file_is_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = _fleet_file(tmp_path / "fleet.toml", "etcd://127.0.0.1:99999/p",
                        ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    for argv in (["fleet", "status"], ["fleet", "audit"], ["serve"]):
        assert cli.main([*argv, "--fleet", str(fleet)]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: {fleet}: [control] store: "), line


# ----------------------------------------------------------------- deposed in mid-command


def test_a_command_deposed_in_mid_command_exits_3_and_resigns(
        rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``fleet audit`` wins the leadership and takes the fleet over (journalled under the
    fleet file's id); a successor then deletes its key and its next append is refused
    by etcd: exit 3, one ``deposed:`` line, nothing more journalled."""
    fleet_file = _fleet_file(tmp_path / "ided.toml", rig.url,
                             [ln.split('"')[1] for ln in rig.fleet_file.read_text()
                              .splitlines() if ln.startswith("url")], 'id = "cli-ctl"\n')

    journalled: list[int] = []

    def audit_after_a_successor(self: Fleet, **_kw: Any) -> Any:
        lead = self.store.leadership  # type: ignore[attr-defined]
        assert lead.holds() and self.store.controller == "cli-ctl"
        with rig.store() as store:  # what a successor's election does to this key
            journalled.append(sum(1 for _ in iter_journal_lines(store)))
            store.request("/kv/deleterange", {"key": b64(lead.key)}, idempotent=True)
        self._step("fleet_recover", serving=2, min_serving=2)  # any append: refused
        raise AssertionError("the append was not refused")

    monkeypatch.setattr(Fleet, "audit", audit_after_a_successor)
    assert cli.main(["fleet", "audit", "--fleet", str(fleet_file)]) == 3
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("error: deposed: ") and "cli-ctl" in line, line
    assert "was deposed" in line, line
    with rig.store() as store:
        recs = [json.loads(x) for x in iter_journal_lines(store)]
    assert len(recs) == journalled[0]  # the refused append is not there
    takeovers = [r for r in recs if r.get("step") == "fleet_takeover"]
    assert takeovers[-1]["detail"]["controller"] == "cli-ctl", takeovers
    assert rig.leader() is None
    assert cli.main(["trace", "check", rig.url]) == 0, capsys.readouterr()


# ---------------------------------------------------------------------------- serve


def _wait_for_roles(serves: list[Serve]) -> tuple[Serve, Serve, dict[str, Any]]:
    """The one leader and the one standby among two serves (both up)."""
    def roles() -> tuple[Serve, Serve, dict[str, Any]] | None:
        st = [s.status() for s in serves]
        if any(x is None for x in st):
            return None
        leaders = [i for i, x in enumerate(st) if x and x.get("role") == "leader"]
        standbys = [i for i, x in enumerate(st) if x and x.get("role") == "standby"]
        if len(leaders) == 1 and len(standbys) == 1:
            lead_status = st[leaders[0]]
            assert lead_status is not None
            return serves[leaders[0]], serves[standbys[0]], lead_status
        assert len(leaders) <= 1, st  # never two leaders
        return None

    found = wait_until(roles, "one leader and one standby")
    assert isinstance(found, tuple)
    return found


def test_two_serves_one_leads_the_other_takes_over_when_it_is_killed(
        rig: Rig, serves: list[Serve]) -> None:
    """Two ``serve`` on one fleet: exactly one leads (its /admin/status names it with its
    epoch), the other answers as a standby (503 on the API and the admin routes, 200
    role standby on /health); a fleet command exits 1 naming the leader; kill -9 of the
    leader: the standby takes over within the lease and a few seconds, at a higher
    epoch; SIGTERM ends it cleanly (0) and resigns at once."""
    serves += [Serve(rig.fleet_file), Serve(rig.fleet_file)]
    leader, standby, st = _wait_for_roles(serves)
    lead = st["leader"]
    assert st["fleet"]["phase"] == "READY" and st["fleet"]["committed"] == 1
    assert 0 < lead["lease_s_left"] <= LEASE_S and lead["epoch"] > 0
    assert lead["id"].endswith(f":{leader.proc.pid}")
    health = standby.get("/health")
    assert health.status_code == 200 and health.json()["role"] == "standby"
    assert health.json()["leader"]["epoch"] == lead["epoch"]
    for r in (standby.post("/v1/completions", {"model": "tiny", "prompt": "hi"}),
              standby.post("/admin/update", {"checkpoint": "/x", "label": "v2"})):
        assert r.status_code == 503 and r.json()["error"]["type"] == "standby", r.text
        assert f"controller {lead['id']!r} leads at epoch {lead['epoch']}" in r.text
    # a fleet command while a serve leads
    r = run_cli("fleet", "audit", "--fleet", str(rig.fleet_file))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert one_error_line(r.stderr).startswith(
        f"error: another controller leads: {lead['id']} at epoch {lead['epoch']} (lease ")
    r = run_cli("fleet", "status", "--fleet", str(rig.fleet_file), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["leader"]["epoch"] == lead["epoch"]
    # kill -9 the leader: the standby is elected once its lease expires, takes over
    leader.proc.kill()
    killed = time.monotonic()
    new = wait_until(standby.leading, "the standby leads")
    took = time.monotonic() - killed
    assert new["leader"]["epoch"] > lead["epoch"] and new["fleet"]["phase"] == "READY"
    assert took < LEASE_S + 5.0, took
    assert any(f"elected leader at epoch {new['leader']['epoch']}" in ln
               for ln in standby.out), standby.out
    assert standby.get("/health").json().get("role") != "standby"
    standby.proc.send_signal(signal.SIGTERM)
    assert standby.wait_exit() == 0, (standby.out, standby.err)
    assert "closed cleanly" in standby.out[-1] and not standby.stderr_lines()
    assert rig.leader() is None  # resigned: no standby would wait for its lease
    r = run_cli("trace", "check", rig.url)
    assert r.returncode == 0, (r.stdout, r.stderr)
    recs = [json.loads(x) for x in iter_journal_lines(rig.store())]
    epochs = [x["detail"]["epoch"] for x in recs if x.get("step") == "fleet_takeover"]
    assert epochs[1:] == [lead["epoch"], new["leader"]["epoch"]], epochs


def test_serve_standby_stops_cleanly_and_a_deposed_leader_exits_3(
        rig: Rig, serves: list[Serve]) -> None:
    """A standby stopped by SIGTERM exits 0; a leader whose key is deleted (a successor's
    doing) stops serving and exits 3 with one ``deposed:`` line, its watchdog auditing
    meanwhile (the refused audit is a warning in the log, never a traceback)."""
    leader = Serve(rig.fleet_file, "--watchdog", "0.05")
    serves.append(leader)
    st = wait_until(leader.leading, "the first serve leads")
    standby = Serve(rig.fleet_file)
    serves.append(standby)
    assert wait_until(lambda: (standby.status() or {}).get("role") == "standby", "standby")
    standby.proc.send_signal(signal.SIGTERM)
    assert standby.wait_exit() == 0, (standby.out, standby.err)
    assert standby.out[-1].endswith("SIGTERM, standby closed cleanly"), standby.out
    with rig.store() as store:
        store.request("/kv/deleterange", {"key": b64(store.key("leader"))},
                      idempotent=True)
    t0 = time.monotonic()
    assert leader.wait_exit() == 3, (leader.out, leader.err)
    assert time.monotonic() - t0 < LEASE_S + 5.0
    (line,) = leader.stderr_lines()
    assert line.startswith("error: deposed: ") and f"epoch {st['leader']['epoch']}" in line
    # Whichever saw it first: the leadership's watch (the key deleted) or the watchdog's
    # next audit (its append refused by the store): both are the deposition.
    assert "leader key deleted" in line or "was deposed" in line, line
    assert "Traceback" not in "\n".join(leader.err)
