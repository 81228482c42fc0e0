"""The scenario corpus, engine-agnostic: each runs unchanged on real vLLM and on the
simulator (see :mod:`rolloutcore.conformance.harness`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rolloutcore.adapters.contract import PauseEvidence, PauseMode, ProbeEvidence, WeightTarget
from rolloutcore.conformance.harness import (
    Scenario,
    ScenarioContext,
    background,
    wait_until,
)
from rolloutcore.engine import postconditions as post
from rolloutcore.engine.controller import IllegalTransition
from rolloutcore.engine.runner import ProbeMode, RunnerPolicy, taint_label
from rolloutcore.spec.lifecycle import Phase
from rolloutcore.spec.triggers import Op, Trigger


def first_diff(a: Sequence[int] | None, b: Sequence[int] | None) -> int | None:
    """Index of the first differing token (None if equal)."""
    if a is None or b is None:
        return 0
    if tuple(a) == tuple(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def probe_verdict(ev: ProbeEvidence | None, target: WeightTarget) -> post.Outcome:
    """What the postconditions say of one probe's evidence against ``target``."""
    expected = post.Expected(label=target.label, identity=target.identity,
                             probe_logprobs=target.probe_logprobs,
                             probe_tokens=None if target.probe_logprobs else target.probe_tokens,
                             first_since_reset=False)
    return post.decide(post.Decision(Op.PROBE, (ev,) if ev else (), expected,
                                     None if ev else "no probe"))


def _seq_of(records: list[dict[str, Any]], step: str, param: str | None = None) -> list[int]:
    return [int(r["seq"]) for r in records
            if r.get("step") == step and (param is None or r.get("param") == param)]


# --------------------------------------------------------------------------- bootstrap


def s_bootstrap(ctx: ScenarioContext) -> None:
    e = ctx.engine
    runner = ctx.bootstrap()
    initial = e.initial_target()
    label, ident = e.label(), e.identity()
    ctx.check("the label read from the fresh engine is its startup label",
              label == e.initial_label, label)
    ctx.check("the identity the engine reports is the initial checkpoint's content digest",
              ident == initial.identity, (ident or "")[:16])
    probes = ctx.probes()
    verdict = probe_verdict(probes[-1] if probes else None, initial)
    ctx.check("the bootstrap probe scores every prompt position as the initial reference "
              "does (within tolerance)", verdict.trigger == Trigger.PROBE_OK, verdict.reason)
    binding, res = runner.generate("rollout-1", e.prompt("probe"), e.probe_tokens)
    ref = e.reference("v1", "probe")
    ctx.check("a rollout bound to generation 1 returns the v1 reference",
              binding.generation == 1 and res.tokens == ref,
              {"generation": binding.generation, "first_diff": first_diff(res.tokens, ref)})
    ctx.evidence.update(label=label, identity=ident, probe_tokens=list(res.tokens),
                        bootstrap_probe_hits=probes[-1].prefix_hits if probes else None)


# ----------------------------------------------------------------------------- no-op


def s_noop_cycle(ctx: ScenarioContext) -> None:
    e = ctx.engine
    runner = ctx.bootstrap()
    p, n = e.prompt("probe"), e.probe_tokens
    _, before = runner.generate("before", p, n)
    id_before = e.identity()
    report = runner.update(e.target(2, "v1", label="v1-gen2"))
    ctx.cycle_evidence("cycle", report)
    ctx.check("the same-weights cycle drains, quiesces, invalidates, validates, resumes and "
              "publishes", report.published and report.final_phase is Phase.READY,
              [f"{s.step}:{s.outcome}" for s in report.steps])
    _, after = runner.generate("after", p, n)
    ref = e.reference("v1", "probe")
    ctx.check("greedy output is identical before and after the cycle, and is the reference",
              before.tokens == after.tokens == ref,
              {"before_vs_after": first_diff(before.tokens, after.tokens),
               "vs_reference": first_diff(after.tokens, ref)})
    id_after = e.identity()
    ctx.check("the weight identity is unchanged", id_before == id_after,
              [(id_before or "")[:16], (id_after or "")[:16]])
    ctx.evidence.update(tokens=list(after.tokens))


# ------------------------------------------------------------------------ idle update


def s_update_idle(ctx: ScenarioContext) -> None:
    e = ctx.engine
    pid = e.pid()
    runner = ctx.bootstrap()
    target = e.target(2, "v2")
    report = runner.update(target)
    ctx.cycle_evidence("cycle", report)
    ctx.check("the update with nothing in flight is published", report.published,
              report.final_phase.value)
    binding, out = runner.generate("after", e.prompt("probe"), e.probe_tokens)
    ref = e.reference("v2", "probe")
    ctx.check("post-update greedy output equals the target's reference",
              out.tokens == ref and binding.generation == 2,
              {"generation": binding.generation, "first_diff": first_diff(out.tokens, ref)})
    ctx.check("the same server process serves before and after (no restart)", e.pid() == pid,
              [pid, e.pid()])
    label, ident = e.label(), e.identity()
    ctx.check("the engine reports the target's label and identity",
              label == target.label and ident == target.identity,
              {"label": label, "identity": (ident or "")[:16]})
    ctx.evidence.update(tokens=list(out.tokens), pid=pid)


# ------------------------------------------------------------------------ live update


def s_update_live(ctx: ScenarioContext) -> None:
    """The rollout outlasts the update's request by a cause the scenario controls, not by
    how fast the machine generates: the engine is paused in ``keep`` mode (outside
    RolloutCore) before the rollout is sent, so its request waits in the engine; the
    update is requested, and only once the controller drains is the engine resumed."""
    e = ctx.engine
    runner = ctx.bootstrap()
    target = e.target(2, "v2")
    roll, n = e.prompt("rollout"), e.rollout_tokens
    e.pause_raw(PauseMode.KEEP)
    with background(lambda: runner.generate("rollout-live", roll, n)) as box:
        bound = wait_until(lambda: runner.controller.bound_count() == 1, 60.0)
        ctx.check(f"a {n}-token rollout is bound, held in the engine, when the update is "
                  "requested", bound and "t_end" not in box,
                  {"bound": runner.controller.bound_count()})
        with background(lambda: runner.update(target)) as update:
            try:
                draining = wait_until(lambda: runner.controller.phase is Phase.DRAINING,
                                      60.0)
                ctx.check("the update waits for the rollout: the controller drains, the "
                          "rollout is not done", draining and "t_end" not in box,
                          runner.controller.phase.value)
            finally:  # whatever happened, nothing may stay held (the threads join on it)
                e.resume_raw()
    for done in (update, box):
        if "error" in done:
            raise done["error"]
    report = update["result"]
    ctx.cycle_evidence("cycle", report)
    binding, res = box["result"]
    ctx.check("the update is published", report.published, report.final_phase.value)
    ctx.check("the drain held the update until the rollout finished",
              report.drain_wait_s > 0.0 and report.steps[0].outcome == "drained",
              {"drain_wait_s": round(report.drain_wait_s, 3)})
    recs = ctx.journal_steps()
    rel = _seq_of(recs, "release", "rollout-live")
    mb = _seq_of(recs, "mutate_begin")
    ctx.check("the journal shows the rollout's release before mutate_begin",
              bool(rel) and bool(mb) and rel[0] < mb[0], {"release": rel, "mutate_begin": mb})
    ref1 = e.reference("v1", "rollout")
    ctx.check("the in-flight rollout's tokens equal the old generation's reference",
              binding.generation == 1 and res.tokens == ref1,
              {"generation": binding.generation, "tokens": len(res.tokens),
               "first_diff": first_diff(res.tokens, ref1)})
    b2, later = runner.generate("rollout-after", roll, n)
    ref2 = e.reference("v2", "rollout")
    ctx.check("a later rollout equals the new generation's reference",
              b2.generation == 2 and later.tokens == ref2,
              {"generation": b2.generation, "first_diff": first_diff(later.tokens, ref2)})
    ctx.evidence.update(drain_wait_s=round(report.drain_wait_s, 4),
                        live_tokens=list(res.tokens), later_tokens=list(later.tokens),
                        bindings={"rollout-live": binding.generation,
                                  "rollout-after": b2.generation})


# ------------------------------------------------------------------------ stale cache


def s_stale_cache(ctx: ScenarioContext) -> None:
    e = ctx.engine
    p, n = e.prompt("probe"), e.probe_tokens
    ref2 = e.reference("v2", "probe")

    def hits_of(fn: Any) -> tuple[int, Any]:
        h0 = e.prefix_hits()
        out = fn()
        return e.prefix_hits() - h0, out

    # Negative control, outside RolloutCore: a mutation with invalidation skipped.
    h1, _ = hits_of(lambda: e.raw_generate(p, n))
    h2, _ = hits_of(lambda: e.raw_generate(p, n))
    ctx.check("a repeated prompt shows prefix-cache hits before any update", h2 > 0,
              {"first": h1, "second": h2})
    e.mutate_outside("v2")
    h3, stale = hits_of(lambda: e.raw_generate(p, n))
    ctx.check("outside RolloutCore (invalidation skipped) the next request reuses old KV",
              h3 > 0, {"hits": h3})
    ctx.check("... and its output differs from the target's reference",
              stale.tokens != ref2, {"first_diff": first_diff(stale.tokens, ref2)})
    ctx.evidence.update(control_hits=[h1, h2, h3], stale_tokens=list(stale.tokens))
    e.restore()

    # Through RolloutCore, with the greedy probe: unlike a scored one (vLLM reads no prefix
    # cache for a request asking for prompt log-probabilities), it is the first request
    # after the invalidation that reads the cache, so stale KV would show in its hits.
    ctx.policy = replace(ctx.policy, probe_mode=ProbeMode.GREEDY)
    runner = ctx.bootstrap()  # its probe is this prompt: cached under v1 now
    hw, _ = hits_of(lambda: runner.generate("warm", p, n))
    ctx.check("the prompt is cached under the old generation before the update", hw > 0,
              {"hits": hw})
    report = runner.update(e.target(2, "v2"))
    ctx.cycle_evidence("cycle", report)
    ctx.check("the update is published", report.published, report.final_phase.value)
    probe = ctx.probes()[-1]
    ctx.check("the first request after the update has zero old-generation prefix hits",
              probe.prefix_hits == 0, {"hits": probe.prefix_hits})
    ctx.check("... and equals the target's reference", probe.tokens == ref2,
              {"first_diff": first_diff(probe.tokens, ref2)})
    hs, second = hits_of(lambda: runner.generate("second", p, n))
    ctx.check("the second request shows hits again (new generation's KV) and equals the "
              "reference", hs > 0 and second[1].tokens == ref2,
              {"hits": hs, "first_diff": first_diff(second[1].tokens, ref2)})
    ctx.evidence.update(warm_hits=hw, probe_hits=probe.prefix_hits, second_hits=hs)


# ------------------------------------------------------------------------ failed load


def s_failed_load(ctx: ScenarioContext) -> None:
    e = ctx.engine
    runner = ctx.bootstrap()
    c = runner.controller
    p, n = e.prompt("probe"), e.probe_tokens
    target = e.target(2, "v2")

    refused = e.arm_refused_mutation(target)
    rep1 = runner.update(refused)
    ctx.cycle_evidence("refused_cycle", rep1)
    mut1 = [s for s in rep1.steps if s.step == "mutate"]
    ctx.check("a load refused before it touched the model is mutate_refused: the old "
              "generation resumes", not rep1.published and c.phase is Phase.READY
              and c.control.committed == 1 and bool(mut1) and mut1[0].outcome ==
              "mutate_refused", {"phase": c.phase.value, "mutate": [
                  (s.outcome, s.reason[:120]) for s in mut1]})
    _, out = runner.generate("after-refusal", p, n)
    ref1 = e.reference("v1", "probe")
    ctx.check("after the refusal the engine still serves the old generation's reference",
              out.tokens == ref1, {"first_diff": first_diff(out.tokens, ref1)})

    failing = e.arm_failing_mutation(target)
    rep2 = runner.update(failing)
    ctx.cycle_evidence("failed_cycle", rep2)
    mut2 = [s for s in rep2.steps if s.step == "mutate"]
    ctx.check("a load that dies halfway is ambiguous and latches TAINTED",
              c.phase is Phase.TAINTED and not rep2.published and bool(mut2)
              and mut2[0].outcome == "mutate_ambiguous",
              {"phase": c.phase.value, "mutate": [(s.outcome, s.reason[:160]) for s in mut2]})
    try:
        runner.generate("after-taint", p, n)
        admitted = True
    except IllegalTransition:
        admitted = False
    ctx.check("nothing is admitted once TAINTED", not admitted, {"admitted": admitted})
    recs = ctx.journal_steps()
    amb = _seq_of(recs, "mutate_ambiguous")
    after = [r["step"] for r in recs if amb and int(r["seq"]) > amb[0]]
    ctx.check("after the ambiguous mutation the journal holds no resume, admit or publish",
              bool(amb) and not {"resume_begin", "admit", "publish"} & set(after),
              {"steps_after": after})
    naive = e.naive_resume()
    ref2 = e.reference("v2", "probe")
    garbage = naive["tokens"] is not None and tuple(naive["tokens"]) not in (ref1, ref2)
    ctx.check("a naive resume shows what was prevented: the engine dies or serves garbage",
              bool(naive["died"]) or garbage, naive)
    ctx.evidence.update(naive_resume=naive)


def s_refused_forged_label(ctx: ScenarioContext) -> None:
    """Someone relabels the engine by hand (it still holds generation 1's weights); the
    next load is refused with proof that nothing moved. The refusal's read shows the
    forged label, so the old evidence does not stand again: the mutation is ambiguous,
    the engine TAINTED and fenced, never READY under a label nobody published."""
    e = ctx.engine
    runner = ctx.bootstrap()
    c = runner.controller
    e.relabel_outside("set-by-hand")
    target = e.arm_refused_mutation(e.target(2, "v2"))
    rep = runner.update(target)
    ctx.cycle_evidence("refused_forged_cycle", rep)
    mut = [s for s in rep.steps if s.step == "mutate"]
    ctx.check("the worker refused the load, but the read after it shows the forged label: "
              "mutate_ambiguous, TAINTED, not published",
              bool(mut) and mut[0].outcome == "mutate_ambiguous" and "set-by-hand" in
              mut[0].reason and c.phase is Phase.TAINTED and not rep.published,
              {"phase": c.phase.value, "mutate": [(s.outcome, s.reason[:200]) for s in mut]})
    check_fenced(ctx, rep)


# ------------------------------------------------------------------- wrong checkpoint


def s_wrong_checkpoint(ctx: ScenarioContext) -> None:
    """The transfer reports success but installed other weights than the target declares
    (v1neg: same names, dtypes and shapes as v1 and v2). A label is not an identity: the
    label is right, the identity is not, and nothing is published."""
    e = ctx.engine
    runner = ctx.bootstrap()
    c = runner.controller
    target = e.arm_wrong_checkpoint(e.target(2, "v2"), "v1neg")
    rep = runner.update(target)
    ctx.cycle_evidence("wrong_checkpoint_cycle", rep)
    mut = [s for s in rep.steps if s.step == "mutate"]
    val = [s for s in rep.steps if s.step == "validate"]
    ctx.check("the mutation itself reported success", bool(mut) and mut[0].outcome ==
              "mutate_ok", [(s.outcome, s.reason[:120]) for s in mut])
    recs = ctx.journal_steps()
    found = [r["evidence"]["evidence"][0]["label"] for r in recs
             if r.get("step") == "validate_mismatch"]
    ctx.check("validation read the declared label (finalised by the mutation)",
              found == [target.label], found)
    ctx.check("validation sees another identity: validate_mismatch, TAINTED, not published",
              bool(val) and val[-1].outcome == "validate_mismatch"
              and c.phase is Phase.TAINTED and not rep.published
              and c.control.committed == 1,
              {"phase": c.phase.value, "validate": [(s.outcome, s.reason[:120]) for s in val]})
    try:
        runner.generate("after-mismatch", e.prompt("probe"), e.probe_tokens)
        admitted = True
    except IllegalTransition:
        admitted = False
    ctx.check("nothing is admitted once TAINTED", not admitted, {"admitted": admitted})
    check_fenced(ctx, rep)


def check_fenced(ctx: ScenarioContext, report: Any) -> None:
    """TAINTED leaves the engine fenced: paused, relabelled, so that a direct caller is
    neither served by nor misled about weights that were never published."""
    e = ctx.engine
    label, paused = e.label(), e.is_paused_raw()
    want = taint_label(report.target)
    ctx.check("the tainted engine is fenced: paused and labelled " + want,
              report.fenced is True and paused and label == want,
              {"fenced": report.fenced, "paused": paused, "label": label})


# --------------------------------------------------------------------- pause semantics


#: Tokens out before a pause is sent (the engine's own count, never a time), and the
#: length of the rollouts paused: as long as the tiny model's 512 positions allow, so that
#: the pause call has the most time to land while the rollout runs (its latency, not the
#: engine's speed, is what a short rollout raced: 256 tokens took 0.42 s in a loaded CI).
PAUSE_AFTER_TOKENS, PAUSED_ROLLOUT_TOKENS = 8, 480


def _observe_pause(ctx: ScenarioContext, mode: PauseMode, n: int, hold: float) -> (
        dict[str, Any]):
    e = ctx.engine
    roll = e.prompt("rollout")
    obs: dict[str, Any] = {"mode": mode.value}
    before = e.generated_tokens()
    with background(lambda: e.raw_generate(roll, n)) as first:
        wait_until(lambda: e.generated_tokens() - before >= PAUSE_AFTER_TOKENS, 60.0)
        t0 = time.perf_counter()
        e.pause_raw(mode)
        t_paused = time.perf_counter()
        obs["pause_s"] = round(t_paused - t0, 4)
        obs["first_done_when_pause_returned"] = "t_end" in first
        with background(lambda: e.raw_generate(e.prompt("probe"), e.probe_tokens)) as second:
            time.sleep(hold)
            obs["is_paused"] = e.is_paused_raw()
            obs["first_done_while_paused"] = "t_end" in first and first["t_end"] > t_paused
            obs["second_done_while_paused"] = "t_end" in second
            t_resume = time.perf_counter()
            e.resume_raw()
    for key, box in (("first", first), ("second", second)):
        if "error" in box:
            obs[key] = {"error": str(box["error"])}
            continue
        res = box["result"]
        obs[key] = {"finish_reason": res.finish_reason, "tokens": len(res.tokens),
                    "after_resume_s": round(box["t_end"] - t_resume, 4),
                    "token_ids": list(res.tokens)}
    return obs


def s_pause_semantics(ctx: ScenarioContext) -> None:
    e = ctx.engine
    roll, n = e.prompt("rollout"), e.rollout_tokens
    ref1 = e.reference("v1", "rollout")
    ref_probe = e.reference("v1", "probe")
    t0 = time.perf_counter()
    full = e.raw_generate(roll, n)
    t_full = time.perf_counter() - t0
    ctx.check("an undisturbed rollout equals the reference", full.tokens == ref1,
              {"seconds": round(t_full, 3), "first_diff": first_diff(full.tokens, ref1)})
    # The paused rollouts are longer: their undisturbed run (its first n tokens checked
    # above's way) is what each mode's output is compared with.
    long_n = PAUSED_ROLLOUT_TOKENS
    long_ref = tuple(e.raw_generate(roll, long_n).tokens)
    ctx.check("a long undisturbed rollout begins with the reference", len(long_ref) == long_n
              and long_ref[:n] == ref1, {"tokens": len(long_ref)})
    # Held a while: long enough to see a request sent meanwhile is queued, not refused.
    hold = max(0.1, 0.3 * t_full)
    obs = {m.value: _observe_pause(ctx, m, long_n, hold) for m in PauseMode}

    def tok(m: str, k: str) -> tuple[int, ...]:
        return tuple(obs[m][k].get("token_ids") or ())

    a = obs["abort"]["first"]
    ctx.check("abort: the in-flight request ends with finish_reason abort and a strict "
              "prefix of the reference", a.get("finish_reason") == "abort"
              and 0 < len(tok("abort", "first")) < long_n
              and tok("abort", "first") == long_ref[:len(tok("abort", "first"))],
              {k: a.get(k) for k in ("finish_reason", "tokens")})
    w = obs["wait"]
    ctx.check("wait: the pause returns only once the in-flight request has finished, whole "
              "and equal to the reference", w["first_done_when_pause_returned"]
              and tok("wait", "first") == long_ref,
              {"pause_s": w["pause_s"], "tokens": w["first"].get("tokens")})
    k = obs["keep"]
    ctx.check("keep: the in-flight request is frozen while paused and finishes after resume, "
              "equal to the reference (weights unchanged)",
              not k["first_done_when_pause_returned"] and not k["first_done_while_paused"]
              and tok("keep", "first") == long_ref,
              {"after_resume_s": k["first"].get("after_resume_s"),
               "tokens": k["first"].get("tokens")})
    ctx.check("in every mode a request sent while paused is queued, not refused, and served "
              "after resume", all(not obs[m]["second_done_while_paused"]
                                  and tok(m, "second") == ref_probe for m in obs),
              {m: obs[m]["second"].get("after_resume_s") for m in obs})
    ctx.check("is_paused reads true while paused, in every mode",
              all(obs[m]["is_paused"] for m in obs), {m: obs[m]["is_paused"] for m in obs})

    # Why the spec forbids keep (mutant pause_keep_mode): a rollout across a reload.
    before = e.generated_tokens()
    with background(lambda: e.raw_generate(roll, long_n)) as spanning:
        wait_until(lambda: e.generated_tokens() - before >= PAUSE_AFTER_TOKENS, 60.0)
        e.pause_raw(PauseMode.KEEP)
        e.mutate_outside("v2")
        e.resume_raw()
    span = tuple(spanning["result"].tokens) if "result" in spanning else ()
    ref2 = e.reference("v2", "rollout")
    split = first_diff(span, long_ref)
    ctx.check("keep across a reload: the rollout starts as the old policy and continues as "
              "neither (it spans two policies; nothing in the response says so)",
              len(span) == long_n and split is not None and split > 0
              and span[:n] != ref2, {"tokens": len(span), "equal_to_v1_for": split})
    ctx.evidence["pause_observed"] = {m: {kk: vv for kk, vv in o.items()} for m, o in
                                      obs.items()}
    for o in ctx.evidence["pause_observed"].values():
        for key in ("first", "second"):
            o[key] = {kk: vv for kk, vv in o[key].items() if kk != "token_ids"}
    ctx.evidence["keep_across_reload_equal_to_v1_for"] = split
    e.restore()

    # Through RolloutCore: the wait-mode pause drains an orphan (a request the engine
    # runs that no binding covers) before the mutation.
    runner = ctx.bootstrap()
    with background(lambda: e.raw_generate(roll, n), join_timeout=30.0) as orphan:
        wait_until(lambda: e.running_requests() >= 1, 60.0)
        report = runner.update(e.target(2, "v2"))
        ctx.cycle_evidence("cycle", report)
        if e.is_paused_raw():  # clean-up only (the checks above already saw it)
            e.resume_raw()
    ctx.check("the update with an orphan in flight is published", report.published,
              report.final_phase.value)
    pauses = [c.evidence for c in (ctx.recorder.of("pause") if ctx.recorder else [])
              if isinstance(c.evidence, PauseEvidence)]
    last = pauses[-1] if pauses else None
    ctx.check("pause(wait) drained it: paused, 0 running after the call",
              last is not None and last.paused_read_back is True and last.running_after == 0,
              None if last is None else {"paused": last.paused_read_back,
                                         "running_after": last.running_after})
    o_tokens = tuple(orphan["result"].tokens) if "result" in orphan else ()
    ctx.check("the orphan finished under the old weights (equal to the old reference)",
              o_tokens == ref1, {"first_diff": first_diff(o_tokens, ref1)})


# ----------------------------------------------------------------------- pause timeout


def s_pause_timeout(ctx: ScenarioContext) -> None:
    """A wait-mode pause whose reply outlives its step's deadline: the engine did pause
    (vLLM stops scheduling at once and reports paused), but the controller cannot know.
    The controlled cause: the pause's reply is held past the deadline (the fault proxy in
    front of the real server, the simulator's ``late`` fault), never the machine's speed.
    The update is cancelled, and READY must again mean an engine that runs."""
    e = ctx.engine
    ctx.policy = RunnerPolicy(step_timeout_s=30.0, pause_timeout_s=1.0, retries=3,
                              retry_backoff_s=0.0, drain_timeout_s=60.0)
    runner = ctx.bootstrap()
    c = runner.controller
    e.inject("pause", "late", times=None)
    try:
        report = runner.update(e.target(2, "v2"))
    finally:
        e.clear_faults()
    ctx.cycle_evidence("cycle", report)
    pauses = [st for st in report.steps if st.step == "pause"]
    ctx.check("the pause step failed at its one deadline, in one attempt (no time left to "
              "retry)", [(st.outcome, st.attempts) for st in pauses] == [("pause_failed", 1)],
              [(st.outcome, st.attempts, round(st.seconds, 2)) for st in pauses])
    steps = [st.step for st in report.steps]
    ctx.check("the engine was resumed before admissions reopened",
              steps[-1:] == ["resume"] and report.steps[-1].outcome == "resume_ok", steps)
    ctx.check("the update was cancelled: READY, generation 1 still committed",
              c.phase is Phase.READY and c.control.committed == 1 and not report.published,
              {"phase": c.phase.value, "committed": c.control.committed})
    ctx.evidence.update(pause_s=round(pauses[0].seconds, 3) if pauses else None)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("bootstrap", "fresh engine: label read, identity, greedy output equals the "
             "initial reference", s_bootstrap),
    Scenario("noop_cycle", "a full cycle onto the same weights: output identical before and "
             "after", s_noop_cycle),
    Scenario("update_idle", "update with no rollout in flight: target reference, same PID",
             s_update_idle),
    Scenario("update_live", "update requested during a live long rollout: drain holds, old "
             "tokens for it, new tokens after", s_update_live),
    Scenario("stale_cache", "negative control: skipped invalidation reuses old KV; "
             "RolloutCore's first request has zero old hits", s_stale_cache),
    Scenario("pause_semantics", "abort / wait / keep as observed, and the spec's assumptions "
             "about them", s_pause_semantics),
    Scenario("pause_timeout", "a wait-mode pause past its deadline cancels the update; the "
             "engine must run again", s_pause_timeout),
    Scenario("wrong_checkpoint", "a mutation that installs another checkpoint than the one "
             "declared (equal manifest) is caught before publish: TAINTED",
             s_wrong_checkpoint),
    Scenario("refused_forged_label", "a refused load on an engine relabelled by hand is "
             "ambiguous (the read after it shows the forged label): TAINTED, fenced",
             s_refused_forged_label),
    Scenario("failed_load", "a refused load resumes the old generation; a load dying halfway "
             "latches TAINTED; a naive resume kills the engine", s_failed_load,
             destructive=True),
)}
