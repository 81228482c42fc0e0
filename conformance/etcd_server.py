"""Real etcd for tests: one member (:class:`EtcdServer`) or a cluster (:class:`EtcdCluster`)
started as processes on loopback, with free ports and temporary data directories.

The cluster runs with a short heartbeat and election timeout (50/500 ms) so that losing a
member's leader costs about half a second, not seconds. Every wait is on an observable
condition (a member's ``/health``, a process's exit) with a deadline; a member that does
not come up fails with the tail of its log.

Example::

    with EtcdCluster(3) as cluster:
        store = EtcdStore.from_url(cluster.url("/t"))
        cluster.kill(0)  # SIGKILL one member: the other two still form a quorum
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

ETCD = "/usr/bin/etcd"
HOST = "127.0.0.1"


class EtcdError(RuntimeError):
    """etcd is missing, or a member did not come up (the message has its log tail)."""


def etcd_binary() -> str:
    """The etcd executable (``$ROLLOUTCORE_ETCD``, /usr/bin/etcd, or ``etcd`` on PATH);
    raises :class:`EtcdError` naming how to install it if there is none."""
    for cand in (os.environ.get("ROLLOUTCORE_ETCD"), ETCD, shutil.which("etcd")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise EtcdError("etcd not found (apt-get install etcd-server, or set ROLLOUTCORE_ETCD)")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago (held open together so that
    they differ; the usual small race with other processes remains, see start())."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, n_lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n_lines:])
    except OSError as err:
        return f"<cannot read {path}: {err}>"


class _Member:
    """One etcd process; its data directory and log live under the cluster's."""

    def __init__(self, name: str, client_port: int, peer_port: int, root: Path) -> None:
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = root / f"{name}.data"
        self.log_path = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"

    def start(self, binary: str, initial_cluster: str, token: str, state: str,
              heartbeat_ms: int, election_ms: int) -> None:
        client = f"http://{self.endpoint}"
        args = [binary, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster, "--initial-cluster-state", state,
                "--initial-cluster-token", token,
                "--heartbeat-interval", str(heartbeat_ms),
                "--election-timeout", str(election_ms),
                "--logger", "zap", "--log-level", "warn", "--log-outputs", "stderr"]
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child holds it; closed below)
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def healthy(self) -> bool:
        """``/health`` says true: the member runs and has a leader (a quorum)."""
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=0.5) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (a crash: no clean shutdown) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10.0)

    def stop(self, grace: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()


class EtcdCluster:
    """``n`` etcd members on loopback (a new cluster, empty). ``start()`` returns once
    every member reports healthy, or raises :class:`EtcdError` by ``startup_timeout``.
    ``stop()`` ends every process and removes the data unless ``keep`` is set."""

    def __init__(self, n: int = 3, *, heartbeat_ms: int = 50, election_ms: int = 500,
                 startup_timeout: float = 30.0, root: str | os.PathLike[str] | None = None,
                 keep: bool = False) -> None:
        if n < 1:
            raise ValueError(f"an etcd cluster needs a member, not {n}")
        self.n = n
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.startup_timeout = startup_timeout
        self.keep = keep
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="rolloutcore-etcd-") if root is None else root)
        self.members: list[_Member] = []
        self._token = ""
        self.startup_seconds: float | None = None

    @property
    def endpoints(self) -> list[str]:
        """Every member's ``host:port``, dead or alive."""
        return [m.endpoint for m in self.members]

    def url(self, prefix: str = "") -> str:
        """The ``etcd://`` store URL of the whole cluster, with a key prefix if given."""
        if prefix and not prefix.startswith("/"):
            prefix = "/" + prefix
        return "etcd://" + ",".join(self.endpoints) + prefix

    def start(self) -> EtcdCluster:
        try:
            return self._start()
        except BaseException:
            self.stop()  # a failed start leaves no process and no data behind
            raise

    def _start(self) -> EtcdCluster:
        binary = etcd_binary()
        t0 = time.monotonic()
        last: EtcdError | None = None
        for _attempt in range(3):  # a port taken between choosing it and binding: retry
            ports = _free_ports(2 * self.n)
            self.members = [_Member(f"m{i}", ports[2 * i], ports[2 * i + 1], self.root)
                            for i in range(self.n)]
            initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            self._token = f"rolloutcore-{os.getpid()}-{ports[0]}"  # one cluster, one token
            for m in self.members:
                m.start(binary, initial, self._token, "new", self.heartbeat_ms,
                        self.election_ms)
            try:
                self._wait_healthy(range(self.n), t0 + self.startup_timeout)
            except EtcdError as e:
                last = e
                self._stop_members()
                if "address already in use" not in str(e):
                    raise
                for m in self.members:
                    shutil.rmtree(m.data_dir, ignore_errors=True)
                continue
            self.startup_seconds = time.monotonic() - t0
            return self
        assert last is not None
        raise last

    def _wait_healthy(self, which: range | list[int], deadline: float) -> None:
        pending = list(which)
        while pending:
            for i in list(pending):
                m = self.members[i]
                if not m.running():
                    raise EtcdError(f"etcd member {m.name} ({m.endpoint}) exited with "
                                    f"{m.proc.returncode if m.proc else None}:\n"
                                    f"{_tail(m.log_path)}")
                if m.healthy():
                    pending.remove(i)
            if pending and time.monotonic() > deadline:
                m = self.members[pending[0]]
                raise EtcdError(f"etcd member {m.name} ({m.endpoint}) not healthy after "
                                f"{self.startup_timeout:.0f} s:\n{_tail(m.log_path)}")
            if pending:
                time.sleep(0.02)  # poll interval of a health check with a deadline

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its data stays: :meth:`restart` brings it back)."""
        self.members[i].kill()

    def restart(self, i: int, timeout: float | None = None) -> None:
        """Start a killed member again on its data and ports; returns once it is healthy
        (which needs a quorum)."""
        m = self.members[i]
        m.kill()
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        m.start(etcd_binary(), initial, self._token, "existing", self.heartbeat_ms,
                self.election_ms)
        self._wait_healthy([i], time.monotonic() + (timeout or self.startup_timeout))

    def log_tail(self, i: int, n_lines: int = 20) -> str:
        return _tail(self.members[i].log_path, n_lines)

    def _stop_members(self) -> None:
        for m in self.members:
            m.stop()

    def stop(self) -> None:
        self._stop_members()
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __del__(self) -> None:  # a test that forgot stop(): no orphaned etcd
        for m in getattr(self, "members", ()):
            if m.running() and m.proc is not None:
                m.proc.kill()


class EtcdServer(EtcdCluster):
    """A one-member etcd."""

    def __init__(self, *, startup_timeout: float = 30.0,
                 root: str | os.PathLike[str] | None = None, keep: bool = False) -> None:
        super().__init__(1, startup_timeout=startup_timeout, root=root, keep=keep)

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    def __enter__(self) -> EtcdServer:
        self.start()
        return self


def main() -> int:
    """``python -m rolloutcore.conformance.etcd_server [N]``: run N members until Ctrl-C."""
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with EtcdCluster(n) as c:
        print(f"etcd up after {c.startup_seconds:.2f} s: {c.url()}  (data {c.root})",
              flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
