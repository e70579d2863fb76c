"""Runs nmt-serve: binds the socket, starts uvicorn on the application, and stops gracefully.

SIGTERM (or Ctrl-C) makes uvicorn stop accepting connections and finish the requests in
flight; the application's shutdown then drains each model's batcher, and the process exits 0
(130 for Ctrl-C, as every nmt command).
"""

from __future__ import annotations

import logging
import math
import signal
import socket

from nmt.errors import NmtError
from nmt.serve.config import ServeConfig
from nmt.serve.models import ModelSpec, Models

log = logging.getLogger("nmt.serve")


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one), or a one-line NmtError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NmtError(f"--host {host}: not an address this machine knows ({e.strerror})"
                       ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise NmtError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    sock.set_inheritable(True)
    return sock


def _log_through_nmt() -> None:
    """uvicorn's messages through nmt's stderr handler (and level), not its own config."""
    nmt_logger = logging.getLogger("nmt")
    uv = logging.getLogger("uvicorn")           # parent of uvicorn.error and uvicorn.access
    uv.handlers = list(nmt_logger.handlers)
    uv.setLevel(nmt_logger.level)
    uv.propagate = False
    # Its lifecycle messages come from "uvicorn.error", which reads like an error in a log.
    logging.getLogger("uvicorn.error").addFilter(_rename)


def _rename(record: logging.LogRecord) -> bool:
    record.name = "uvicorn"
    return True


def header_timeout_protocol(seconds: float):
    """uvicorn's h11 protocol, closing a connection whose request line and headers have not
    all arrived ``seconds`` after it opened or after its last response (uvicorn itself only
    times out idle kept-alive connections, so a client that sends half a header would hold
    its connection, and a file descriptor, for ever)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeout(H11Protocol):
        _header_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expired(self) -> None:
            self._header_timer = None
            # IDLE: no complete request line and headers since the connection opened or its
            # last response (a request being read or answered is past IDLE)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.debug("closed a connection whose request headers did not arrive within "
                          "%g s (--header-timeout)", seconds)
                self.transport.close()

    return HeaderTimeout


def serve(specs: list[ModelSpec], cfg: ServeConfig, device: str = "auto",
          precision: str = "fp32", threads: int | None = None) -> None:
    """Serve ``specs`` until SIGTERM or Ctrl-C; a model that cannot be loaded stops the server
    and is raised here."""
    import uvicorn

    from nmt.serve.app import create_app

    sock = listen(cfg.host, cfg.port)
    models = Models(specs, cfg, device=device, precision=precision, threads=threads)
    server: uvicorn.Server | None = None

    def load_failed() -> None:
        if server is not None:
            server.should_exit = True

    app = create_app(models, cfg, on_load_failure=load_failed,
                     stopping=lambda: server is not None and server.should_exit)
    # The requests answer 503 once the grace is over (nmt.serve.app.Clock): uvicorn's own
    # limit, a little later, only cancels what would still hang.
    config = uvicorn.Config(app, log_config=None, access_log=cfg.access_log, lifespan="on",
                            http=header_timeout_protocol(cfg.header_timeout),
                            limit_concurrency=cfg.max_connections,
                            timeout_graceful_shutdown=math.ceil(cfg.shutdown_grace) + 2)
    server = uvicorn.Server(config)
    _log_through_nmt()
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info("listening on http://%s:%d (models: %s)", shown, port, ", ".join(models.names))
    # uvicorn catches SIGTERM, stops gracefully, then raises the signal again under the handler
    # that was there before it: make that one a no-op, so that a graceful stop exits 0.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
    if models.error is not None:
        raise models.error


__all__ = ["serve", "listen"]
