"""``rolloutcore serve``: the gateway in front of a fleet file's engines, until SIGTERM or
SIGINT, then closed cleanly (exit 0).

Everything that can be refused is checked before anything is written: the fleet file,
the admin token file, the host (no token: loopback only), the records file, the
initial checkpoint, the port (bound before the fleet is opened). The heavy imports
(Starlette, uvicorn, the fleet) happen only when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutcore.cli.exits import BAD_INPUT, CANNOT_RUN, NEGATIVE, OK
from rolloutcore.inputs import unreadable

if TYPE_CHECKING:
    import socket

    from rolloutcore.control import Leadership
    from rolloutcore.fleet import Fleet, FleetConfig
    from rolloutcore.gateway.core import GatewayConfig
    from rolloutcore.gateway.server import GatewayServer

STALE_MODES = ("wait", "refuse")
#: Seconds between two audits of every serving engine, unless the fleet file or the
#: command line says otherwise: how long an engine replaced behind the fleet's back can
#: serve before it is found (plus one audit's duration).
DEFAULT_WATCHDOG_S = 10.0


def _fail(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return BAD_INPUT


def _read_token(path: str) -> str:
    p = Path(path)
    try:
        token = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{unreadable(p, e)} (the admin token file)") from None
    if not token or len(token.split()) != 1:
        raise ValueError(f"{p}: the admin token file must hold one token on one line")
    return token


def _log_to_stderr() -> None:
    """The gateway's own log lines (refusals, updates) on stderr; other libraries' INFO
    (httpx logs every request, transitions every callback) stays off."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    log = logging.getLogger("rolloutcore")
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def serve(args: argparse.Namespace) -> int:
    from rolloutcore.adapters.http import is_loopback
    from rolloutcore.cli.fleet_commands import journal_of, open_fleet
    from rolloutcore.engine.targets import TargetError, check_checkpoint
    from rolloutcore.fleet import FleetError, FleetFileError, load_fleet_file
    from rolloutcore.gateway.core import GatewayConfig, StaleMode
    from rolloutcore.gateway.server import bind

    if args.gateway_only is not None:
        return _serve_follower(args)
    try:
        cfg = load_fleet_file(args.fleet)
        model = cfg.served_model
        if model is None:
            raise ValueError(f"{args.fleet}: the engines serve different models "
                             f"{sorted({e.model for e in cfg.engines})}: a gateway serves one")
        token = _read_token(args.admin_token_file) if args.admin_token_file else None
        if token is None and not is_loopback(args.host):
            raise ValueError(f"--host {args.host}: the admin API has no token, so the "
                             "gateway listens on loopback only; give --admin-token-file")
        records = Path(args.records) if args.records else None
        if records is not None and (records.is_dir() or not records.parent.is_dir()):
            raise ValueError(f"--records {records}: not a file in an existing directory")
        if cfg.control is None:
            journal = journal_of(cfg, args.fleet)
            where = str(journal)
            new = not journal.exists() or journal.stat().st_size == 0
        else:
            where, new = cfg.control.store, _store_is_new(cfg)
        if new and not args.initial:
            raise ValueError(f"{where}: a new fleet journal: give --initial CHECKPOINT "
                             "(what the engines loaded at start) to bootstrap the fleet")
        if args.initial:
            check_checkpoint(args.initial)
        config = GatewayConfig(
            model=model, queue_depth=args.queue_depth, queue_wait_s=args.queue_wait,
            stale=StaleMode(args.stale), max_body_bytes=args.max_body_bytes,
            admin_token=token, records=records,
            engine_tokens={e.name: e.token for e in cfg.engines if e.token})
        sock = bind(args.host, args.port)
    except _CannotRun as e:
        return _cannot_run(str(e))
    except OSError as e:
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
        return _fail(f"cannot listen on {args.host}:{args.port}: {why}")
    except (FleetFileError, TargetError, ValueError) as e:
        return _fail(str(e))
    with contextlib.closing(sock):
        _log_to_stderr()
        if cfg.control is not None:
            return _serve_controlled(args, cfg, config, sock)
        try:
            fleet = open_fleet(cfg, args.fleet)
        except ConnectionError as e:  # the Ray cluster hosting the engines
            return _cannot_run(str(e))
        except (FleetError, ValueError) as e:
            return _fail(str(e))
        return _run_gateway(args, cfg, config, fleet, sock)


def _serve_follower(args: argparse.Namespace) -> int:
    """``serve --gateway-only NAME``: a gateway of its own that follows the controller at
    ``--controller`` (:mod:`rolloutcore.gateway.follower`), until SIGTERM or SIGINT."""
    from rolloutcore.fleet import FleetFileError, load_fleet_file
    from rolloutcore.gateway.follower import Follower, FollowerConfig, follower_server
    from rolloutcore.gateway.registry import check_gateway_name
    from rolloutcore.gateway.server import bind
    from rolloutcore.journal import JournalError

    try:
        cfg = load_fleet_file(args.fleet)
        name = args.gateway_only
        check_gateway_name(name)
        if not args.controller or not args.controller.startswith(("http://", "https://")):
            raise ValueError("--gateway-only needs --controller URL (the leader's gateway, "
                             "http:// or https://)")
        if not args.gateway_journal:
            raise ValueError("--gateway-only needs --gateway-journal PATH (its own journal)")
        journal = Path(args.gateway_journal)
        if journal.is_dir() or not journal.parent.is_dir():
            raise ValueError(f"--gateway-journal {journal}: not a file in an existing "
                             "directory")
        token = _read_token(args.admin_token_file) if args.admin_token_file else None
        follower = Follower(FollowerConfig(
            name, args.controller, journal, admin_token=token,
            engine_tokens={e.name: e.token for e in cfg.engines if e.token},
            queue_wait_s=args.queue_wait, max_body_bytes=args.max_body_bytes))
        sock = bind(args.host, args.port)
    except OSError as e:
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
        return _fail(f"cannot listen on {args.host}:{args.port}: {why}")
    except (FleetFileError, JournalError, ValueError) as e:
        return _fail(str(e))
    _log_to_stderr()
    with contextlib.closing(sock):
        server = follower_server(follower)
        print(f"rolloutcore gateway {name} on http://{args.host}:{sock.getsockname()[1]}, "
              f"following {args.controller}; journal {journal} (last seq "
              f"{follower.journal.last_seq}, {follower.abandoned} abandoned at start)",
              flush=True)
        server.run(sockets=[sock])
    print(f"rolloutcore gateway {name}: stopped (journal {journal})", flush=True)
    return OK


class _CannotRun(Exception):
    """What keeps ``serve`` from running (the control store): exit 3, one line."""


def _cannot_run(message: str) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return CANNOT_RUN


def _store_is_new(cfg: FleetConfig) -> bool:
    """Whether the fleet's journal on its store is empty (read only). A store that does
    not answer with a quorum: :class:`_CannotRun`, said at once (a standby could only
    wait for it, unseen)."""
    from rolloutcore.cli.control_support import ControlExit, check_store, has_journal, open_store

    assert cfg.control is not None
    try:
        with open_store(cfg.control) as store:
            check_store(store)
            return not has_journal(store)
    except ControlExit as e:
        raise _CannotRun(e.message) from None


def _run_gateway(args: argparse.Namespace, cfg: FleetConfig, config: GatewayConfig,
                 fleet: Fleet, sock: socket.socket, *, lead: Leadership | None = None,
                 stop_requested: Callable[[], bool] = lambda: False) -> int:
    """Bootstrap a new fleet, then serve the gateway on ``sock`` until SIGTERM or SIGINT
    (0), or, under a leadership ``lead``, until it is lost (3: ``deposed: ...``)."""
    from rolloutcore.cli.fleet_commands import policy_targets
    from rolloutcore.engine.targets import TargetError
    from rolloutcore.fleet import FleetError
    from rolloutcore.gateway.core import Gateway
    from rolloutcore.gateway.registry import GatewayRegistry
    from rolloutcore.gateway.server import GatewayServer, uvicorn_config

    target_of = policy_targets(cfg)
    token = config.admin_token
    records = config.records
    try:
        if fleet.phase == "UNINITIALIZED":
            if not args.initial:  # a journal whose bootstrap never opened the fleet
                fleet.close()
                return _fail(f"{fleet.store.describe()}: the fleet was never bootstrapped "
                             "(its journal opened no fleet): give --initial CHECKPOINT "
                             "(what the engines loaded at start)")
            out = fleet.bootstrap(target_of(args.initial, 1, args.initial_label))
            for name, o in out.items():
                print(f"bootstrap {name}: {o.trigger} ({o.reason[:100]})", flush=True)
            if fleet.phase != "READY":
                print("the fleet did not open: fewer than min_serving engines verified")
                fleet.close()
                return NEGATIVE
        gateway = Gateway(fleet, config, target_of=target_of)
        registry = None if args.gateway_lease is None else GatewayRegistry(
            fleet, lease_s=args.gateway_lease)
        watchdog = None if args.no_watchdog else (
            args.watchdog or cfg.watchdog_s or DEFAULT_WATCHDOG_S)
        if watchdog is not None:
            fleet.start_watchdog(watchdog)
    except (TargetError, FleetError, ValueError) as e:
        fleet.close()
        return _fail(str(e))
    except BaseException:  # a deposed leader's refused append, among others: the caller
        fleet.close()  # says it
        raise
    server = GatewayServer(uvicorn_config(gateway, access_log=args.access_log,
                                          registry=registry), gateway)
    watch = None if lead is None else _LeadershipWatch(lead, fleet, server)
    auth = ("admin API: bearer token from " + args.admin_token_file if token else
            "admin API has no token: listening on loopback only")
    print(f"rolloutcore gateway on http://{args.host}:{sock.getsockname()[1]} for model "
          f"{config.model!r}: fleet {fleet.phase}, committed generation "
          f"{fleet.committed}, {len(fleet.members)} engines; "
          + (f"watchdog every {watchdog:g} s" if watchdog else "no watchdog")
          + f"; {auth}; journal "
          f"{fleet.journal.path}" + (f"; records {records}" if records else "")
          + (f"; leader at epoch {lead.epoch} on {lead.store.url}"
             if lead is not None else ""),
          flush=True)
    if stop_requested():  # a signal came while the fleet was taken over: start, then stop
        server.should_exit = True
    try:
        server.run(sockets=[sock])
    finally:
        if watch is not None:
            watch.stop()
        if registry is not None:
            registry.close()
        try:
            gateway.close()
        except Exception:
            if watch is None or watch.reason is None:
                raise
            # Deposed: the journal refuses the last releases; the successor's recovery
            # (which fences every engine) decides what they were.
    if watch is not None and watch.reason is not None:
        print(f"error: deposed: {watch.reason}; the gateway stopped (restart it: it comes "
              "back as a standby)", file=sys.stderr, flush=True)
        return CANNOT_RUN
    how = signal.Signals(server.stopped_by).name if server.stopped_by else "stopped"
    print(f"rolloutcore gateway: {how}, closed cleanly (journal {fleet.journal.path}, "
          f"last seq {fleet.journal.last_seq})", flush=True)
    return OK


class _LeadershipWatch:
    """Stops the gateway once this controller no longer leads: its lease lost (the
    leadership's ``on_lost``, or its own deadline passed) or its journal refusing every
    append (an append refused to a deposed epoch, or a store that failed mid-write, after
    which nothing it admits could be journalled)."""

    def __init__(self, lead: Leadership, fleet: Fleet, server: GatewayServer) -> None:
        self.lead, self.fleet, self.server = lead, fleet, server
        self.reason: str | None = None
        self._wake = threading.Event()
        self._done = threading.Event()
        lead.on_lost(self._wake.set)  # at once; the poll catches the journal's refusals
        self._thread = threading.Thread(target=self._run, name="leadership-watch",
                                        daemon=True)
        self._thread.start()

    def _why(self) -> str | None:
        from rolloutcore.cli.control_support import journal_failure

        lead = self.lead
        if lead.lost.is_set() or not lead.holds():
            return (f"{lead.controller_id} lost the leadership of epoch {lead.epoch} "
                    f"({lead.lost_reason or 'its lease lapsed'})")
        failure = journal_failure(self.fleet.journal)
        if failure is not None:
            return f"{lead.controller_id} (epoch {lead.epoch}): {failure}"
        return None

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(0.25)
            if self._done.is_set():
                return
            why = self._why()
            if why is not None:
                self.reason = why
                self.server.should_exit = True
                return

    def stop(self) -> None:
        self._done.set()
        self._wake.set()
        self._thread.join(2.0)


def _serve_controlled(args: argparse.Namespace, cfg: FleetConfig, config: GatewayConfig,
                      sock: socket.socket) -> int:
    """``serve`` of a fleet whose journal and leadership live on etcd: a standby (503s
    naming the leader) on the bound port while it campaigns, for as long as it takes;
    once elected, the fleet taken over (every engine fenced with the new epoch) and the
    gateway served on the same socket until SIGTERM/SIGINT (0) or the leadership is lost
    (3). The leadership is resigned on the way out, whatever happened."""
    from rolloutcore.cli.control_support import (
        controller_id,
        deposed_line,
        leader_json,
        open_store,
    )
    from rolloutcore.cli.fleet_commands import open_fleet
    from rolloutcore.control import CampaignTimeout, Leadership, StoreError, current_leader
    from rolloutcore.fleet import FleetError
    from rolloutcore.fleet.store import EtcdJournalStore
    from rolloutcore.gateway.standby import StandbyServer, standby_app
    from rolloutcore.journal import JournalError

    control = cfg.control
    assert control is not None
    cid = controller_id(control)
    reader = open_store(control, timeout_s=1.0)  # the standby's answers: quick or none
    store = open_store(control)
    lead = Leadership(store, cid, ttl_s=control.lease_s)
    wake = threading.Event()
    signals: list[int] = []
    failure: list[BaseException] = []

    def leader() -> dict[str, Any] | None:
        try:
            return leader_json(current_leader(reader))
        except StoreError:
            return None

    def on_signal(sig: int, _frame: Any) -> None:
        signals.append(sig)
        wake.set()

    def campaign() -> None:
        try:
            lead.campaign()  # forever: an unreachable store is retried, not fatal
        except CampaignTimeout:
            pass  # resigned (a signal): cancelled
        except Exception as e:  # the store refused us (not unavailable): said, exit 3
            failure.append(e)
        finally:
            wake.set()

    saved = {}
    if threading.current_thread() is threading.main_thread():
        saved = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    standby: StandbyServer | None = StandbyServer(sock, standby_app(leader, cid))
    try:
        assert standby is not None
        standby.start()
        now = leader()
        print(f"rolloutcore gateway on http://{args.host}:{sock.getsockname()[1]}: standby "
              f"(controller {cid}), campaigning for the fleet's leadership on "
              f"{control.store}; "
              + (f"leader now {now['id']} at epoch {now['epoch']}" if now else "no leader now"),
              flush=True)
        thread = threading.Thread(target=campaign, name="campaign", daemon=True)
        thread.start()
        while not wake.wait(0.5):
            pass
        if signals:
            lead.resign()  # cancels the campaign (or gives back a term just won)
            thread.join(5.0)
            standby.stop()
            standby = None
            print(f"rolloutcore gateway: {signal.Signals(signals[0]).name}, standby closed "
                  "cleanly", flush=True)
            return OK
        standby.stop()
        standby = None
        if failure:
            return _cannot_run(f"control store {control.store}: campaign failed: "
                               f"{failure[0]}")
        print(f"rolloutcore gateway: elected leader at epoch {lead.epoch} (controller "
              f"{cid}); taking the fleet over", flush=True)
        try:
            fleet = open_fleet(cfg, args.fleet, journal=EtcdJournalStore(store, lead, cid))
        except (JournalError, StoreError) as e:  # deposed during the takeover
            return _cannot_run(deposed_line(e))
        except ConnectionError as e:  # the Ray cluster hosting the engines
            return _cannot_run(str(e))
        except (FleetError, ValueError) as e:
            return _fail(str(e))
        try:
            return _run_gateway(args, cfg, config, fleet, sock, lead=lead,
                                stop_requested=lambda: bool(signals))
        except (JournalError, StoreError) as e:  # deposed while bootstrapping
            return _cannot_run(deposed_line(e))
    finally:
        if standby is not None:
            standby.stop()
        lead.resign()  # at once, so that a standby need not wait for the lease
        for s, handler in saved.items():
            signal.signal(s, handler)
        reader.close()
        store.close()


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"a port is in 0..65535, got {v}")
    return v


def _at_least(minimum: float, kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not v >= minimum or v == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum}, got {v}")
        return v

    parse.__name__ = kind.__name__
    return parse


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible gateway in front of a fleet: "
                       "every request bound to the committed generation")
    p.add_argument("--fleet", required=True, help="the fleet file (TOML)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8100)
    p.add_argument("--admin-token-file", help="file holding the admin API's bearer token "
                   "(without: the gateway listens on loopback only)")
    p.add_argument("--queue-depth", type=_at_least(0, int), default=64,
                   help="requests that may wait while admissions are closed")
    p.add_argument("--queue-wait", type=_at_least(0, float), default=30.0,
                   help="seconds a request may wait for admissions to open")
    p.add_argument("--stale", choices=STALE_MODES, default="wait",
                   help="a request whose X-RolloutCore-Min-Generation is above the committed "
                   "generation: wait in the queue, or refuse it with 409")
    p.add_argument("--max-body-bytes", type=_at_least(1, int), default=16 << 20)
    p.add_argument("--records", help="append a trajectory record per answered request")
    p.add_argument("--access-log", action="store_true", help="log every request line")
    watch = p.add_mutually_exclusive_group()
    watch.add_argument("--watchdog", type=_at_least(0.001, float), metavar="SECONDS",
                       help="audit every serving engine, and re-admit fenced quarantined ones, "
                       "this often (default: the fleet "
                       f"file's watchdog_s, else {DEFAULT_WATCHDOG_S:g}): an engine replaced "
                       "behind the fleet's back serves at most this long plus one audit")
    watch.add_argument("--no-watchdog", action="store_true",
                       help="no periodic audit (replacements are found only by requests "
                       "that fail, or by POST /admin/audit)")
    p.add_argument("--initial", help="a new fleet: the checkpoint the engines started with")
    p.add_argument("--initial-label", default="default",
                   help="the label the engines report at start (vLLM: default)")
    p.add_argument("--gateway-lease", type=_at_least(0.1, float), metavar="SECONDS",
                   help="remote gateways (serve --gateway-only) may follow this fleet; one "
                   "that has not polled for SECONDS is fenced on every engine")
    remote = p.add_argument_group("a gateway of its own (several behind a balancer)")
    remote.add_argument("--gateway-only", metavar="NAME", help="follow the controller at "
                        "--controller instead of leading the fleet: admit on its own view, "
                        "journal in its own journal")
    remote.add_argument("--controller", metavar="URL",
                        help="the leading gateway's URL (serve --gateway-lease)")
    remote.add_argument("--gateway-journal", metavar="PATH",
                        help="this gateway's own admission journal (continued on restart)")
    p.set_defaults(func=serve)


__all__ = ["add_serve_parser", "serve"]
