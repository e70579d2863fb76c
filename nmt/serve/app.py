"""The HTTP side of nmt-serve: a Starlette (ASGI) application.

    GET  /health      200 {"status": "ok"} while the process runs
    GET  /ready       200 {"status": "ready", "models": [...]} once every model is loaded,
                      503 {"status": "loading", ...} before (or "failed": a model could not
                      be loaded, or its decoding thread failed)
    POST /translate   {"text": [...], ...} (nmt.serve.requests) -> {"translations": [...]},
                      with "nbest" > 1 also {"nbest": [[{"translation", "score"}, ...], ...]}

Every error is JSON, ``{"error": "one-line reason"}``, with a 4xx status for what the client
sent (400 bad JSON or fields, 404 unknown model or path, 405 wrong method, 413 too large) and
503 while models load or the server stops, or when a model's queue is full (with
Retry-After). The event loop only reads, checks and answers: sentences are encoded on
Starlette's thread pool and decoded by each model's batcher thread (nmt.serve.batching), so
/health answers during a long batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import time
from typing import Callable, Mapping

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nmt.search.pipeline import round_score
from nmt.serve.batching import QueueFull, Stopping
from nmt.serve.config import ServeConfig
from nmt.serve.models import Models
from nmt.serve.requests import RequestError, encode, parse_json, parse_request

log = logging.getLogger("nmt.serve")


class Json(JSONResponse):
    """A JSON response that always renders: text that cannot be UTF-8 (a lone surrogate from
    the request, echoed in an error or copied into a translation) is written as a \\u escape,
    which JSON allows, instead of failing the response."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False,
                              separators=(",", ":")).encode("ascii")


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return Json({"error": " ".join(message.split())}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to pass ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body has {declared} bytes; this server takes at most "
                                f"{limit} (--max-request-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the body passes {limit} bytes, the most this server "
                                    f"takes (--max-request-bytes)")
    return bytes(body)


class Deadline:
    """When a request must be answered by: its --request-timeout (none when 0)."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds if seconds > 0 else math.inf

    def left(self) -> float | None:
        return None if self.end == math.inf else max(0.0, self.end - time.monotonic())


class Clock:
    """A request's wait for its translations, which ends early when its client disconnects,
    its --request-timeout passes, or the server has been stopping for --shutdown-grace: the
    request's sentences not yet decoded are then dropped (its future cancelled)."""

    POLL = 0.25     # seconds between looks at the server's stopping flag

    def __init__(self, cfg: ServeConfig, stopping: Callable[[], bool]):
        self.cfg, self.stopping = cfg, stopping
        self.stop_seen: float | None = None     # when a request first saw the server stopping

    def deadline(self) -> Deadline:
        return Deadline(self.cfg.request_timeout)

    def _grace_over(self) -> bool:
        if not self.stopping():
            return False
        now = time.monotonic()
        if self.stop_seen is None:
            self.stop_seen = now
        return now - self.stop_seen >= self.cfg.shutdown_grace

    async def result(self, future, request: Request, deadline: Deadline, n: int):
        waiting = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnect(request))
        try:
            while True:
                left = deadline.left()
                done, _ = await asyncio.wait(
                    {waiting, gone}, return_when=asyncio.FIRST_COMPLETED,
                    timeout=self.POLL if left is None else min(self.POLL, left))
                if waiting in done:
                    return waiting.result()
                if gone in done:
                    future.cancel()
                    log.info("a client disconnected before its %d sentences were translated: "
                             "those not yet decoded are dropped", n)
                    raise RequestError(499, "the client disconnected")
                if deadline.left() == 0:
                    future.cancel()
                    log.warning("a request of %d sentences passed --request-timeout %g s: "
                                "its sentences not yet decoded are dropped", n,
                                self.cfg.request_timeout)
                    raise RequestError(503, f"not translated within "
                                            f"{self.cfg.request_timeout:g} s "
                                            f"(--request-timeout); send fewer sentences or "
                                            f"try again later")
                if self._grace_over():
                    future.cancel()
                    raise Stopping("the server is shutting down and its grace period "
                                   f"({self.cfg.shutdown_grace:g} s, --shutdown-grace) is over")
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            gone.cancel()
            waiting.cancel()


async def _disconnect(request: Request) -> None:
    """Returns when the client has disconnected (the body has been read by then)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def reply(results, nbest: int) -> dict:
    """The body of a 200: the best translation of each sentence (sampling: its first sample),
    in order, and with ``nbest`` > 1 each sentence's hypotheses, best first (sampling: in the
    order drawn), with their scores (nmt-generate's)."""
    out: dict = {"translations": [r.text for r in results]}
    if nbest > 1:
        out["nbest"] = [[{"translation": h.text, "score": round_score(h.score)}
                         for h in r.hypotheses] for r in results]
    return out


def create_app(models: Models, cfg: ServeConfig,
               on_load_failure: Callable[[], None] | None = None,
               stopping: Callable[[], bool] = lambda: False) -> Starlette:
    """The application serving ``models`` (loaded in the background when it starts; if one
    cannot be, ``on_load_failure()`` is called, e.g. to stop the server). ``stopping()``:
    whether the server has begun to stop (its requests then get --shutdown-grace)."""
    clock = Clock(cfg, stopping)

    async def health(request: Request) -> JSONResponse:
        return Json({"status": "ok"})

    async def ready(request: Request) -> JSONResponse:
        if models.ready.is_set() and (broken := models.broken):
            return Json({"status": "failed", "models": models.names, "failed": broken},
                        status_code=503)
        if models.ready.is_set():
            return Json({"status": "ready", "models": models.names})
        return Json({"status": "loading" if models.error is None else "failed",
                     "models": models.names}, status_code=503)

    async def translate(request: Request) -> JSONResponse:
        try:
            if models.error is not None:
                raise RequestError(503, "the models could not be loaded; the server is "
                                        "stopping (its log says why)")
            if not models.ready.is_set():
                raise RequestError(503, "the models are still loading; GET /ready says when "
                                        "they are loaded")
            deadline = clock.deadline()
            try:
                body = await asyncio.wait_for(read_body(request, cfg.max_request_bytes),
                                              deadline.left())
            except asyncio.TimeoutError:
                raise RequestError(408, f"the request body did not arrive within "
                                        f"{cfg.request_timeout:g} s (--request-timeout)"
                                   ) from None
            req = parse_request(parse_json(body), models.loaded, cfg)
            ids, prefixes, constraints = await run_in_threadpool(encode, req, cfg)
            future = req.model.batcher.submit(req.search, ids, req.texts, prefixes,
                                              constraints, req.sampling)
            results = await clock.result(future, request, deadline, len(ids))
            return Json(reply(results, req.search.nbest))
        except RequestError as e:
            return error(e.status, str(e))
        except Stopping as e:
            return error(503, str(e))
        except QueueFull as e:
            return error(503, str(e), headers={"Retry-After": "1"})
        except Exception as e:  # noqa: BLE001 - one JSON line for the client, not a traceback
            log.error("POST /translate failed: %s: %s", type(e).__name__, e)
            return error(500, f"internal error: {type(e).__name__}: {e}")

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        reason = {404: f"no such path {request.url.path} (try POST /translate, GET /health, "
                       f"GET /ready)",
                  405: f"{request.method} is not allowed on {request.url.path}"}
        # (a 405 keeps the Allow header HTTP requires with it)
        return error(exc.status_code, reason.get(exc.status_code, str(exc.detail)),
                     headers=getattr(exc, "headers", None))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        log_fd_shortage_once(asyncio.get_running_loop())
        models.load_in_background(on_load_failure)
        try:
            yield
        finally:
            # Every request has been answered by now (the last ones with 503 once the grace
            # was over): what may still be queued has no client. A batch being decoded is
            # given a few seconds, then left to the process's exit.
            await run_in_threadpool(models.stop, STOP_WAIT)
            log.info("stopped")

    return Starlette(routes=[Route("/health", health, methods=["GET"]),
                             Route("/ready", ready, methods=["GET"]),
                             Route("/translate", translate, methods=["POST"])],
                     exception_handlers={HTTPException: http_error}, lifespan=lifespan)


STOP_WAIT = 5.0     # seconds the decoding threads get at exit, after the grace


# What asyncio reports, once per failed accept() and with a traceback, when the process is
# out of file descriptors (or memory for sockets); it retries the accept a second later.
FD_SHORTAGE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def log_fd_shortage_once(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` log a shortage of file descriptors in one warning for the whole run,
    instead of a traceback for every failed accept (megabytes of log under load)."""
    previous = loop.get_exception_handler()
    warned = False

    def handler(loop, context):
        nonlocal warned
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in FD_SHORTAGE:
            if not warned:
                warned = True
                log.warning("cannot accept connections: %s (new connections wait until others "
                            "close; raise the limit with ulimit -n or lower "
                            "--max-connections); said once", exc.strerror or exc)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


__all__ = ["create_app", "read_body", "error", "Json", "log_fd_shortage_once"]
