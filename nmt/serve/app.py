"""The HTTP side of nmt-serve: a Starlette (ASGI) application.

    GET  /health      200 {"status": "ok"} while the process runs
    GET  /ready       200 {"status": "ready", "models": [...]} once every model is loaded,
                      503 {"status": "loading", ...} before (or "failed": a model could not
                      be loaded, or its decoding thread failed)
    POST /translate   {"text": [...], ...} (nmt.serve.requests) -> {"translations": [...]}

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
import json
import logging
from typing import Callable, Mapping

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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


def create_app(models: Models, cfg: ServeConfig,
               on_load_failure: Callable[[], None] | None = None) -> Starlette:
    """The application serving ``models`` (loaded in the background when it starts; if one
    cannot be, ``on_load_failure()`` is called, e.g. to stop the server)."""

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
            obj = parse_json(await read_body(request, cfg.max_request_bytes))
            req = parse_request(obj, models.loaded, cfg)
            ids, prefixes, constraints = await run_in_threadpool(encode, req, cfg)
            future = req.model.batcher.submit(req.search, ids, req.texts, prefixes,
                                              constraints)
            results = await asyncio.wrap_future(future)
            return Json({"translations": [r.text for r in results]})
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
        models.load_in_background(on_load_failure)
        try:
            yield
        finally:
            # uvicorn has finished every request in flight by now; anything still queued
            # (e.g. a client that went away) is decoded before the threads end.
            await run_in_threadpool(models.stop)
            log.info("stopped")

    return Starlette(routes=[Route("/health", health, methods=["GET"]),
                             Route("/ready", ready, methods=["GET"]),
                             Route("/translate", translate, methods=["POST"])],
                     exception_handlers={HTTPException: http_error}, lifespan=lifespan)


__all__ = ["create_app", "read_body", "error", "Json"]
