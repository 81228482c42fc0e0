"""The gateway's HTTP server: uvicorn on a socket bound beforehand, stopped cleanly by
SIGTERM or SIGINT (:class:`GatewayServer`), or on a thread (:class:`ServerThread`,
for tests and benchmarks)."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from rolloutcore.gateway.app import GatewayApp
from rolloutcore.gateway.core import Gateway
from rolloutcore.gateway.registry import GatewayRegistry


class GatewayServer(uvicorn.Server):
    """uvicorn, with SIGTERM/SIGINT ending the serve loop without being re-raised
    afterwards (uvicorn re-raises them, which would turn a clean stop into a kill),
    and queued requests woken when shutdown begins."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(sig: int, _frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: do not wait for streams
            self.stopped_by = sig
            self.should_exit = True

        saved = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.gateway.begin_shutdown()  # queued requests get their 503 now
        await super().shutdown(sockets)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (raises OSError: in use, not an address of this host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def uvicorn_config(gateway: Gateway, *, access_log: bool = False,
                   registry: GatewayRegistry | None = None) -> uvicorn.Config:
    """The access log (request lines, never headers) only when asked: the CLI's."""
    # Keep-alive outlasting clients' idle expiry (httpx: 5 s) so that a client, not the
    # server, closes an idle connection: no request is sent on a socket being closed.
    return uvicorn.Config(GatewayApp(gateway, registry).app, lifespan="on",
                          log_level="info" if access_log else "warning",
                          access_log=access_log, timeout_graceful_shutdown=30,
                          timeout_keep_alive=65, backlog=2048)


class AppThread:
    """A uvicorn server on a thread of this process: ``with AppThread(server) as url``."""

    def __init__(self, server: uvicorn.Server, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = bind(host, port)
        self.server = server
        self.thread = threading.Thread(target=self.server.run, kwargs={
            "sockets": [self.sock]}, name="gateway-uvicorn", daemon=True)
        addr = self.sock.getsockname()
        self.url = f"http://{host}:{addr[1]}"

    def __enter__(self) -> str:
        self.thread.start()
        ready = threading.Event()

        def started() -> bool:
            return bool(self.server.started) or not self.thread.is_alive()

        while not started():  # uvicorn has no start callback: its flag, briefly polled
            ready.wait(0.01)
        if not self.server.started:
            raise RuntimeError("the gateway server did not start")
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.sock.close()


class ServerThread(AppThread):
    """The gateway served by uvicorn on a thread: ``with ServerThread(gw) as url``."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1", port: int = 0, *,
                 registry: GatewayRegistry | None = None) -> None:
        self.gateway = gateway
        super().__init__(GatewayServer(uvicorn_config(gateway, registry=registry), gateway),
                         host, port)


__all__ = ["AppThread", "GatewayServer", "ServerThread", "bind", "uvicorn_config"]
