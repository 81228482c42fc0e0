"""Staged updates on a real vLLM CPU server (spec/staged.py): the worker stages the
target's bytes into a host-memory buffer on a background thread while the engine serves
(``rc_stage`` returns at once; ``rc_stage_status`` is polled), every rank's buffer is
checked against the target's identity before admissions close, and the closed window only
installs (``rc_install_staged``: vLLM's own reload from the staged tensors). A staging of
the wrong bytes or of a torn checkpoint is refused with the engine serving generation 1,
its greedy output unchanged, never TAINTED. Every journal passes the trace checker."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from helpers import dying_source

pytestmark = pytest.mark.vllm

if importlib.util.find_spec("vllm") is None:  # pragma: no cover - depends on the env
    pytest.skip("vllm is not installed (pip install -e '.[vllm]')", allow_module_level=True)

from rolloutcore.adapters.contract import StageEvidence, WeightTarget  # noqa: E402
from rolloutcore.adapters.http import HttpAdapter  # noqa: E402
from rolloutcore.check.fleet_trace import check_fleet_file  # noqa: E402
from rolloutcore.check.trace import check_file  # noqa: E402
from rolloutcore.conformance.engines import checkpoint_target  # noqa: E402
from rolloutcore.conformance.fixtures.server_pool import ServerPool  # noqa: E402
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models  # noqa: E402
from rolloutcore.conformance.fixtures.vllm_server import VllmServer  # noqa: E402
from rolloutcore.engine.controller import Controller  # noqa: E402
from rolloutcore.engine.delta import write_delta  # noqa: E402
from rolloutcore.engine.identity import (  # noqa: E402
    checkpoint_entries,
    checkpoint_identity,
    checkpoint_nbytes,
)
from rolloutcore.engine.peer import (  # noqa: E402
    PEER_PATH,
    TOKEN_HEADER,
    PeerSourceError,
    PeerStream,
    is_peer_url,
)
from rolloutcore.engine.postconditions import Decision, decide, receive_kind  # noqa: E402
from rolloutcore.engine.runner import LifecycleRunner, RunnerPolicy  # noqa: E402
from rolloutcore.fleet import Fleet  # noqa: E402
from rolloutcore.journal import Journal  # noqa: E402
from rolloutcore.spec.lifecycle import Phase  # noqa: E402
from rolloutcore.spec.triggers import Op, Trigger  # noqa: E402

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

        # A delta: v1neg differs from v1 in two of its tensors; only those travel, staged
        # on the v1 the worker installed last; the result reads as v1neg in full.
        info = write_delta(models["v1"], models["v1neg"], tmp_path / "delta")
        assert info.changed == 2 and info.nbytes < checkpoint_nbytes(models["v1neg"]) / 5
        neg = checkpoint_target(tmp_path / "delta", 4, "v1neg")
        assert neg.identity == checkpoint_identity(models["v1neg"])
        report = runner.update(neg)
        assert report.published and report.staged, report.steps
        assert report.staged_bytes == info.nbytes
        assert adapter.read_state(time.monotonic() + 10).identity == neg.identity
        assert adapter.generate(neg.probe_prompt, len(neg.probe_tokens)).tokens == \
            neg.probe_tokens
        # The same delta again, on the wrong base (the worker now holds v1neg): refused.
        report = runner.update(replace(neg, generation=5, label="v1neg-again"))
        assert not report.published and report.staging_refused, report.steps
        assert "a delta on base" in report.staging_refused
        assert report.final_phase is Phase.READY
        assert check_file(journal).accepted


# ------------------------------------------------------------ peer sources


def test_peer_sources_on_real_servers(vllm_pool: ServerPool, tmp_path: Path) -> None:
    """Two real servers in a staged fleet with peer sources: the trainer's checkpoint is
    staged by member a, member b stages it from a's worker (a's verified staging served
    by ``rc_peer_serve``), both install and serve it. A source that dies mid-stream leaves
    b's staging incomplete (the evidence the runner refuses a staging on, never TAINTED)
    with b serving what it served, its greedy output unchanged; a wrong token is refused
    by the source. The fleet journal passes the fleet trace checker."""
    models = build_models(DEFAULT_OUT)
    v1 = checkpoint_target(models["v1"], 1, "default")
    v2 = checkpoint_target(models["v2"], 2, "v2")
    with vllm_pool.leased(2) as (sa, sb), HttpAdapter(sa.url) as a, HttpAdapter(sb.url) as b:
        fleet = Fleet([("a", a, sa.url), ("b", b, sb.url)], journal=tmp_path / "f.jsonl",
                      policy=POLICY, fsync=False, peer_sources=True)
        try:
            fleet.bootstrap(v1)
            report = fleet.update(v2)
            assert report.published and sorted(report.committed_on) == ["a", "b"], report
            assert (report.members["a"].peer, report.members["b"].peer) == (None, "a")
            assert report.members["b"].staged_bytes == v2.nbytes
            sources = {r["engine"]: r["detail"]["source"] for r in map(
                json.loads, (tmp_path / "f.jsonl").read_text().splitlines()[1:])
                if r.get("step") == "stage_begin"}
            assert sources["a"] == v2.source and is_peer_url(sources["b"]), sources
            for ad in (a, b):
                assert ad.read_state(time.monotonic() + 10).identity == v2.identity
                assert ad.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens == \
                    v2.probe_tokens

            # What a's source streams (its installed bytes now), read with the token...
            url = a.peer_source(v2.identity, time.monotonic() + 10)
            with PeerStream(url, a.peer_token, 10) as stream:
                got = b"".join(data for _e, data in stream.tensors())
                assert len(got) == v2.nbytes and stream.received == stream.total
            # ... and refused without it.
            with pytest.raises(PeerSourceError, match="HTTP 403"):
                PeerStream(url, "not-the-token", 10)

            # A source that dies after a fifth of the bytes: b's staging does not complete.
            raw = httpx.get(url, headers={TOKEN_HEADER: a.peer_token}, timeout=10).content
            prefix, dying = dying_source(raw, len(raw) // 5)
            v3 = replace(checkpoint_target(models["v1neg"], 3, "v1neg"),
                         source=prefix + PEER_PATH + v2.identity)
            before = b.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens
            ev = b.stage(v3, time.monotonic() + 20)
            dying.join(10)
            assert ev.stages and all(not s.complete for s in ev.stages), ev
            assert "closed the stream after" in (ev.stages[0].error or ""), ev
            assert receive_kind(v3.identity, ev.stages[0]) != "exact"
            b.discard_stage(time.monotonic() + 10)
            assert b.read_state(time.monotonic() + 10).identity == v2.identity
            assert b.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens == before

            # Back to v1's weights (the pool gives the servers to the next test), by peer.
            assert fleet.update(checkpoint_target(models["v1"], 3, "v1b")).published
        finally:
            fleet.close()
        verdict = check_fleet_file(tmp_path / "f.jsonl")
        assert verdict.accepted, verdict.message


# ------------------------------------------------------------ a tensor-parallel engine

#: Two CPU workers (vLLM's shared-memory communicator for TP on CPU), one core each.
TP2_ARGS = ("--tensor-parallel-size", "2", "--distributed-executor-backend", "mp")
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    from rolloutcore.adapters.vllm_worker import SERVER_ARGS

    models = build_models(DEFAULT_OUT)
    srv = VllmServer(Path(models["v1"]).resolve(), extra_args=[*SERVER_ARGS, *TP2_ARGS],
                     single_process=False, env=TP2_ENV,
                     log_path=tmp_path_factory.mktemp("tp2") / "vllm.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class _OneRankReads(HttpAdapter):
    """Rank 2 reads its bytes from another directory (a torn copy)."""

    def __init__(self, url: str, source: Path) -> None:
        super().__init__(url)
        self.rank2 = source

    def stage(self, target: WeightTarget, deadline: float, *,
              rank_sources: Mapping[int, str] | None = None) -> StageEvidence:
        return super().stage(target, deadline, rank_sources={2: str(self.rank2)})


def test_staged_updates_on_a_two_rank_engine(tp2: VllmServer, tmp_path: Path) -> None:
    """TP=2: both ranks stage and report prepared, then the engine installs; one rank's
    staging fails mid-read (its copy torn): nothing installs anywhere, both ranks still
    serve v2, greedy output unchanged; negative control: rank 2 staged from v1 and the
    install forced without prepared evidence mixes the weights (the output is neither
    version's) and the scored probe against v2's reference catches it."""
    models = build_models(DEFAULT_OUT)
    v1 = checkpoint_target(models["v1"], 1, "default")
    v2 = checkpoint_target(models["v2"], 2, "v2")
    journal = tmp_path / "tp2.jsonl"
    torn = _forged(Path(models["v1"]), tmp_path / "torn", truncate=True)
    with _OneRankReads(tp2.url, torn) as torn_rank2, HttpAdapter(tp2.url) as http:
        runner = LifecycleRunner(Controller(trace=Journal(journal, fsync=False)), http,
                                 POLICY)
        assert runner.bootstrap(v1).trigger == "bootstrap_ok"
        report = runner.update(v2)
        assert report.published and report.staged, report.steps
        assert len(http._worker_results(http.rpc("rc_identity", op="t"), "t")) == 2
        assert report.staged_bytes == 2 * v2.nbytes  # every rank staged the checkpoint
        served = http.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens
        assert served == v2.probe_tokens

        runner.adapter = torn_rank2
        report = runner.update(checkpoint_target(models["v1"], 3, "v1b"))
        assert not report.published and report.staging_refused, report.steps
        assert "rank 2" in report.staging_refused and "rank 1" not in report.staging_refused
        assert report.final_phase is Phase.READY and runner.controller.control.committed == 2
        assert http.read_state(time.monotonic() + 10).identity == v2.identity
        assert http.generate(v2.probe_prompt, len(v2.probe_tokens)).tokens == served
        verdict = check_file(journal)
        assert verdict.accepted, verdict.message

        # Negative control: rank 1 stages v1, rank 2 v2; the install is forced.
        deadline = time.monotonic() + 60
        ev = http.stage(v1, deadline, rank_sources={2: str(models["v2"])})
        assert [s.identity for s in ev.stages] == [v1.identity, v2.identity]
        forced = http.install(v1, deadline, check_identity=False)
        assert forced.outcome.value == "ambiguous"  # the ranks vouch for two identities
        mixed = http.generate(v1.probe_prompt, len(v1.probe_tokens)).tokens
        assert mixed != v1.probe_tokens and mixed != served, "the weights did not mix"
        probe = http.probe(v1.probe_prompt, 1, deadline, scored=True)
        decision = Decision(Op.PROBE, (probe,), runner._expected(v1))
        assert decide(decision).trigger == Trigger.PROBE_MISMATCH
