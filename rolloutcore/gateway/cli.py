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
from pathlib import Path
from typing import Any

from rolloutcore.inputs import unreadable

OK, NEGATIVE, BAD_INPUT = 0, 1, 2
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
    from rolloutcore.fleet import FleetError, FleetFileError, load_fleet_file
    from rolloutcore.fleet_cli import journal_of, open_fleet
    from rolloutcore.gateway.core import Gateway, GatewayConfig, StaleMode
    from rolloutcore.gateway.server import GatewayServer, bind, uvicorn_config
    from rolloutcore.targets import TargetError, check_checkpoint, checkpoint_target

    try:
        cfg = load_fleet_file(args.fleet)
        models = {e.model for e in cfg.engines}
        if len(models) != 1:
            raise ValueError(f"{args.fleet}: the engines serve different models "
                             f"{sorted(models)}: a gateway serves one")
        token = _read_token(args.admin_token_file) if args.admin_token_file else None
        if token is None and not is_loopback(args.host):
            raise ValueError(f"--host {args.host}: the admin API has no token, so the "
                             "gateway listens on loopback only; give --admin-token-file")
        records = Path(args.records) if args.records else None
        if records is not None and (records.is_dir() or not records.parent.is_dir()):
            raise ValueError(f"--records {records}: not a file in an existing directory")
        journal = journal_of(cfg, args.fleet)
        new = not journal.exists() or journal.stat().st_size == 0
        if new and not args.initial:
            raise ValueError(f"{journal}: a new fleet journal: give --initial CHECKPOINT "
                             "(what the engines loaded at start) to bootstrap the fleet")
        if args.initial:
            check_checkpoint(args.initial)
        config = GatewayConfig(
            model=models.pop(), queue_depth=args.queue_depth, queue_wait_s=args.queue_wait,
            stale=StaleMode(args.stale), max_body_bytes=args.max_body_bytes,
            admin_token=token, records=records,
            engine_tokens={e.name: e.token for e in cfg.engines if e.token})
        sock = bind(args.host, args.port)
    except OSError as e:
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror or str(e)
        return _fail(f"cannot listen on {args.host}:{args.port}: {why}")
    except (FleetFileError, TargetError, ValueError) as e:
        return _fail(str(e))
    with contextlib.closing(sock):
        _log_to_stderr()
        try:
            fleet = open_fleet(cfg, args.fleet)
        except (FleetError, ValueError) as e:
            return _fail(str(e))
        try:
            if fleet.phase == "UNINITIALIZED":
                out = fleet.bootstrap(checkpoint_target(args.initial, 1, args.initial_label))
                for name, o in out.items():
                    print(f"bootstrap {name}: {o.trigger} ({o.reason[:100]})", flush=True)
                if fleet.phase != "READY":
                    print("the fleet did not open: fewer than min_serving engines verified")
                    fleet.close()
                    return NEGATIVE
            gateway = Gateway(fleet, config, target_of=checkpoint_target)
            watchdog = None if args.no_watchdog else (
                args.watchdog or cfg.watchdog_s or DEFAULT_WATCHDOG_S)
            if watchdog is not None:
                fleet.start_watchdog(watchdog)
        except (TargetError, FleetError) as e:
            fleet.close()
            return _fail(str(e))
        server = GatewayServer(uvicorn_config(gateway, access_log=args.access_log), gateway)
        auth = ("admin API: bearer token from " + args.admin_token_file if token else
                "admin API has no token: listening on loopback only")
        print(f"rolloutcore gateway on http://{args.host}:{sock.getsockname()[1]} for model "
              f"{config.model!r}: fleet {fleet.phase}, committed generation "
              f"{fleet.committed}, {len(fleet.members)} engines; "
              + (f"watchdog every {watchdog:g} s" if watchdog else "no watchdog")
              + f"; {auth}; journal "
              f"{fleet.journal.path}" + (f"; records {records}" if records else ""),
              flush=True)
        try:
            server.run(sockets=[sock])
        finally:
            gateway.close()
        how = signal.Signals(server.stopped_by).name if server.stopped_by else "stopped"
        print(f"rolloutcore gateway: {how}, closed cleanly (journal {fleet.journal.path}, "
              f"last seq {fleet.journal.last_seq})", flush=True)
    return OK


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
                       help="audit every serving engine this often (default: the fleet "
                       f"file's watchdog_s, else {DEFAULT_WATCHDOG_S:g}): an engine replaced "
                       "behind the fleet's back serves at most this long plus one audit")
    watch.add_argument("--no-watchdog", action="store_true",
                       help="no periodic audit (replacements are found only by requests "
                       "that fail, or by POST /admin/audit)")
    p.add_argument("--initial", help="a new fleet: the checkpoint the engines started with")
    p.add_argument("--initial-label", default="default",
                   help="the label the engines report at start (vLLM: default)")
    p.set_defaults(func=serve)


__all__ = ["add_serve_parser", "serve"]
