"""``make demo``: an online-RL run that learns through RolloutCore, on real vLLM servers.

Two vLLM CPU servers (the tiny Llama, random weights ``v1``) form a fleet behind the
gateway. Producer threads ask the gateway for groups (``n`` samples of one prompt, one
admission each) as fast as the bounded buffer lets them; the trainer (plain torch, a
GRPO-style group-relative objective, no KL) takes a batch of groups, drops those older
than ``max_lag`` generations, takes one optimiser step and publishes its live weights to
the fleet (a verified, staged fleet update over the gloo transfer: the weights travel
into every member's staging buffers while it serves, each member's digest of the bytes
it received is checked before any closes, and the closed window only installs; probe
reference from the trainer's model), every step. Halfway, one member's server is
SIGKILLed while the new weights are on their way to it: its staging is refused (nothing
it served was touched), the other member publishes, the server is restarted, re-admitted
(verified, caught up) and serves again while training goes on. One line per step; at
the end the checks (reward above the threshold, every record's generation and identity
against the journal, the journal against the fleet spec, behaviour logprobs against the
trainer's recomputation) and the pictures
(reward per step, the fleet's timeline, the lag histogram: PNGs and one HTML page).
"""

from __future__ import annotations

import collections
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rolloutcore.adapters.weight_transfer import TransferAdapter, TransferPolicy
from rolloutcore.check.fleet_trace import check_fleet_file
from rolloutcore.conformance.demos.grpo import (
    GRPOTrainer,
    TrainSample,
    group_advantages,
    load_model,
)
from rolloutcore.conformance.demos.task import SuccessorTask
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.conformance.fleet_scenarios import POLICY, TRANSFER_BASE_S, kill_midway
from rolloutcore.conformance.harness import Check
from rolloutcore.engine.runner import RunnerPolicy
from rolloutcore.engine.targets import load_references
from rolloutcore.fleet import Fleet
from rolloutcore.gateway.core import Gateway, GatewayConfig
from rolloutcore.gateway.server import ServerThread
from rolloutcore.rl import GroupError, RolloutBuffer, RolloutClient, Sampling, engine_logprobs_mode
from rolloutcore.rl.publish import Publisher, PublishError
from rolloutcore.rl.weights import LiveSources, state_identity
from rolloutcore.spec.fleet import FleetPhase
from rolloutcore.spec.triggers import Trigger
from rolloutcore.trajectories.format import iter_records, write_jsonl
from rolloutcore.trajectories.provenance import CONSISTENT, JournalIndex

Say = Callable[[str], None]


@dataclass(frozen=True)
class RLConfig:
    steps: int = 30
    groups_per_step: int = 8
    samples_per_group: int = 8
    producers: int = 4
    max_lag: int = 1  # groups older than this (in generations) are dropped
    #: Unacknowledged work, at most (None: one and a half batches: half a batch is
    #: generated while the trainer trains and publishes, and is in flight then).
    buffer_samples: int | None = None
    lr: float = 2e-3
    fault_step: int | None = 15  # kill a member mid-transfer at this step's publish
    #: Mean reward over the last three steps must reach it (None: the run checks its
    #: machinery only, and reports the reward: a run too short to learn in).
    threshold: float | None = 0.7
    tail_tokens: int = 16
    seed: int = 0
    engines: int = 2

    def __post_init__(self) -> None:
        if self.steps < 4:
            raise ValueError("steps must be >= 4")
        if self.fault_step is not None and not 1 <= self.fault_step < self.steps - 1:
            raise ValueError(f"fault_step must be in 1..{self.steps - 2}")

    @property
    def rejoin_step(self) -> int | None:
        """The step at which the restarted member is re-admitted: halfway between the
        fault and the end, so that it serves again for the rest of the run."""
        if self.fault_step is None:
            return None
        return self.fault_step + max(1, (self.steps - self.fault_step) // 2)


@dataclass
class RLResult:
    config: RLConfig
    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    journal: str | None = None
    records: str | None = None
    pictures: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "config": asdict(self.config), "steps": self.steps,
                "checks": [c.as_json() for c in self.checks],
                "evidence": self.evidence, "journal": self.journal, "records": self.records,
                "pictures": self.pictures, "error": self.error}


class _Producers:
    """Threads that keep the buffer full of groups (they wait at its bound)."""

    def __init__(self, n: int, make: Callable[[random.Random], Any], buffer: Any,
                 seed: int, samples: int) -> None:
        self.buffer, self.samples = buffer, samples
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(make, random.Random(
            seed * 1000 + i)), name=f"rl-producer-{i}", daemon=True) for i in range(n)]

    def _run(self, make: Callable[[random.Random], Any], rng: random.Random) -> None:
        failures = 0
        while not self.stop.is_set():
            if not self.buffer.reserve(self.samples):  # generate only what fits
                return
            try:
                group = make(rng)
            except GroupError as e:  # e.g. a queue wait that ran out during a long update
                self.buffer.cancel(self.samples)
                failures += 1
                self.errors.append(str(e))
                if failures >= 5:
                    return
                self.stop.wait(0.5)
                continue
            failures = 0
            if not self.buffer.put(group, reserved=True):
                return

    def __enter__(self) -> _Producers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.buffer.close()
        for t in self.threads:
            t.join(60)


class RLRun:
    """One run: the rig's servers as a fleet behind the gateway, the trainer, the loop."""

    def __init__(self, cfg: RLConfig, rig: Any, work: Path, say: Say) -> None:
        self.cfg, self.rig, self.work, self.say = cfg, rig, work, say
        self.result = RLResult(cfg)

    def check(self, description: str, ok: bool, observed: Any = None) -> bool:
        self.result.checks.append(Check(description, bool(ok), observed))
        self.say(f"  [{'ok' if ok else 'FAIL'}] {description}"
                 + ("" if ok or observed is None else f": {observed!r}"[:400]))
        return bool(ok)

    # ------------------------------------------------------------------------ set-up

    def _fleet(self, sources: Any) -> Any:
        self.adapters = {n: TransferAdapter(e.http, base_url=e.server.url,
                                            source_for=sources.source_for,
                                            policy=TransferPolicy(base_s=TRANSFER_BASE_S),
                                            http_timeout_s=120.0)
                         for n, e in self.rig.engines.items()}
        policy = RunnerPolicy(step_timeout_s=POLICY.step_timeout_s,
                              pause_timeout_s=POLICY.pause_timeout_s,
                              drain_timeout_s=POLICY.drain_timeout_s,
                              mutation_base_s=TRANSFER_BASE_S + 1.0, staged=True)
        journal = self.work / "rl-fleet.jsonl"
        journal.unlink(missing_ok=True)
        self.result.journal = str(journal)
        urls = self.rig.urls()
        return Fleet([(n, self.adapters[n], urls[n]) for n in self.rig.engines],
                     journal=journal, min_serving=1, policy=policy, fsync=False)

    def _open(self, model_dir: Path, weights: dict[str, torch.Tensor]) -> tuple[
            Fleet, Gateway, Publisher, str, dict[int, str]]:
        """The rig's servers as a fleet on v1 behind a gateway, and a publisher of the
        trainer's live weights (``weights``: the trainer's, checked to be v1's); with the
        servers' logprobs mode and the identity of each generation so far."""
        sources = LiveSources()
        fleet = self._fleet(sources)
        boot = fleet.bootstrap(self.rig.targets(1))
        self.check("both servers bootstrap on v1 and the fleet opens",
                   all(o.trigger == Trigger.BOOTSTRAP_OK for o in boot.values())
                   and fleet.phase == FleetPhase.READY, {n: o.trigger for n, o in boot.items()})
        v1 = self.rig.targets(1)[self.rig.names[0]]
        self.check("the trainer starts from the weights the servers loaded (identity of v1)",
                   state_identity(weights) == v1.identity)
        refs = load_references(model_dir)
        probe = next(p for p in refs["probes"] if p["name"] == "long")
        mode = engine_logprobs_mode(self.rig.urls().values())
        self.check(f"the servers report raw logprobs (logprobs_mode {mode}): the policy's own "
                   "log-softmax at temperature 1", mode == "raw_logprobs", mode)
        gw = Gateway(fleet, GatewayConfig(model="tiny", queue_wait_s=300.0),
                     target_of=_no_checkpoints)
        publisher = Publisher(fleet, sources, probe_prompt=probe["prompt_token_ids"],
                              probe_tokens=len(probe["output_token_ids"]),
                              eos_id=refs.get("eos_token_id"), gateway=gw)
        return fleet, gw, publisher, mode, {1: v1.identity}

    def run(self) -> RLResult:


        cfg = self.cfg
        models = build_models(DEFAULT_OUT)
        torch.manual_seed(cfg.seed)
        task = self._task(models["v1"])
        by_ids = {p.token_ids: p for p in task.all_prompts()}
        # float32 weights and activations, attention summed in float64: the trainer's
        # recomputation is then exact, and the logprob check measures vLLM's error alone.
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # one line per step
        model = load_model(models["v1"])
        trainer = GRPOTrainer(model, lr=cfg.lr)
        fleet, gw, publisher, mode, identities = self._open(models["v1"], trainer.state_dict())
        batch = cfg.groups_per_step * cfg.samples_per_group
        buffer = RolloutBuffer(max_lag=cfg.max_lag,
                               max_samples=cfg.buffer_samples or batch + batch // 2)
        records = self.work / "rl-records.jsonl"
        self.result.records = str(records)
        records.unlink(missing_ok=True)
        self.say(f"== task: {task.describe()}")
        self.say(f"== {cfg.steps} steps of {cfg.groups_per_step} groups x "
                 f"{cfg.samples_per_group} samples; publish every step; max_lag "
                 f"{cfg.max_lag}; a member killed mid-transfer at step {cfg.fault_step}")
        try:
            with ServerThread(gw) as url:
                client = RolloutClient(url, "tiny", logprobs_mode=mode)
                make = self._producer(task, client, records)
                with _Producers(cfg.producers, make, buffer, cfg.seed,
                                cfg.samples_per_group) as producers:
                    self._loop(trainer, task, by_ids, buffer, publisher, gw, identities,
                               producers)
                client.close()
        finally:
            gw.close()
            fleet.close()
        self._final_checks(buffer, identities)
        return self.result

    # ------------------------------------------------------------------ the task

    def _task(self, model_dir: Path) -> Any:
        return SuccessorTask(model_dir, tail_tokens=self.cfg.tail_tokens)

    def _producer(self, task: Any, client: RolloutClient, records: Path
                  ) -> Callable[[random.Random], Any]:
        """What a producer thread makes: a group of ``samples_per_group`` samples of one
        prompt, recorded (every group generated is, consumed or not)."""
        sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=task.max_tokens)
        writing = threading.Lock()

        def make(rng: random.Random) -> Any:
            prompt = task.prompts(rng, 1)[0]
            group = client.generate_group(prompt.token_ids, self.cfg.samples_per_group,
                                          sampling)
            with writing:
                write_jsonl(records, group.records(), append=True)
            return group
        return make

    def _train_samples(self, taken: list[Any], task: Any, by_ids: dict[Any, Any],
                       generation: int) -> tuple[list[TrainSample], list[float],
                                                 list[Any]]:
        """The batch's training samples, rewards, and per sample the behaviour logprobs
        to compare with the trainer's (None: not of the trainer's generation)."""
        samples, rewards, current = [], [], []
        for t in taken:
            g = t.group
            prompt = by_ids[g.prompt_ids]
            rs = [task.reward(prompt, s.token_ids) for s in g.samples]
            rewards += rs
            for s, adv in zip(g.samples, group_advantages(rs), strict=True):
                samples.append(TrainSample(g.prompt_ids, s.token_ids, adv,
                                           task.scored_tokens))
                current.append(s.logprobs if t.lag == 0 else None)
        return samples, rewards, current

    # -------------------------------------------------------------------------- loop

    def _loop(self, trainer: Any, task: Any, by_ids: dict[Any, Any], buffer: Any,
              publisher: Any, gw: Any, identities: dict[int, str],
              producers: _Producers) -> None:

        cfg, rig = self.cfg, self.rig
        victim = rig.victim
        generation = 1
        restart: threading.Thread | None = None
        readmitted_at: int | None = None
        max_diff, compared = 0.0, 0
        ev = self.result.evidence
        for step in range(1, cfg.steps + 1):
            t0 = time.perf_counter()
            taken: list[Any] = []
            while len(taken) < cfg.groups_per_step:
                more = buffer.take(cfg.groups_per_step - len(taken), generation, timeout=300)
                if not more:
                    raise RuntimeError(f"step {step}: no groups within 300 s; producers: "
                                       f"{producers.errors[-3:]}")
                taken += more
            wait_s = time.perf_counter() - t0
            samples, rewards, current = self._train_samples(taken, task, by_ids, generation)
            stats = trainer.step(samples)
            for behaviour, recomputed in zip(current, stats.logprobs, strict=True):
                if behaviour is not None and behaviour:
                    compared += len(behaviour)
                    max_diff = max(max_diff, max(abs(a - b) for a, b in zip(
                        behaviour, recomputed, strict=True)))
            if restart is not None and step == cfg.rejoin_step:
                restart.join(300)  # the operator's restart (the server's start-up time)
                t2 = time.perf_counter()
                out = gw.start_readmit(victim, f"rl demo: {victim} restarted").result()
                ev["readmit_s"] = round(time.perf_counter() - t2, 3)
                self.check(f"step {step}: {victim} restarted on v1 and re-admitted (verified: "
                           f"label, identity, probe), caught up to generation {generation}",
                           out.trigger == Trigger.READMIT_OK, out.reason)
                readmitted_at = step
            fault = step == cfg.fault_step
            killer, box = None, dict[str, float]()
            if fault:
                killer = threading.Thread(target=kill_midway, args=(
                    self.adapters[victim], rig.engines[victim], box), daemon=True)
                killer.start()
            t1 = time.perf_counter()
            first: Any = None  # the fault step's first report, if its publish was aborted
            try:
                pub = publisher.publish(trainer.model, f"step-{step}")
            except PublishError as e:
                first = e.report
                if not fault:
                    raise RuntimeError(str(e)) from None
                # The killed member's staging was refused while it still held rollouts
                # (an episode waiting on its tool): the fleet cannot publish around them
                # (they would outlive their generation) and aborted. Once they let go
                # (their next turn fails on the dead server), the same weights go again.
                ev["fault_first_publish"] = str(e)[:200]
                self.say(f"  step {step}: {e}; waiting for {victim}'s rollouts to end")
                member = publisher.fleet.members[victim]
                if not member.controller.wait_drained(120):
                    raise RuntimeError(f"{victim} still holds rollouts 120 s after its "
                                       "staging was refused") from None
                try:
                    pub = publisher.publish(trainer.model, f"step-{step}-again")
                except PublishError as again:
                    raise RuntimeError(str(again)) from None
            update_s = time.perf_counter() - t1
            generation = pub.generation
            identities[generation] = pub.identity
            if killer is not None:
                killer.join(60)
                reports = [r for r in (first, publisher.fleet.last_report) if r is not None]
                refused = next((r.members[victim].staging_refused for r in reports
                                if victim in r.members
                                and r.members[victim].staging_refused), None)
                # Killed while its bytes travelled, its staging is refused (nothing it
                # served was touched); killed once they had all arrived, a step after its
                # staging fails. Either way the update ends, on the other member (retried
                # once if the victim's rollouts held the first attempt back).
                self.check(f"step {step}: {victim}'s server was SIGKILLed while the weights "
                           f"were on their way to it; generation {generation} is published "
                           f"on the other member",
                           "at" in box and victim not in pub.committed_on
                           and len(pub.committed_on) > 0,
                           {"killed": box, "refused": refused, "aborted_first": first
                            is not None, "quarantined": pub.quarantined,
                            "committed_on": pub.committed_on})
                ev["fault_update_s"] = round(update_s, 3)
                restart = threading.Thread(target=rig.engines[victim].restart_process,
                                           args=("v1",), daemon=True)
                restart.start()
            # Acknowledged once published: what is generated next is on the new policy,
            # except the half batch the bound let through meanwhile (lag 1).
            buffer.ack(taken)
            lags = [t.lag for t in taken]
            members = publisher.fleet.last_report.members.values()
            staged_mb = sum(r.staged_bytes for r in members) / 1e6
            window_s = max((r.window_s for r in members if r.staged), default=0.0)
            line = {"step": step, "staged_mb": round(staged_mb, 2),
                    "window_s": round(window_s, 3),
                    "mean_reward": round(statistics.fmean(rewards), 4),
                    "generation": generation, "lag_mean": round(statistics.fmean(lags), 3),
                    "lag_max": max(lags), "update_s": round(update_s, 3),
                    "wait_s": round(wait_s, 3), "train_s": round(stats.seconds, 3),
                    "serving": sorted(pub.committed_on), "dropped": buffer.dropped,
                    "engines": dict(collections.Counter(t.group.engine for t in taken))}
            self.result.steps.append(line)
            self.say(f"step {step:3d}  reward {line['mean_reward']:.3f}  generation "
                     f"{generation:3d}  lag {line['lag_mean']:.2f} (max {line['lag_max']})  "
                     f"update {update_s:5.2f} s (staged {staged_mb:.1f} MB, closed "
                     f"{window_s:4.2f} s)  wait {wait_s:5.2f} s  on "
                     f"{','.join(line['serving'])}" + ("  <- member killed mid-transfer"
                                                       if fault else "  <- re-admitted"
                                                       if step == readmitted_at else ""))
        ev["lag_histogram"] = dict(sorted(buffer.lags.items()))
        ev.update(logprob_max_abs_diff=max_diff, logprob_tokens_compared=compared,
                  readmitted_at_step=readmitted_at, stale_dropped=buffer.dropped,
                  producer_errors=len(producers.errors),
                  resubmitted=0)

    # ------------------------------------------------------------------------ checks

    def _final_checks(self, buffer: Any, identities: dict[int, str]) -> None:
        r, cfg, ev = self.result, self.cfg, self.result.evidence
        rewards = [s["mean_reward"] for s in r.steps]
        last = statistics.fmean(rewards[-3:])
        ev.update(reward_first=rewards[0], reward_last3=round(last, 4))
        if cfg.threshold is None:
            self.say(f"  reward: first step {rewards[0]:.3f}, last three steps {last:.3f} "
                     "(not checked: a run too short to learn in)")
        else:
            self.check(f"the reward rose: first step {rewards[0]:.3f}, last three steps "
                       f"{last:.3f} >= {cfg.threshold}", last >= cfg.threshold > rewards[0])
        assert r.journal is not None and r.records is not None
        index = JournalIndex(r.journal)
        verdicts, wrong_identity = 0, []
        bad: list[str] = []
        for pos, rec in enumerate(iter_records(r.records)):
            v = index.check(pos, rec)
            verdicts += 1
            if v.verdict != CONSISTENT:
                bad.append(f"{pos}: {v.verdict} {v.reasons}")
            if identities.get(rec.version) != rec.identity:
                wrong_identity.append(pos)
        ev["records"] = verdicts
        self.check(f"every one of {verdicts} trajectory records agrees with the journal "
                   "(records verify: admission, generation, identity, release)",
                   verdicts > 0 and not bad, bad[:3])
        self.check("every record's identity is the digest of the bytes the trainer sent for "
                   "its generation", not wrong_identity, wrong_identity[:5])
        verdict = check_fleet_file(Path(r.journal))
        self.check("the fleet journal passes the fleet trace checker", verdict.accepted,
                   verdict.message)
        diff, n = ev["logprob_max_abs_diff"], ev["logprob_tokens_compared"]
        self.check(f"behaviour logprobs of generation-current samples agree with the "
                   f"trainer's recomputation: max |diff| {diff:.2e} nats over {n} tokens "
                   "(<= 1e-4)", n > 0 and diff <= 1e-4)
        at = ev.get("readmitted_at_step")
        if cfg.fault_step is not None:
            served = sum(s["engines"].get(self.rig.victim, 0) for s in r.steps
                         if at is not None and s["step"] >= at)
            self.check(f"after its re-admission {self.rig.victim} served groups again "
                       f"({served} groups)", at is not None and at < cfg.steps
                       and served > 0, {"readmitted_at_step": at, "groups": served})


def _no_checkpoints(checkpoint: str, generation: int, label: str) -> Any:
    raise ValueError("this gateway publishes the trainer's live weights, not checkpoints")


def write_pictures(result: RLResult, lags: dict[int, int], out: Path) -> list[Path]:
    from rolloutcore.report import write_report

    assert result.journal is not None
    return write_report(Path(result.journal), out, records=Path(result.records)
                        if result.records else None, steps=result.steps, lags=lags or None)


def run_rl_demo(cfg: RLConfig, artifacts: Path, say: Say, *, pool: Any = None,
                runner: type[RLRun] = RLRun, name: str = "rl-demo") -> RLResult:
    """Start the servers (or lease them from ``pool``), run (``runner``: make demo's own
    trainer, or TRL's), check, draw; the artifacts go under ``artifacts/name-<time>``."""
    from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
    from rolloutcore.conformance.fleet_scenarios import FleetRig

    work = artifacts / time.strftime(f"{name}-%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    say(f"== building the tiny model and starting {cfg.engines} vLLM servers (under {work})")
    t0 = time.perf_counter()
    rig = FleetRig.vllm(build_models(DEFAULT_OUT), work, cfg.engines, pool=pool)
    say(f"   {cfg.engines} servers up in {time.perf_counter() - t0:.0f} s: "
        + ", ".join(f"{n}={u}" for n, u in rig.urls().items()))
    run = runner(cfg, rig, work, say)
    try:
        run.run()
    except Exception as e:  # reported as the run's failure, with what was measured
        run.result.error = f"{type(e).__name__}: {e}"
    finally:
        if pool is not None:
            rig.restore()
        rig.close()
    result = run.result
    if result.journal and Path(result.journal).exists() and result.steps:
        try:
            lags = result.evidence.get("lag_histogram", {})
            result.pictures = [str(p) for p in write_pictures(result, lags, work / "report")]
            say(f"== pictures: {work / 'report' / 'index.html'}")
        except Exception as e:
            run.check("the pictures were written", False, f"{type(e).__name__}: {e}")
    (work / f"{name}.json").write_text(json.dumps(result.as_json(), indent=2, default=str))
    return result


def main(*, as_json: bool = False, artifacts: Path | None = None,
         cfg: RLConfig | None = None, runner: type[RLRun] = RLRun,
         name: str = "rl-demo") -> int:
    from rolloutcore.conformance.demos.lifecycle_story import DEFAULT_ARTIFACTS

    stream = sys.stderr if as_json else sys.stdout

    def say(text: str) -> None:
        print(text, file=stream, flush=True)

    t0 = time.perf_counter()
    result = run_rl_demo(cfg or RLConfig(), artifacts or DEFAULT_ARTIFACTS, say,
                         runner=runner, name=name)
    if result.error:
        say(f"error: {result.error}")
    if as_json:
        print(json.dumps(result.as_json(), indent=2, sort_keys=True, default=str))
    say(f"\n{'PASS' if result.passed else 'FAIL'} ({time.perf_counter() - t0:.0f} s)")
    return 0 if result.passed else 1


__all__ = ["RLConfig", "RLResult", "RLRun", "main", "run_rl_demo"]
