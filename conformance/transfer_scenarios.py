"""Weight-transfer conformance on a real vLLM server: one scenario corpus, two backends.

The same code drives the CPU path (``gloo``: :mod:`rolloutcore.adapters.gloo_transfer`,
CI) and the GPU path (``nccl``, :mod:`rolloutcore.conformance.gpu_nccl_check`): only the
:class:`Backend` (its name, server flags, trainer init info and device) differs. Every
scenario runs the real :class:`~rolloutcore.engine.runner.LifecycleRunner` over
``TransferAdapter(inner=HttpAdapter(...))`` with a journalled controller.

Scenarios (``run_all``):

* ``refuse_identity``  target declared as checkpoint B, the source holds A: refused before
  mutation, the engine untouched (label, identity, greedy probe of the old generation).
* ``init_refused``     the engine refuses the transfer's init (a world it cannot join):
  refused without TAINTED, the engine still serves the old generation.
* ``full_cycle``       the target's tensors move from this (trainer) process into the live
  server: greedy output equals the target's reference, label and identity equal the
  target's, same server PID.
* ``wrong_model``      a model of another shape (one embedding row more) sent without the
  publisher's check: ambiguous mid-transfer, TAINTED; the verified re-admission (which
  closes the session the failure left open) brings back the committed weights.
* ``frozen``           the server is SIGSTOPped midway through the broadcast: TAINTED
  within the transfer deadline plus a margin, not published, no admission; then the
  server is killed and the journal confirms nothing was published.
* ``killed``           (second server) SIGKILL midway: TAINTED promptly, ambiguous.

Usage: ``python -m rolloutcore.conformance.transfer_scenarios [--json FILE]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.distributed.weight_transfer.base import WeightSource

from rolloutcore.adapters.contract import WeightTarget
from rolloutcore.adapters.http import HttpAdapter
from rolloutcore.adapters.launch import free_port
from rolloutcore.adapters.weight_transfer import (
    CheckpointSource,
    TransferAdapter,
    TransferPolicy,
)
from rolloutcore.conformance.engines import INITIAL_LABEL, checkpoint_target
from rolloutcore.conformance.fixtures.vllm_server import VllmServer
from rolloutcore.engine.controller import IllegalTransition
from rolloutcore.engine.runner import CycleReport, LifecycleRunner, RunnerPolicy
from rolloutcore.journal import open_controller, read_journal
from rolloutcore.spec.lifecycle import Phase

TAINT_MARGIN_S = 1.0  # TAINTED within the transfer deadline plus this


# ------------------------------------------------------------------------ backends


@dataclass(frozen=True)
class Backend:
    name: str
    worker_extension: str
    init_info: Callable[..., Any]  # (world_size=2) -> a TrainerInitInfo
    server_env: dict[str, str] = field(default_factory=dict)
    single_process: bool = True

    def server_args(self) -> list[str]:
        from rolloutcore.adapters.vllm_worker import GATEWAY_FENCE_CLS, LOAD_FORMAT

        return ["--weight-transfer-config", json.dumps({"backend": self.name}),
                "--worker-extension-cls", self.worker_extension, "--load-format", LOAD_FORMAT,
                "--middleware", GATEWAY_FENCE_CLS]


def _gloo_info(world_size: int = 2, buffer_bytes: int = 256 * 1024) -> Any:
    from rolloutcore.adapters.gloo_transfer import GlooTrainerInitInfo

    return GlooTrainerInitInfo(master_address="127.0.0.1", master_port=0,
                               world_size=world_size, packed_buffer_size_bytes=buffer_bytes,
                               timeout_s=120.0, rank=0)


GLOO = Backend("gloo", "rolloutcore.adapters.gloo_transfer.TransferWorkerExtension", _gloo_info)


# ------------------------------------------------------------------------ results


@dataclass
class Row:
    scenario: str
    backend: str
    checks: list[tuple[str, bool, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.checks.append((description, bool(ok), observed))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(ok for _d, ok, _o in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "backend": self.backend, "passed": self.passed,
                "checks": [{"description": d, "ok": ok, "observed": repr(o)[:300]}
                           for d, ok, o in self.checks],
                "evidence": self.evidence, "error": self.error}

    def failures(self) -> list[str]:
        out = [f"{d}: observed {o!r}" for d, ok, o in self.checks if not ok]
        return out + ([f"error: {self.error}"] if self.error else [])


# ------------------------------------------------------------------------ a session


class Session:
    """One server, its adapter stack, a journalled controller and the runner."""

    def __init__(self, backend: Backend, models: dict[str, Path], initial: str,
                 workdir: Path, *, transfer_base_s: float = 5.0,
                 server: VllmServer | None = None) -> None:
        self.backend = backend
        self.models = models
        self.workdir = workdir
        self.initial = initial
        # ``server``: already running on ``initial`` with (at least) the backend's
        # arguments, and left running by stop()
        self.own_server = server is None
        self.srv = server or VllmServer(
            models[initial].resolve(), extra_args=backend.server_args(),
            single_process=backend.single_process, env=backend.server_env,
            log_path=workdir / f"vllm-{initial}.log")
        self.transfer_policy = TransferPolicy(base_s=transfer_base_s)
        self.policy = RunnerPolicy(step_timeout_s=60.0, retries=2, drain_timeout_s=60.0,
                                   mutation_base_s=transfer_base_s + 1.0,
                                   mutation_floor_bytes_per_s=self.transfer_policy
                                   .floor_bytes_per_s)
        self.journal_path = workdir / f"journal-{initial}-{time.monotonic_ns()}.jsonl"
        self.init_world = 2
        self.source_override: Callable[[WeightTarget], WeightSource] | None = None
        self.taint_at: float | None = None
        self.http: HttpAdapter | None = None
        self.adapter: TransferAdapter | None = None
        self.runner: LifecycleRunner | None = None
        self.pid = -1
        self._journal: Any = None
        self.targets: dict[str, WeightTarget] = {}

    def target(self, version: str, generation: int) -> WeightTarget:
        label = INITIAL_LABEL if generation == 1 else f"{version}-gen{generation}"
        return checkpoint_target(self.models[version].resolve(), generation, label)

    def start(self) -> Session:
        if not self.srv.is_running():
            self.srv.start()
        self.pid = self.srv.pid
        self.http = HttpAdapter(self.srv.url, model=self.srv.served_model_name)
        self.adapter = TransferAdapter(
            self.http, base_url=self.srv.url, source_for=self._source,
            init_info=lambda: self.backend.init_info(world_size=self.init_world),
            policy=self.transfer_policy, http_timeout_s=120.0)
        controller, self._journal, _rec = open_controller(self.journal_path)
        self.runner = LifecycleRunner(controller, self.adapter, self.policy,
                                      on_step=self._on_step)
        out = self.runner.bootstrap(self.target(self.initial, 1))
        if out.trigger != "bootstrap_ok":
            raise RuntimeError(f"bootstrap failed: {out.reason}")
        return self

    def _on_step(self, step: str, outcome: str, seconds: float) -> None:
        if step == "mutate" and self.runner is not None and \
                self.runner.controller.phase is Phase.TAINTED:
            self.taint_at = time.monotonic()

    def _source(self, target: WeightTarget) -> WeightSource:
        if self.source_override is not None:
            return self.source_override(target)
        return CheckpointSource.of(target)

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self.own_server:
            self.srv.stop()

    def engine_view(self) -> dict[str, Any]:
        assert self.http is not None
        return {"label": self.http.read_label(), "identity": self.http.read_identity()}

    def probe_ok(self, target: WeightTarget) -> bool:
        assert self.http is not None
        ev = self.http.probe(target.probe_prompt, len(target.probe_tokens),
                             time.monotonic() + 60.0)
        return ev.tokens == target.probe_tokens


#: Where a session's server comes from when it is not started for it: a context that
#: holds one running server (a test's pool).
ServerSource = Callable[[], AbstractContextManager[list[VllmServer]]]


@contextmanager
def session(backend: Backend, models: dict[str, Path], initial: str,
            workdir: Path, server: VllmServer | None = None) -> Iterator[Session]:
    s = Session(backend, models, initial, workdir, server=server)
    try:
        yield s.start()
    finally:
        s.stop()


def _published_generations(journal: Path) -> list[int]:
    """Committed generations after every ``publish`` step the journal recorded."""
    _report, records = read_journal(journal)
    return [int(r.get("committed", 0)) for r in records if r.get("step") == "publish"]


# ------------------------------------------------------------------------ scenarios


def s_refuse_identity(s: Session, gen: int, declared: str, held: str, old: str) -> Row:
    row = Row("refuse_identity", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(declared, gen)
    s.source_override = lambda _t: CheckpointSource(s.models[held])
    try:
        rep = s.runner.update(target)
    finally:
        s.source_override = None
    mut = next((st for st in rep.steps if st.step == "mutate"), None)
    row.evidence.update(mutate=None if mut is None else mut.reason, steps=len(rep.steps))
    row.check("mutation refused with proof (mutate_refused)",
              mut is not None and mut.outcome != "mutate_ambiguous"
              and "refused before any byte" in mut.reason, mut)
    row.check("no call reached the engine's transfer API", not s.adapter.client.log.calls,
              s.adapter.client.log.calls)
    row.check("back to READY, not published", rep.final_phase is Phase.READY
              and not rep.published, rep.final_phase)
    view = s.engine_view()
    old_t = s.target(old, 1)
    row.check("engine untouched: label and identity of the old generation",
              view["identity"] == old_t.identity and view["label"] == s.runner.label_of(
                  s.runner.controller.control.committed), view)
    row.check("greedy output still the old generation's reference", s.probe_ok(old_t))
    return row


def s_init_refused(s: Session, gen: int, version: str, old: str) -> Row:
    row = Row("init_refused", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    s.init_world = 1  # the engine cannot be a receiver rank of a world of one
    try:
        rep = s.runner.update(s.target(version, gen))
    finally:
        s.init_world = 2
    mut = next((st for st in rep.steps if st.step == "mutate"), None)
    row.evidence.update(mutate=None if mut is None else mut.reason,
                        calls=s.adapter.client.log.calls)
    row.check("failed before the session started: refused, not ambiguous",
              mut is not None and mut.outcome != "mutate_ambiguous"
              and "before the session started" in mut.reason, mut)
    row.check("not TAINTED: READY, not published",
              rep.final_phase is Phase.READY and not rep.published, rep.final_phase)
    old_t = s.target(old, 1)
    view = s.engine_view()
    row.check("engine still holds the old generation", view["identity"] == old_t.identity, view)
    row.check("greedy output still the old generation's reference", s.probe_ok(old_t))
    return row


def s_full_cycle(s: Session, gen: int, version: str) -> Row:
    row = Row("full_cycle", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(version, gen)
    t0 = time.perf_counter()
    rep = s.runner.update(target)
    row.evidence.update(cycle_s=round(time.perf_counter() - t0, 4),
                        steps={k: round(v, 4) for k, v in rep.timings().items()},
                        transfer={k: round(v, 4) for k, v in s.adapter.last_timings.items()},
                        nbytes=target.nbytes)
    row.check("published", rep.published and rep.final_phase is Phase.READY,
              [(st.step, st.outcome) for st in rep.steps])
    view = s.engine_view()
    row.check("engine label is the target's", view["label"] == target.label, view["label"])
    row.check("engine identity (digest of the received bytes) is the target's",
              view["identity"] == target.identity, view["identity"])
    row.check("greedy output equals the target's reference", s.probe_ok(target))
    row.check("same server process", s.srv.is_running() and s.srv.pid == s.pid, s.srv.pid)
    return row


def _staged_update(s: Session, target: WeightTarget) -> CycleReport:
    """One update of the session's runner with staging on (its policy as it was after)."""
    assert s.runner is not None
    policy = s.runner.policy
    s.runner.policy = dataclasses.replace(policy, staged=True)
    try:
        return s.runner.update(target)
    finally:
        s.runner.policy = policy


def s_staged_cycle(s: Session, gen: int, version: str) -> Row:
    """A staged update over gloo: the trainer broadcasts while the engine serves, the
    worker receives into host buffers on a background thread, every rank's digest is
    checked before admissions close, and the closed window only installs."""
    row = Row("staged_cycle", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(version, gen)
    rep = _staged_update(s, target)
    row.evidence.update(window_s=round(rep.window_s, 4), staging_s=round(rep.staging_s, 4),
                        staged_bytes=rep.staged_bytes,
                        steps={k: round(v, 4) for k, v in rep.timings().items()})
    row.check("staged on every rank, then published", rep.published and rep.staged,
              [(st.step, st.outcome, st.reason[:80]) for st in rep.steps])
    row.check("every staged byte is the target's", rep.staged_bytes == target.nbytes,
              (rep.staged_bytes, target.nbytes))
    view = s.engine_view()
    row.check("engine label and identity are the target's",
              view == {"label": target.label, "identity": target.identity}, view)
    row.check("greedy output equals the target's reference", s.probe_ok(target))
    return row


class _FailingSource(WeightSource):
    """A trainer's source that dies after ``after`` tensors (the sender gone mid-stream)."""

    def __init__(self, inner: CheckpointSource, after: int) -> None:
        self.inner, self.after = inner, after

    @property
    def provenance(self) -> str:
        return self.inner.provenance

    def metadata(self) -> list[Any]:
        return self.inner.metadata()

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for i, pair in enumerate(self.inner):
            if i == self.after:
                raise ConnectionError(f"the trainer died after {i} tensors")
            yield pair


def s_staged_sender_fails(s: Session, gen: int, version: str, committed: str) -> Row:
    """The sender dies halfway through a staged update: the workers' buffers are
    incomplete, so the update is refused while the engine serves; nothing served was
    touched (never TAINTED), the engine still holds and serves the committed weights."""
    row = Row("staged_sender_fails", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(version, gen)
    good = s.target(committed, gen - 1)
    source = CheckpointSource(s.models[version].resolve())
    s.source_override = lambda _t: _FailingSource(source, len(source.entries) // 2)
    try:
        rep = _staged_update(s, target)
    finally:
        s.source_override = None
    row.evidence.update(refused=rep.staging_refused, staging_s=round(rep.staging_s, 4))
    row.check("refused while serving, not TAINTED", not rep.published and not rep.staged
              and rep.final_phase is Phase.READY and bool(rep.staging_refused),
              (rep.final_phase, rep.staging_refused))
    row.check("admissions never closed", "request_update" not in [st.step for st in rep.steps],
              [st.step for st in rep.steps])
    view = s.engine_view()
    row.check("the engine holds the committed weights",
              view == {"label": good.label, "identity": good.identity}, view)
    row.check("greedy output is the committed generation's reference", s.probe_ok(good))
    return row


def s_wrong_model(s: Session, gen: int, committed: str) -> Row:
    """A trainer (without the publisher's manifest check) sends a model of another shape:
    the embedding has one extra row. The transfer fails inside the engine after the
    session started: ambiguous, TAINTED. A bare transfer of the committed weights fails
    next (the control: vLLM's layerwise reload replays the buffered wrong tensor); the
    verified re-admission onto the committed generation, which closes what the failure
    left first, succeeds and the engine serves the committed weights again."""
    import torch

    from rolloutcore.adapters.weight_transfer import TensorSource
    from rolloutcore.rl.weights import snapshot, state_identity

    row = Row("wrong_model", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    good = s.target(committed, gen - 1)
    tensors = dict(CheckpointSource(s.models[committed]))
    name = next(n for n in sorted(tensors) if n.endswith("embed_tokens.weight"))
    emb = tensors[name]
    tensors[name] = torch.cat([emb, emb[:1]])  # one row more than the served model has
    wrong = snapshot(tensors)
    identity = state_identity(wrong)
    target = WeightTarget(gen, f"wrong-gen{gen}", identity, "trainer:wrong-shape",
                          good.probe_prompt, good.probe_tokens,
                          nbytes=sum(t.numel() * t.element_size() for t in wrong.values()),
                          probe_logprobs=good.probe_logprobs)
    s.source_override = lambda _t: TensorSource(wrong, provenance=identity)
    try:
        rep = s.runner.update(target)
    finally:
        s.source_override = None
    mut = next((st for st in rep.steps if st.step == "mutate"), None)
    row.evidence.update(mutate=None if mut is None else mut.reason[:200],
                        tensor=name, calls=s.adapter.client.log.calls)
    row.check("the transfer failed after the session started: ambiguous, TAINTED",
              rep.final_phase is Phase.TAINTED and mut is not None
              and mut.outcome == "mutate_ambiguous", mut)
    # The negative control: the committed weights sent again as they are, without
    # closing what the failure left, fail too (vLLM replays the buffered wrong tensor).
    bare = s.adapter.mutate(good, time.monotonic() + 30.0)
    row.evidence.update(bare=f"{bare.outcome.value}: {bare.observed[:160]}")
    row.check("control: a bare transfer after the failure fails as well",
              bare.outcome.value != "completed", bare.observed[:160])
    out = s.runner.readmit(good, who="transfer scenario: wrong model")
    row.evidence.update(readmit=out.reason[:200])
    row.check("the verified re-admission onto the committed generation succeeds",
              out.trigger == "readmit_ok", out)
    view = s.engine_view()
    row.check("the engine holds the committed weights again (identity)",
              view["identity"] == good.identity, view)
    row.check("greedy output is the committed generation's reference", s.probe_ok(good))
    return row


def _interrupt_midway(s: Session, action: Callable[[], None], box: dict[str, float]) -> None:
    """Wait until the trainer has broadcast some bytes (or the update call was sent),
    then act."""
    assert s.adapter is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        eng = s.adapter.active_engine  # None until this transfer's trainer_init returned
        pending = s.adapter.client.pending is not None
        sent = getattr(eng, "bytes_sent", None)
        calls = s.adapter.client.log.calls
        if pending and eng is not None and ((sent is not None and sent > 0) or (
                sent is None and any(c.endswith(" update") for c in calls))):
            box["sent"] = float(sent or 0)
            box["at"] = time.monotonic()
            action()
            return
        time.sleep(0.0005)


def s_frozen(s: Session, gen: int, version: str) -> Row:
    row = Row("frozen", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(version, gen)
    box: dict[str, float] = {}
    th = threading.Thread(target=_interrupt_midway, args=(s, s.srv.freeze, box), daemon=True)
    th.start()
    rep = s.runner.update(target)
    t_end = time.monotonic()
    deadline = s.transfer_policy.deadline(target.nbytes)
    taint_at = s.taint_at or t_end
    to_taint = taint_at - box.get("at", taint_at)
    row.evidence.update(freeze_to_tainted_s=round(to_taint, 3), deadline_s=round(deadline, 3),
                        bytes_sent_at_freeze=box.get("sent"), stuck=s.adapter.stuck[-1:],
                        calls=s.adapter.client.log.calls)
    row.check("server frozen midway through the broadcast", "at" in box, box)
    row.check("TAINTED, not published", rep.final_phase is Phase.TAINTED and not rep.published,
              rep.final_phase)
    row.check("TAINTED within the deadline plus a margin",
              to_taint <= deadline + TAINT_MARGIN_S, (to_taint, deadline))
    row.check("classified ambiguous", any(st.step == "mutate" and st.outcome ==
                                          "mutate_ambiguous" for st in rep.steps))
    row.check("the stuck transfer is reported, not waited on", bool(s.adapter.stuck),
              s.adapter.stuck[-1:])
    try:
        s.runner.controller.admit("after-freeze")
        admitted = True
    except IllegalTransition:
        admitted = False
    row.check("no admission", not admitted)
    s.srv.kill()
    published = _published_generations(s.journal_path)
    row.check("after the kill, the journal shows nothing published for the target",
              s.runner.controller.control.committed == gen - 1
              and gen not in published and gen not in s.runner.targets,
              {"published generations": published,
                                                "committed": s.runner.controller.control
                                                .committed})
    return row


def s_killed(s: Session, gen: int, version: str) -> Row:
    row = Row("killed", s.backend.name)
    assert s.runner is not None and s.adapter is not None
    target = s.target(version, gen)
    box: dict[str, float] = {}
    th = threading.Thread(target=_interrupt_midway, args=(s, s.srv.kill, box), daemon=True)
    th.start()
    rep = s.runner.update(target)
    t_end = time.monotonic()
    taint_at = s.taint_at or t_end
    to_taint = taint_at - box.get("at", taint_at)
    mut = next((st for st in rep.steps if st.step == "mutate"), None)
    row.evidence.update(kill_to_tainted_s=round(to_taint, 3), bytes_sent_at_kill=box.get("sent"),
                        mutate=None if mut is None else mut.reason)
    row.check("server killed midway through the broadcast", "at" in box, box)
    row.check("TAINTED, not published", rep.final_phase is Phase.TAINTED and not rep.published,
              rep.final_phase)
    row.check("classified ambiguous", mut is not None and mut.outcome == "mutate_ambiguous", mut)
    row.check("TAINTED promptly (< 3 s after the kill)", to_taint < 3.0, to_taint)
    return row


def run_all(backend: Backend, models: dict[str, Path], workdir: Path,
            *, killed: bool = True, large: bool = False, echo: bool = False,
            servers: ServerSource | None = None) -> list[Row]:
    """All scenarios: one server for refuse/init/full/frozen, a second one for killed
    (each started for its session, or taken from ``servers``: on ``v1``, not ``large``)."""
    rows: list[Row] = []

    def guarded(name: str, fn: Callable[[], Row]) -> None:
        try:
            rows.append(fn())
        except Exception as e:
            rows.append(Row(name, backend.name, error=f"{type(e).__name__}: {e}"))
        if echo:
            print_table(rows[-1:], header=False)

    a, b, c = ("large", "large_v2", "large") if large else ("v1", "v2", "v1neg")
    if servers is not None and large:
        raise ValueError("pooled servers run v1, not the large model")
    source: ServerSource = servers or (lambda: nullcontext([]))
    with source() as srv, session(backend, models, a, workdir, *srv) as s:
        guarded("refuse_identity", lambda: s_refuse_identity(s, 2, b, c, a))
        guarded("init_refused", lambda: s_init_refused(s, 2, b, a))
        guarded("full_cycle", lambda: s_full_cycle(s, 2, b))
        guarded("staged_sender_fails", lambda: s_staged_sender_fails(s, 3, a, b))
        guarded("staged_cycle", lambda: s_staged_cycle(s, 3, a))
        guarded("wrong_model", lambda: s_wrong_model(s, 4, a))
        guarded("frozen", lambda: s_frozen(s, 4, c if c != a else b))
    if killed:
        with source() as srv2, session(backend, models, a, workdir, *srv2) as s2:
            guarded("killed", lambda: s_killed(s2, 2, b))
    return rows


def print_table(rows: list[Row], out: Any = sys.stdout, *, header: bool = True) -> None:
    if header:
        print(f"{'scenario':<17}{'backend':<8}{'result':<7}evidence", file=out)
    for r in rows:
        ev = {k: v for k, v in r.evidence.items() if k not in ("calls", "stuck", "steps")}
        print(f"{r.scenario:<17}{r.backend:<8}{'PASS' if r.passed else 'FAIL':<7}"
              f"{json.dumps(ev, default=str)[:300]}", file=out, flush=True)
        for f in r.failures():
            print(f"    FAILED {f}", file=out)


def main(argv: list[str] | None = None) -> int:
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-killed", action="store_true")
    args = ap.parse_args(argv)
    models = build_models(DEFAULT_OUT)
    with tempfile.TemporaryDirectory(prefix="rc-transfer-") as tmp:
        rows = run_all(GLOO, models, Path(tmp), killed=not args.no_killed, echo=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([r.as_json() for r in rows], indent=2))
    return 0 if all(r.passed for r in rows) else 1


__all__ = ["GLOO", "Backend", "Row", "Session", "free_port", "print_table", "run_all",
           "s_frozen", "s_full_cycle", "s_init_refused", "s_killed", "s_refuse_identity",
           "session"]

if __name__ == "__main__":
    raise SystemExit(main())
