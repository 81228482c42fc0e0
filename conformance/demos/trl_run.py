"""``rolloutcore demo --trl``: TRL's own GRPOTrainer learns through RolloutCore, on real
vLLM servers.

The rig of ``make demo`` (two vLLM CPU servers with the tiny Llama behind the gateway, the
successor task, a verified publish over the gloo transfer) with TRL 1.16's
``GRPOTrainer`` in place of the project's own loop: its loss (``dapo``), advantages,
optimiser and config are TRL's; RolloutCore enters through :class:`TRLBridge`'s two hooks
(``rollout_func`` and a callback). Every step: TRL asks for a batch (one group per prompt,
one admission each, on the generation just published), scores it, takes one optimiser
step, and the callback publishes the weights (verified on every member). Halfway, one
member's server is SIGKILLed while the new weights are on their way to it: it is
quarantined, the other member publishes, the server is restarted and re-admitted while
training goes on. The checks are ``make demo``'s: reward above the threshold, every
record against the journal, the journal against the fleet spec, and the engine's
behaviour logprobs against TRL's model recomputing them.
"""

from __future__ import annotations

import collections
import os
import random
import statistics
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from rolloutcore.conformance.demos.grpo import TrainSample, load_model, token_logprobs
from rolloutcore.conformance.demos.rl_run import RLConfig, RLResult, RLRun, Say, run_rl_demo
from rolloutcore.conformance.demos.rl_run import main as rl_main
from rolloutcore.conformance.demos.task import SuccessorTask
from rolloutcore.conformance.fixtures.tiny_model import DEFAULT_OUT, build_models
from rolloutcore.conformance.fleet_scenarios import kill_midway
from rolloutcore.gateway.server import ServerThread
from rolloutcore.integrations.trl import TRLBridge
from rolloutcore.rl import Group, RolloutClient, Sampling
from rolloutcore.rl.publish import Published
from rolloutcore.spec.triggers import Trigger

#: TRL's defaults this run changes, each for a reason: fp32 on CPU (TRL defaults to bf16,
#: which the logprob check could not hold to 1e-4), no gradient checkpointing (a tiny
#: model), no KL term (TRL's default too), a constant learning rate, no reports or saves.
TRL_ARGS: dict[str, Any] = dict(bf16=False, use_cpu=True, gradient_checkpointing=False,
                                beta=0.0, lr_scheduler_type="constant", report_to="none",
                                save_strategy="no", logging_steps=1, disable_tqdm=True,
                                temperature=1.0, top_p=1.0)


class TRLRun(RLRun):
    """One run: the rig's fleet behind the gateway, TRL's GRPOTrainer through the bridge."""

    def run(self) -> RLResult:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked so
        from datasets import Dataset  # type: ignore[import-untyped]
        from transformers import AutoTokenizer, PrinterCallback
        from transformers.utils import logging as hf_logging

        with warnings.catch_warnings():  # TRL warns about the vLLM version: unused here
            warnings.simplefilter("ignore", UserWarning)
            from trl.trainer.grpo_config import GRPOConfig
            from trl.trainer.grpo_trainer import GRPOTrainer

        cfg = self.cfg
        models = build_models(DEFAULT_OUT)
        torch.manual_seed(cfg.seed)
        task = SuccessorTask(models["v1"], tail_tokens=cfg.tail_tokens)
        by_ids = {p.token_ids: p for p in task.all_prompts()}
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        model = load_model(models["v1"])
        tokenizer = AutoTokenizer.from_pretrained(str(models["v1"]))
        fleet, gw, publisher, mode, self.identities = self._open(
            models["v1"], dict(model.state_dict()))
        records = self.work / "trl-records.jsonl"
        records.unlink(missing_ok=True)
        self.result.records = str(records)
        self.model, self.gw = model, gw
        self.rewards: list[float] = []
        self.engines: collections.Counter[str] = collections.Counter()
        self.max_diff, self.compared = 0.0, 0
        self.restart: threading.Thread | None = None
        self.killer: threading.Thread | None = None
        self.box: dict[str, float] = {}
        self.t_step = time.perf_counter()

        def reward(prompts: list[Any], completions: list[Any], completion_ids: list[Any],
                   **kw: Any) -> list[float | None]:
            out: list[float | None] = [task.reward(by_ids[tuple(p)], c)
                   for p, c in zip(prompts, completion_ids, strict=True)]
            self.rewards += [r for r in out if r is not None]
            return out

        rng = random.Random(cfg.seed)
        ds = Dataset.from_dict({"prompt": [list(p.token_ids) for p in task.prompts(
            rng, cfg.steps * cfg.groups_per_step)]})
        batch = cfg.groups_per_step * cfg.samples_per_group
        args = GRPOConfig(output_dir=str(self.work / "trl"), max_steps=cfg.steps,
                          per_device_train_batch_size=batch,
                          num_generations=cfg.samples_per_group, learning_rate=cfg.lr,
                          max_completion_length=task.max_tokens, seed=cfg.seed, **TRL_ARGS)
        self.say(f"== task: {task.describe()}")
        self.say(f"== TRL GRPOTrainer (loss {args.loss_type}): {cfg.steps} steps of "
                 f"{cfg.groups_per_step} groups x {cfg.samples_per_group} samples; publish "
                 f"every step; a member killed mid-transfer at step {cfg.fault_step}")
        try:
            with ServerThread(gw) as url:
                client = RolloutClient(url, "tiny", logprobs_mode=mode)
                bridge = TRLBridge(client, publisher, num_generations=cfg.samples_per_group,
                                   sampling=Sampling(temperature=1.0, top_p=1.0,
                                                     max_tokens=task.max_tokens),
                                   records=records, on_group=self._on_group,
                                   before_publish=self._before_publish,
                                   on_publish=self._on_publish)
                self.bridge = bridge
                trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                                      train_dataset=ds, processing_class=tokenizer,
                                      rollout_func=bridge.rollout_func,
                                      callbacks=[bridge.callback])
                trainer.remove_callback(PrinterCallback)  # one line per step: ours
                trainer.train()
                client.close()
        finally:
            gw.close()
            fleet.close()
        ev = self.result.evidence
        ev.update(logprob_max_abs_diff=self.max_diff, logprob_tokens_compared=self.compared,
                  lag_histogram={0: sum(self.engines.values())},
                  trl_version=_version("trl"), transformers_version=_version("transformers"))
        self._final_checks(None, self.identities)
        return self.result

    # ------------------------------------------------------------------------ hooks

    def _on_group(self, group: Group) -> None:
        """Each group as it arrives: TRL's model is the policy that sampled it (it was
        published before this generation), so its logprobs must match the engine's."""
        self.engines[group.engine] += 1
        if group.generation != self.bridge.generation:
            return
        sampled = [s for s in group.samples if s.token_ids]
        samples = [TrainSample(group.prompt_ids, s.token_ids, 0.0, len(s.token_ids))
                   for s in sampled]
        for s, mine in zip(sampled, token_logprobs(self.model, samples), strict=True):
            self.compared += len(mine)
            self.max_diff = max(self.max_diff, max(abs(a - b) for a, b in zip(
                s.logprobs, mine, strict=True)))

    def _before_publish(self, step: int) -> None:
        cfg, rig, ev = self.cfg, self.rig, self.result.evidence
        victim = rig.victim
        if self.restart is not None and step == cfg.rejoin_step:
            self.restart.join(300)  # the operator's restart (the server's start-up time)
            out = self.gw.start_readmit(victim, f"trl demo: {victim} restarted").result()
            self.check(f"step {step}: {victim} restarted on v1 and re-admitted (verified), "
                       f"caught up to generation {self.bridge.generation}",
                       out.trigger == Trigger.READMIT_OK, out.reason)
            ev["readmitted_at_step"] = step
        if step == cfg.fault_step:
            self.killer = threading.Thread(target=kill_midway, args=(
                self.adapters[victim], rig.engines[victim], self.box), daemon=True)
            self.killer.start()

    def _on_publish(self, step: int, pub: Published) -> None:
        cfg, rig = self.cfg, self.rig
        victim = rig.victim
        self.identities[pub.generation] = pub.identity
        if self.killer is not None:
            self.killer.join(60)
            self.killer = None
            # Staged: killed while its bytes travel, its staging is refused (nothing it
            # served was touched); killed just after, a later step of its update fails
            # (quarantined). Either way the other member publishes.
            self.check(f"step {step}: {victim}'s server was SIGKILLed while the weights "
                       f"were on their way to it; generation {pub.generation} is published "
                       "on the other member", "at" in self.box
                       and victim not in pub.committed_on and len(pub.committed_on) > 0,
                       {"killed": self.box, "quarantined": pub.quarantined,
                        "committed_on": pub.committed_on})
            self.restart = threading.Thread(target=rig.engines[victim].restart_process,
                                            args=("v1",), daemon=True)
            self.restart.start()
        rewards, self.rewards = self.rewards, []
        line: dict[str, Any] = {"step": step, "mean_reward": round(statistics.fmean(rewards), 4)
                if rewards else 0.0, "generation": pub.generation, "lag_mean": 0.0,
                "lag_max": 0, "update_s": round(pub.seconds, 3),
                "step_s": round(time.perf_counter() - self.t_step, 3),
                "serving": sorted(pub.committed_on), "engines": dict(self.engines)}
        self.engines.clear()
        self.t_step = time.perf_counter()
        self.result.steps.append(line)
        self.say(f"step {step:3d}  reward {line['mean_reward']:.3f}  generation "
                 f"{pub.generation:3d}  update {pub.seconds:5.2f} s  step {line['step_s']:5.2f}"
                 f" s  on {','.join(line['serving'])}"
                 + ("  <- member killed mid-transfer" if step == cfg.fault_step else
                    "  <- re-admitted" if step == cfg.rejoin_step else ""))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def run_trl_demo(cfg: RLConfig, artifacts: Path, say: Say, *, pool: Any = None) -> RLResult:
    """Start the servers (or lease them from ``pool``), train with TRL, check, draw."""
    return run_rl_demo(cfg, artifacts, say, pool=pool, runner=TRLRun, name="trl-demo")


def main(*, as_json: bool = False, artifacts: Path | None = None,
         cfg: RLConfig | None = None) -> int:
    """``rolloutcore demo --trl`` (the full run: make demo's size, 30 steps)."""
    return rl_main(as_json=as_json, artifacts=artifacts, cfg=cfg, runner=TRLRun,
                   name="trl-demo")


__all__ = ["TRLRun", "main", "run_trl_demo"]
