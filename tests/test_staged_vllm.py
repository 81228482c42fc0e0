"""Staged updates on a real vLLM CPU server (spec/staged.py): the worker stages the
target's bytes into a host-memory buffer on a background thread while the engine serves
(``rc_stage`` returns at once; ``rc_stage_status`` is polled), every rank's buffer is
checked against the target's identity before admissions close, and the closed window only
installs (``rc_install_staged``: vLLM's own reload from the staged tensors). A staging of
the wrong bytes or of a torn checkpoint is refused with the engine serving generation 1,
its greedy output unchanged, never TAINTED. Every journal passes the trace checker."""

from __future__ import annotations

import importlib.util
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.check.trace import check_file  # noqa: E402
from rolloutcore.conformance.engines import checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.controller import Controller  # noqa: E402
from rolloutcore.engine.identity import checkpoint_entries  # noqa: E402
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy  # noqa: E402
from rolloutcore.journal import Journal  # noqa: E402
from rolloutcore.spec.lifecycle import Phase  # noqa: E402

POLICY = RunnerPolicy(step_timeout_s=8.0, retries=1, retry_backoff_s=0.0, staged=True)


@pytest.fixture(scope="module")
def server(vllm_pool: ServerPool) -> Iterator[VllmServer]:
    with vllm_pool.leased(1) as (srv,):
        yield srv


def _forged(src: Path, out: Path, *, truncate: bool) -> Path:
    """A copy of ``src`` whose first tensor file has one byte flipped (complete, but
    another identity) or is cut short (unreadable)."""
    shutil.copytree(src, out)
    f = checkpoint_entries(out)[0].file
    data = bytearray(f.read_bytes())
    if truncate:
        f.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-1] ^= 0x01
        f.write_bytes(bytes(data))
    return out


def test_staged_updates_on_a_real_server(server: VllmServer, tmp_path: Path) -> None:
    models = build_models(DEFAULT_OUT)
    v1 = checkpoint_target(models["v1"], 1, "default")
    with HttpAdapter(server.url) as adapter:
        journal = tmp_path / "staged.jsonl"
        runner = LifecycleRunner(Controller(trace=Journal(journal, fsync=False)), adapter,
                                 POLICY)
        assert runner.stages
        assert runner.bootstrap(v1).trigger == "bootstrap_ok"
        before = adapter.generate(v1.probe_prompt, len(v1.probe_tokens)).tokens
        assert before == v1.probe_tokens

        # Refused stagings: the wrong bytes (one flipped), a torn file. Served: v1.
        for name, truncate in (("flipped", False), ("torn", True)):
            bad = _forged(Path(models["v2"]), tmp_path / name, truncate=truncate)
            target = replace(checkpoint_target(models["v2"], 2, "v2"), source=str(bad))
            report = runner.update(target)
            assert not report.published and not report.staged, report.steps
            assert report.staging_refused and report.final_phase is Phase.READY, report.steps
            assert ("other" if name == "flipped" else "corrupt") in report.staging_refused
            state = adapter.read_state(time.monotonic() + 10)
            assert state.identity == v1.identity and state.label == "default"
            out = adapter.generate(v1.probe_prompt, len(v1.probe_tokens)).tokens
            assert out == before, f"{name}: served output changed by a refused staging"

        # A clean staged update: every byte staged while serving, then installed.
        v2 = checkpoint_target(models["v2"], 2, "v2")
        report = runner.update(v2)
        assert report.published and report.staged, report.steps
        assert report.staged_bytes == v2.nbytes
        state = adapter.read_state(time.monotonic() + 10)
        assert state.identity == v2.identity and state.label == "v2"
        assert adapter.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens == \
            v2.probe_tokens
        ident = adapter._worker_results(adapter.rpc("rc_identity", op="t"), "t")[0]
        assert ident["basis"].startswith("bytes staged by rc_stage")
        verdict = check_file(journal)
        assert verdict.accepted, verdict.message
        # Back to v1's weights (the pool restores its label when the server is given back).
        assert runner.update(checkpoint_target(models["v1"], 3, "v1b")).published
