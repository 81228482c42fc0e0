"""``rolloutcore fleet status|update|readmit|audit``: a fleet of vLLM servers named by a fleet
file (see :func:`rolloutcore.fleet.load_fleet_file`), its state kept in one fleet journal.

Every invocation is a fresh controller process: it recovers the fleet from its journal
(members replayed through the spec; each takes the restart the spec allows), acts, and
leaves the journal for the next one. The checkpoints the fleet installs are directories
with their probe reference (:mod:`rolloutcore.engine.targets`).

A fleet file with ``[control] store`` keeps the journal and the leadership on etcd: a
command that acts (update, readmit, audit) first wins the leadership (``--wait``
seconds for another controller to step down; exit 1 naming it otherwise), takes the
fleet over (every engine fenced with its epoch) and resigns when it ends, whatever
happens. A store that cannot be used, or a controller deposed in mid-command, exits 3
with one line. ``status`` only reads: the leader, and the members' state from the
journal on the store.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.cli.exits import BAD_INPUT, CANNOT_RUN, NEGATIVE, OK
from rolloutcore.fleet import (
    EngineConfig,
    Fleet,
    FleetConfig,
    FleetDeposed,
    FleetError,
    FleetFileError,
    StepHook,
    TargetFactory,
    load_fleet_file,
)

if TYPE_CHECKING:
    from rolloutcore.fleet.store import JournalStore



def journal_of(cfg: FleetConfig, fleet_file: str) -> Path:
    """The fleet's journal: the fleet file's ``journal``, or ``<file>.journal.jsonl``."""
    return cfg.journal or Path(fleet_file).with_suffix(".journal.jsonl")


def _emit(args: argparse.Namespace, obj: dict[str, Any], text: list[str]) -> None:
    if args.json:
        print(json.dumps(obj, indent=2, sort_keys=True, default=str))
    else:
        for line in text:
            print(line)


def _stop(args: argparse.Namespace, code: int, message: str, **fields: Any) -> int:
    """One ``error:`` line on stderr (with --json also the JSON object) and ``code``."""
    line = " ".join(message.split())
    if args.json:
        print(json.dumps({**fields, "error": line}, default=str))
    print(f"error: {line}", file=sys.stderr)
    return code


def _fail(args: argparse.Namespace, message: str) -> int:
    return _stop(args, BAD_INPUT, message)


def policy_targets(cfg: FleetConfig) -> TargetFactory:
    """The fleet's targets: checkpoints, or LoRA adapters on the base its file names."""
    from rolloutcore.engine.targets import target_factory

    if cfg.adapter is None:
        return target_factory()
    return target_factory(cfg.adapter.name, cfg.adapter.base)


def open_fleet(cfg: FleetConfig, fleet_file: str, *, min_serving: int | None = None,
               on_step: StepHook | None = None, journal: JournalStore | None = None
               ) -> Fleet:
    """The fleet a fleet file names, over HTTP adapters, recovered from its journal (a
    new journal: a fresh fleet, to bootstrap). Shared by the fleet commands and serve.
    ``journal``: where the journal lives (default: the fleet file's local journal); an
    :class:`~rolloutcore.fleet.store.EtcdJournalStore` makes it a takeover, and a
    takeover that finds a newer epoch's fence raises
    :class:`~rolloutcore.control.Deposed`."""
    from rolloutcore.adapters.http import HttpAdapter
    from rolloutcore.engine.runner import RunnerPolicy

    lora = cfg.adapter.name if cfg.adapter else None
    members: list[tuple[str, Any, str]] = []
    for e in cfg.engines:
        if e.transfer != "reload":
            raise FleetError(f"engine {e.name}: the command line updates by reload; weight "
                             f"transfer ({e.transfer}) is driven from the trainer process "
                             "(Python API: rolloutcore.fleet.Fleet with TransferAdapter)")
        if e.ray is not None and cfg.ray is not None:
            from rolloutcore.adapters.ray_engine import RayAdapter, connect, engine_handle

            connect(cfg.ray.address, cfg.ray.namespace)
            members.append((e.name, RayAdapter(engine_handle(e.ray, cfg.ray.namespace)),
                            e.url))
            continue
        members.append((e.name, HttpAdapter(e.url, model=e.model, token=e.token, lora=lora),
                        e.url))
    try:
        fleet = Fleet(members, journal=journal or journal_of(cfg, fleet_file),
                      min_serving=min_serving or cfg.min_serving,
                      policy=RunnerPolicy(staged=cfg.staged), on_step=on_step,
                      max_live=cfg.max_live, min_admitting=cfg.min_admitting,
                      peer_sources=cfg.peer_sources,
                      target_of=policy_targets(cfg))
        for name, adapter, _url in members:  # Ray's restarts: suspected, audited at once
            if hasattr(adapter, "on_replaced"):
                adapter.on_replaced = functools.partial(fleet.report_replaced, name)
        return fleet
    except FleetDeposed as e:
        if journal is None:
            raise
        from rolloutcore.control import Deposed

        # The takeover met a newer epoch's fence: not the fleet file's fault (exit 2)
        # but this controller's, deposed before it began.
        raise Deposed(str(e)) from None


class _Unreachable(Exception):
    """What hosts the engines cannot be reached (the Ray cluster): exit 3, one line."""


def _open(args: argparse.Namespace, cfg: FleetConfig, *, min_serving: int | None = None,
          journal: JournalStore | None = None) -> Fleet:
    def step(member: str, name: str, outcome: str, seconds: float) -> None:
        if not args.json:
            print(f"  [{member}] {name:<14} -> {outcome:<20} {seconds * 1e3:8.1f} ms",
                  flush=True)

    try:
        return open_fleet(cfg, args.fleet, min_serving=min_serving, on_step=step,
                          journal=journal)
    except ConnectionError as e:  # rolloutcore.adapters.ray_engine.RayUnavailable
        raise _Unreachable(str(e)) from None


Act = Callable[["JournalStore | None"], int]


def _controlled(args: argparse.Namespace, cfg: FleetConfig, act: Act, *,
                need_journal: str | None = None) -> int:
    """Run ``act`` on the fleet's journal: without ``[control]`` the local file (None);
    with it, the journal on etcd under this controller's leadership, won for this
    command (``--wait``) and resigned when it ends, also on error. ``need_journal``
    (what the command would do): a fleet without a journal yet is bad input, said
    before any campaign."""
    if cfg.control is None:
        if need_journal and not journal_of(cfg, args.fleet).exists():
            return _fail(args, _no_journal(args, need_journal))
        return act(None)
    from rolloutcore.cli.control_support import (
        ControlExit,
        deposed_line,
        has_journal,
        leader_json,
        leading,
        open_store,
    )
    from rolloutcore.control import StoreError
    from rolloutcore.fleet.store import EtcdJournalStore
    from rolloutcore.journal import JournalError

    try:
        if need_journal:
            with open_store(cfg.control) as store:
                if not has_journal(store):
                    return _fail(args, _no_journal(args, need_journal))
        with leading(cfg.control, wait_s=args.wait) as lead:
            try:
                return act(EtcdJournalStore(lead.store, lead, lead.controller_id))
            except (JournalError, StoreError) as e:  # Deposed is a JournalError
                return _stop(args, CANNOT_RUN, deposed_line(e))
    except ControlExit as e:
        return _stop(args, e.code, e.message, leader=leader_json(e.leader))


def _no_journal(args: argparse.Namespace, what: str) -> str:
    return (f"{args.fleet}: the fleet has no journal yet (nothing to {what}): run "
            "`fleet update --initial ...` first")


def _load(args: argparse.Namespace) -> FleetConfig:
    return load_fleet_file(args.fleet)


def fleet_status(args: argparse.Namespace) -> int:
    """Each member's phase, generation, identity, serving or quarantined, from the
    journal (read only), beside what each engine itself reports now (see
    :func:`_engine_now`)."""
    from rolloutcore.check.fleet_trace import fleet_state
    from rolloutcore.check.trace import TraceInputError

    leader: dict[str, Any] | None = None
    try:
        cfg = _load(args)
        if cfg.control is None:
            path = journal_of(cfg, args.fleet)
            state = fleet_state(path) if path.exists() else None
        else:
            from rolloutcore.cli.control_support import ControlExit

            try:
                state, leader = _store_state(cfg)
            except ControlExit as stop:
                return _stop(args, stop.code, stop.message)
    except (FleetFileError, TraceInputError) as err:
        return _fail(args, str(err))
    ray_error = _join_ray(cfg)
    rows: list[dict[str, Any]] = []
    for e in cfg.engines:
        row: dict[str, Any] = {"name": e.name, "url": e.url}
        if state is not None and e.name in state.members:
            c = state.members[e.name].control
            row.update(phase=c.phase.value, committed=c.committed,
                       serving=state.serving(e.name), quarantined=c.phase.value == "TAINTED",
                       last_audit=state.last_audit.get(e.name))
        else:
            row.update(phase="UNINITIALIZED", committed=0, serving=False, quarantined=False,
                       last_audit=None)
        row.update(_engine_now(cfg, e, ray_error))
        rows.append(row)
    fleet: dict[str, Any] = {"phase": state.fphase if state else "UNINITIALIZED",
                             "committed": state.fcommitted if state else 0,  # the frontier
                             "floor": state.ffloor if state else 0,
                             "min_serving": state.min_serving if state else cfg.min_serving,
                             "max_live": state.max_live if state else cfg.max_live,
                             "min_admitting": (state.min_admitting if state
                                               else cfg.min_admitting)}
    text = [f"fleet {fleet['phase']}, committed generation {fleet['committed']}, "
            f"min_serving {fleet['min_serving']}"]
    if fleet["max_live"] > 1:
        text[0] += (f"; rolling: frontier {fleet['committed']}, floor {fleet['floor']}, "
                    f"max_live {fleet['max_live']}, min_admitting {fleet['min_admitting']}")
    extra: dict[str, Any] = {}
    if cfg.control is not None:
        extra = {"store": cfg.control.store, "leader": leader}
        text.append(f"leader: {leader['id']} (pid {leader['pid']} on {leader['host']}), "
                    f"epoch {leader['epoch']}, lease {leader['lease_s_left']:g} s left"
                    if leader else f"no leader (store {cfg.control.store})")
    for r in rows:
        live = (f"engine says label {r.get('engine_label')!r}, identity "
                f"{str(r.get('engine_identity'))[:12]}, paused {r.get('engine_paused')}"
                if "engine_error" not in r else f"engine unreachable: {r['engine_error']}")
        if r["engine_via"] == "ray":
            live += f" (Ray actor, incarnation {r.get('engine_incarnation', '?')})"
        role = "serving" if r["serving"] else ("QUARANTINED" if r["quarantined"] else "-")
        audited = r["last_audit"]
        last = (f"; last audit {audited['outcome']} at {_when(audited.get('at'))}"
                if audited else "; never audited")
        text.append(f"  {r['name']:<12} {r['phase']:<13} gen {r['committed']:<3} {role:<11} "
                    f"{live}{last}")
    _emit(args, {"fleet": fleet, "members": rows, **extra}, text)
    return OK


def _join_ray(cfg: FleetConfig) -> str | None:
    """Join the cluster that hosts the fleet's Ray engines, once for every member; what
    stands in the way (None: joined, or no engine is in Ray)."""
    if cfg.ray is None or not any(e.ray for e in cfg.engines):
        return None
    try:
        from rolloutcore.adapters.ray_engine import connect

        connect(cfg.ray.address, cfg.ray.namespace)
    except ImportError:
        return "ray is not installed (pip install -e '.[ray]')"
    except ConnectionError as e:  # RayUnavailable
        return str(e)
    return None


def _engine_now(cfg: FleetConfig, e: EngineConfig, ray_error: str | None
                ) -> dict[str, Any]:
    """What the engine reports now, read the way the controller drives it: an engine in a
    Ray actor through its handle (with the actor's incarnation, which changes when Ray
    restarts it), any other over HTTP. Never the other way as a fallback: an actor that
    cannot be reached is reported so, though its HTTP routes might answer."""
    from rolloutcore.adapters.contract import AdapterError, EngineReport

    deadline = time.monotonic() + 5.0
    in_ray = cfg.ray if e.ray else None
    out: dict[str, Any] = {"engine_via": "ray" if in_ray else "http"}
    try:
        report: EngineReport
        if in_ray is not None and e.ray is not None:
            if ray_error is not None:
                raise AdapterError(ray_error)
            from rolloutcore.adapters.ray_engine import RayAdapter, engine_handle

            try:
                actor = RayAdapter(engine_handle(e.ray, in_ray.namespace))
            except ConnectionError as err:  # RayUnavailable: no such actor
                raise AdapterError(str(err)) from None
            out["engine_incarnation"] = actor.info(deadline)["incarnation"]
            report = actor.read_state(deadline)
        else:
            from rolloutcore.adapters.http import HttpAdapter

            with HttpAdapter(e.url, model=e.model, token=e.token,
                             lora=cfg.adapter.name if cfg.adapter else None,
                             timeouts=_short_timeouts()) as http:
                report = http.read_state(deadline)
        out.update(engine_label=report.label, engine_identity=report.identity,
                   engine_paused=report.paused)
    except (AdapterError, ValueError) as err:
        out["engine_error"] = str(err)[:200]
    return out


def _store_state(cfg: FleetConfig) -> tuple[Any, dict[str, Any] | None]:
    """The leader and the fleet's state from the journal on the store, read only: the
    journal exported to a temporary file (deleted afterwards) and read as a file's."""
    from rolloutcore.check.fleet_trace import fleet_state
    from rolloutcore.check.trace import TraceInputError
    from rolloutcore.cli.control_support import (
        leader_json,
        open_store,
        read_leader,
        unavailable,
    )
    from rolloutcore.control import StoreError, export_journal

    assert cfg.control is not None
    with open_store(cfg.control) as store:
        leader = leader_json(read_leader(store))
        with tempfile.TemporaryDirectory(prefix="rolloutcore-status-") as d:
            out = Path(d) / "journal.jsonl"
            try:
                n = export_journal(store, out)
            except StoreError as e:
                raise unavailable(store, e) from None
            try:
                return (fleet_state(out) if n else None), leader
            except TraceInputError as e:  # named as the store, not the temporary copy
                raise TraceInputError(str(e).replace(str(out), f"{store.url}/journal")
                                      ) from None


def _when(t: Any) -> str:
    if not isinstance(t, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def fleet_audit(args: argparse.Namespace) -> int:
    """Audit every READY engine of the fleet now (label, identity, run state, a probe),
    journalled: an engine found replaced is quarantined (fenced), an unreachable one
    stops serving until an audit passes. Exit 0 only if every audit passed."""
    try:
        cfg = _load(args)
    except FleetFileError as err:
        return _fail(args, str(err))
    return _controlled(args, cfg, lambda journal: _audit(args, cfg, journal),
                       need_journal="audit")


def _audit(args: argparse.Namespace, cfg: FleetConfig, journal: JournalStore | None
           ) -> int:
    from rolloutcore.engine.targets import TargetError

    try:
        fleet = _open(args, cfg, journal=journal)
    except _Unreachable as err:
        return _stop(args, CANNOT_RUN, str(err))
    except (FleetFileError, FleetError, ValueError) as err:
        return _fail(args, str(err))
    try:
        outcomes = fleet.audit(why="cli")
        phase = fleet.phase
    except (TargetError, FleetError) as err:
        return _fail(args, str(err))
    finally:
        fleet.close()
    ok = all(o.trigger == "audit_ok" for o in outcomes.values())
    _emit(args, {"fleet": {"phase": phase},
                 "audits": {n: {"outcome": o.trigger, "reason": o.reason}
                            for n, o in outcomes.items()}},
          [f"fleet {phase}"] + [f"  {n}: {o.trigger}: {o.reason}" for n, o in outcomes.items()])
    return OK if ok else NEGATIVE


def _short_timeouts() -> Any:
    from rolloutcore.adapters.http import Timeouts

    return Timeouts(connect=2.0, read=5.0)


def fleet_update(args: argparse.Namespace) -> int:
    """One fleet cycle onto ``--checkpoint`` as ``--label``; exit 0 only if published."""
    from rolloutcore.engine.targets import TargetError, check_checkpoint

    try:
        cfg = _load(args)
        if args.min_serving is not None and args.min_serving > len(cfg.engines):
            raise FleetFileError(f"--min-serving {args.min_serving} exceeds the fleet's "
                                 f"{len(cfg.engines)} engines")
        if args.min_serving is not None and cfg.max_live > 1:
            raise FleetFileError("--min-serving: a rolling fleet (max_live >= 2) keeps the "
                                 "quorum its fleet file gives")
        for path in (args.checkpoint, args.initial):  # before anything is written
            if path is not None:
                check_checkpoint(path)
    except (FleetFileError, TargetError, ValueError) as err:
        return _fail(args, str(err))
    return _controlled(args, cfg, lambda journal: _update(args, cfg, journal))


def _update(args: argparse.Namespace, cfg: FleetConfig, journal: JournalStore | None
            ) -> int:
    from rolloutcore.engine.targets import TargetError

    target_of = policy_targets(cfg)
    try:
        fleet = _open(args, cfg, min_serving=args.min_serving, journal=journal)
    except _Unreachable as err:
        return _stop(args, CANNOT_RUN, str(err))
    except (FleetFileError, FleetError, TargetError, ValueError) as err:
        return _fail(args, str(err))
    try:
        if fleet.phase == "UNINITIALIZED":
            if not args.initial:
                return _fail(args, "a new fleet journal: give --initial CHECKPOINT (what the "
                             "engines loaded at start) to bootstrap the fleet first")
            initial = target_of(args.initial, 1, args.initial_label)
            out = fleet.bootstrap(initial)
            if not args.json:
                for name, o in out.items():
                    print(f"bootstrap {name}: {o.trigger} ({o.reason[:100]})")
            if fleet.phase != "READY":
                _emit(args, {"published": False, "bootstrap": {n: o.trigger for n, o in
                                                               out.items()}},
                      ["the fleet did not open: fewer than min_serving members verified"])
                return NEGATIVE
        target = target_of(args.checkpoint, fleet.committed + 1, args.label)
        if not args.json:
            print(f"fleet update to {args.label} (generation {target.generation}), "
                  f"min_serving {fleet.min_serving}:")
        report = fleet.update(target)
    except (TargetError, FleetError) as err:
        return _fail(args, str(err))
    finally:
        fleet.close()
    verdict = "PUBLISHED" if report.published else ("ABORTED" if report.aborted else
                                                    "NOT published")
    _emit(args, report.as_json(),
          [f"{verdict} {report.target.label} on {report.committed_on or 'no member'}; "
           f"quarantined {report.quarantined or 'none'}; rolled back "
           f"{report.rolled_back or 'none'}; fleet {report.phase}; {report.total_s:.2f} s"])
    return OK if report.published else NEGATIVE


def fleet_readmit(args: argparse.Namespace) -> int:
    """Verified re-admission of one member onto the fleet's committed generation."""
    try:
        cfg = _load(args)
        if args.engine not in {e.name for e in cfg.engines}:
            raise FleetFileError(f"no engine named {args.engine!r} in {args.fleet}")
    except FleetFileError as err:
        return _fail(args, str(err))
    return _controlled(args, cfg, lambda journal: _readmit(args, cfg, journal),
                       need_journal="re-admit into")


def _readmit(args: argparse.Namespace, cfg: FleetConfig, journal: JournalStore | None
             ) -> int:
    import getpass

    from rolloutcore.engine.targets import TargetError

    try:
        fleet = _open(args, cfg, journal=journal)
    except _Unreachable as err:
        return _stop(args, CANNOT_RUN, str(err))
    except (FleetFileError, FleetError, ValueError) as err:
        return _fail(args, str(err))
    try:
        out = fleet.readmit(args.engine, who=f"cli:{getpass.getuser()}")
    except (TargetError, FleetError) as err:
        return _fail(args, str(err))
    finally:
        fleet.close()
    ok = out.trigger == "readmit_ok"
    _emit(args, {"engine": args.engine, "outcome": out.trigger, "reason": out.reason},
          [f"{args.engine}: {out.trigger}: {out.reason}"])
    return OK if ok else NEGATIVE


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}"
                                         ) from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def _add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS",
                   help="a fleet with [control] store: how long to wait for another "
                   "controller to step down (default 0: exit 1 at once, naming it)")


def fleet_launch(args: argparse.Namespace) -> int:
    """Place ``--engines`` engine actors (in-process vLLM, their OpenAI routes served) on a
    Ray cluster, ``--address``'s or a local one started here, with a placement group, as
    detached named actors; write the fleet file that names them (``serve`` and the fleet
    commands then drive them through their Ray handles). Exit 0 once every engine
    answers."""
    import importlib.util

    from rolloutcore.engine.identity import CheckpointError, safetensors_files

    if not args.ray:
        return _fail(args, "fleet launch places engines with Ray only: pass --ray")
    try:
        safetensors_files(args.model)
    except CheckpointError as e:
        return _fail(args, f"--model {args.model}: {e}")
    out = Path(args.out)
    if out.exists() or not out.parent.is_dir():
        return _fail(args, f"--out {out}: " + ("exists (a fleet file is never overwritten)"
                                               if out.exists() else
                                               f"no such directory {out.parent}"))
    from rolloutcore.adapters.ray_engine import placement_bundles

    try:  # pure: the sizes are checked before a Ray cluster is touched
        placement_bundles(args.engines, cpus_per_engine=args.cpus_per_engine,
                          gpus_per_engine=args.gpus_per_engine)
    except ValueError as e:
        return _fail(args, str(e))
    if importlib.util.find_spec("ray") is None:
        return _stop(args, CANNOT_RUN, "ray is not installed (pip install -e '.[ray]')")
    from rolloutcore.adapters.ray_engine import NAMESPACE, RayUnavailable, connect, launch

    names = [f"e{i}" for i in range(args.engines)]
    try:
        address = args.address or _start_ray_head(args.engines * args.cpus_per_engine + 1)
        connect(address, NAMESPACE)
        _pg, engines = launch(Path(args.model), names, detached=True,
                              max_restarts=args.max_restarts,
                              cpus_per_engine=args.cpus_per_engine,
                              gpus_per_engine=args.gpus_per_engine)
    except (RayUnavailable, RuntimeError) as e:
        return _stop(args, CANNOT_RUN, str(e))
    except Exception as e:  # Ray's own (a placement group that cannot be placed, ...)
        return _stop(args, CANNOT_RUN, f"the engines could not be launched: "
                     f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    lines = ["# Written by rolloutcore fleet launch --ray; `ray stop` ends the engines.",
             "[fleet]", f"min_serving = {len(engines)}", "", "[ray]",
             f"address = {json.dumps(address)}", f"namespace = {json.dumps(NAMESPACE)}"]
    for eng in engines:
        lines += ["", "[[engine]]", f"name = {json.dumps(eng.name)}",
                  f"url = {json.dumps(eng.url)}", f"ray = {json.dumps(eng.actor_name)}"]
    out.write_text("\n".join(lines) + "\n")
    _emit(args, {"fleet": str(out), "address": address,
                 "engines": [{"name": x.name, "actor": x.actor_name, "url": x.url}
                             for x in engines]},
          [f"{len(engines)} engine actor(s) on the Ray cluster at {address}:",
           *(f"  {x.name}: {x.actor_name} serving {x.url}" for x in engines),
           f"fleet file: {out}"])
    return OK


def _start_ray_head(cpus: float) -> str:
    """Start a local Ray head (``ray start --head``) and return its GCS address."""
    import subprocess

    from rolloutcore.adapters.launch import free_port

    port = free_port()
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli), "start", "--head", f"--port={port}", f"--num-cpus={cpus:g}",
           "--include-dashboard=false", "--disable-usage-stats"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"ray start --head: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["?"]
        raise RuntimeError(f"ray start --head failed: {tail[0][:300]}")
    return f"127.0.0.1:{port}"


def add_fleet_parsers(sub: Any, int_at_least: Any) -> None:
    fleet = sub.add_parser("fleet", help="a fleet of vLLM servers: one transactional update, "
                           "quarantine, verified re-admission")
    fsub = fleet.add_subparsers(dest="cmd", required=True)
    st = fsub.add_parser("status", help="each engine's phase, generation, identity, serving or "
                         "quarantined (with [control] store: also the leader; read only)")
    st.add_argument("--fleet", required=True, help="the fleet file (TOML)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=fleet_status)
    up = fsub.add_parser("update", help="one fleet cycle, step by step per engine (exit 0 "
                         "only if published)")
    up.add_argument("--fleet", required=True, help="the fleet file (TOML)")
    up.add_argument("--checkpoint", required=True, help="checkpoint directory to install")
    up.add_argument("--label", required=True, help="version label of the new generation")
    up.add_argument("--min-serving", type=int_at_least(1), default=None,
                    help="quorum to publish (default: the fleet file's)")
    up.add_argument("--initial", help="a new fleet: the checkpoint the engines started with")
    up.add_argument("--initial-label", default="default",
                    help="the label the engines report at start (vLLM: default)")
    _add_wait(up)
    up.add_argument("--json", action="store_true")
    up.set_defaults(func=fleet_update)
    ra = fsub.add_parser("readmit", help="verified re-admission of a quarantined engine")
    ra.add_argument("--fleet", required=True, help="the fleet file (TOML)")
    ra.add_argument("--engine", required=True, help="the engine's name in the fleet file")
    _add_wait(ra)
    ra.add_argument("--json", action="store_true")
    ra.set_defaults(func=fleet_readmit)
    au = fsub.add_parser("audit", help="audit every READY engine now: one found replaced out "
                         "of band is quarantined (exit 0 only if every audit passed)")
    au.add_argument("--fleet", required=True, help="the fleet file (TOML)")
    _add_wait(au)
    au.add_argument("--json", action="store_true")
    au.set_defaults(func=fleet_audit)
    la = fsub.add_parser("launch", help="place engine actors (in-process vLLM) on a Ray "
                         "cluster and write the fleet file that names them")
    la.add_argument("--ray", action="store_true", help="host the engines in Ray actors")
    la.add_argument("--engines", type=int_at_least(1), required=True, help="how many")
    la.add_argument("--model", required=True, help="the checkpoint every engine starts on")
    la.add_argument("--out", required=True, help="the fleet file to write (must not exist)")
    la.add_argument("--address", help="the Ray cluster's GCS host:port (default: start a "
                    "local head here)")
    la.add_argument("--max-restarts", type=int_at_least(0), default=1,
                    help="how often Ray restarts a dead engine actor (default 1)")
    la.add_argument("--cpus-per-engine", type=float, default=1.0,
                    help="CPUs of each engine's placement-group bundle (default 1)")
    la.add_argument("--gpus-per-engine", type=float, default=0.0,
                    help="GPUs of each engine's bundle, its tensor-parallel size (default 0: "
                    "the CPU build)")
    la.add_argument("--json", action="store_true")
    la.set_defaults(func=fleet_launch)
