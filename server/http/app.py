"""Build the ASGI app: routes, the page, error handlers, body limit, CORS, request ids,
the access log, latency metrics, lifespan."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http import errors, routes_audio, routes_live, routes_models, routes_tasks
from server.http.body import BodyLimit
from server.http.errors import ApiError
from server.http.state import ServerState
from server.runtime.errors import RuntimeErrorBase

access_log = logging.getLogger("voxpool.access")

CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+=/-]{0,127}")
"""A client's ``X-Request-Id`` that is kept: 1-128 characters, no spaces or controls;
any other value is replaced by a fresh id."""

QUIET = frozenset({("GET", "/health"), ("GET", "/v1/models"), ("GET", "/metrics")})
"""Status polls: logged at debug when they succeed (the page polls /v1/models 4 times a second)."""

_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")


def request_id_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-Id`` when it is sane (:data:`CLIENT_REQUEST_ID`).

    Else a fresh id.
    """
    for name, value in headers:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if CLIENT_REQUEST_ID.fullmatch(text) else errors.new_request_id()
    return errors.new_request_id()


def printable(text: str, limit: int = 200) -> str:
    """``text`` for one log line: spaces, controls and non-ASCII escaped, cut to ``limit``."""
    out = _UNPRINTABLE.sub(
        lambda m: "".join(f"\\x{b:02x}" for b in m.group().encode("utf-8", "backslashreplace")),
        text,
    )
    return out if len(out) <= limit else out[: limit - 3] + "..."


class Observe:
    """ASGI middleware: request id, access log, per-route latency histogram, CORS echo.

    Each request gets one id: the client's ``X-Request-Id`` when sane, else a
    fresh one. It goes in the scope state (``request.state.request_id``) and in
    :data:`errors.REQUEST_ID`, so a 500's body and its logged traceback name
    the same id, and back to the client as ``X-Request-Id`` on every response.
    When the request ends, one line goes to the ``voxpool.access`` logger:
    method, path, status, duration, model (scope state ``model``, set by the
    routes) and id; also as the record's attributes of those names, for
    structured handlers. Status polls (:data:`QUIET`) log at debug, the rest at
    info; 499 is a client that went away before any response started. A response
    cut short by a client error after its headers (:data:`errors.CUT_STATUS`)
    is recorded with that error's status, not the 200 it started with.

    A WebSocket is logged as a ``GET`` when it ends: its status is 101 once
    accepted (the handshake's HTTP answer otherwise: a refusal's 4xx/503), and
    the line and record add ``ws_close``, the close code (ours, or the client's
    when it closed first; 1006: the connection was lost).
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 499  # no response sent: the client went away (cancelled) before one started
        websocket = scope["type"] == "websocket"
        ws_close: int | None = None
        headers = scope.get("headers", [])
        origin = next((v for k, v in headers if k == b"origin"), None)
        cors = self.state.config.cors_origins == "*" and origin is not None
        request_id = request_id_of(headers)
        scope.setdefault("state", {})["request_id"] = request_id
        token = errors.REQUEST_ID.set(request_id)

        async def wrapped(message: Message) -> None:
            nonlocal status, ws_close
            kind = message["type"]
            if kind == "websocket.accept":
                status = 101
                headers = [(k, v) for k, v in message.get("headers") or [] if k != b"x-request-id"]
                message["headers"] = [*headers, (b"x-request-id", request_id.encode())]
            elif kind == "websocket.close":
                if status == 499:  # refused before the upgrade: the listener answers 403
                    status = 403
                elif ws_close is None:
                    ws_close = int(message.get("code") or 1000)
            if kind in ("http.response.start", "websocket.http.response.start"):
                status = int(message["status"])
                out = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                out.append((b"x-request-id", request_id.encode()))
                if cors:
                    out.append((b"access-control-allow-origin", origin))
                message["headers"] = out
            await send(message)

        async def received() -> Message:
            nonlocal ws_close
            message = await receive()
            if message["type"] == "websocket.disconnect" and ws_close is None and status == 101:
                ws_close = int(message.get("code") or 1005)
            return message

        try:
            await self.app(scope, received if websocket else receive, wrapped)
        finally:
            errors.REQUEST_ID.reset(token)
            if websocket and status == 101 and ws_close is None:
                ws_close = 1006  # accepted, then lost without a close (e.g. aborted on a deadline)
            seconds = time.perf_counter() - t0
            status = scope.get("state", {}).get(errors.CUT_STATUS, status)
            model = scope.get("state", {}).get("model", "-")
            path = scope.get("path", "")
            route = route_of(scope)
            self.state.metrics.request_seconds.labels(model, route, str(status)).observe(seconds)
            method = scope.get("method", "GET")
            level = logging.DEBUG if (method, path) in QUIET and status < 400 else logging.INFO
            if access_log.isEnabledFor(level):
                fields: dict[str, Any] = {
                    "method": method,
                    "path": path,
                    "status": status,
                    "duration_ms": round(seconds * 1000.0, 3),
                    "model": model,
                    "request_id": request_id,
                }
                line = "%s %s %d %.1fms model=%s id=%s"
                args: list[Any] = [method, printable(path), status, seconds * 1000.0]
                args += [model, request_id]
                if websocket:
                    fields["ws_close"] = ws_close
                    line += " ws_close=%s"
                    args.append("-" if ws_close is None else ws_close)
                access_log.log(level, line, *args, extra=fields)


UNMATCHED = "(unmatched)"
"""The metrics' route label of a request no route matched (a 404 of an unknown path)."""


def route_of(scope: Scope) -> str:
    """The metrics' route label: the matched route's template (``/v1/models/{id}``), never the
    request's own path, so that clients cannot add label values (and memory) by asking for
    paths or ids that do not exist; :data:`UNMATCHED` where no route matched."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED


class CancelOnDisconnect:
    """ASGI middleware: a client that goes away cancels its request.

    Once the request body has been read, a watcher waits for ``http.disconnect``
    and, if no response has started, cancels the handler, so a request still
    queued for a slot leaves the queue (and one running releases its lease at
    its session's next stop point, :mod:`core.stopping`) instead of holding its
    place for a client that is gone; it counts the request in ``gone``
    (``voxpool_clients_gone_total``). A handler whose work ends anyway before a
    stop point still ends with a response: it is dropped, not sent, so the
    request is logged as the 499 it is, not as a 200 nobody read.
    Once a response has started it is left alone: streaming responses watch for
    the disconnect themselves, and the listener aborts a client that stops
    reading once its write deadline has passed.
    """

    def __init__(self, app: ASGIApp, gone: Callable[[str], None] = lambda route: None) -> None:
        self.app = app
        self.gone = gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_read = anyio.Event()
        disconnected = anyio.Event()
        started = False

        async def tracked() -> Message:
            # one reader at a time: the handler until its body is read, then the watcher,
            # which relays the disconnect to the handler (a streaming response listens too)
            if body_read.is_set():
                await disconnected.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            if message["type"] == "http.disconnect":
                disconnected.set()
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            if not started and disconnected.is_set():
                return  # the client left before any response: nothing is sent (a 499)
            started = True
            await send(message)

        async def watch(cancel: anyio.CancelScope) -> None:
            await body_read.wait()
            if not disconnected.is_set():
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected.set()
            if not started:
                self.gone(route_of(scope))
                cancel.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            await self.app(scope, tracked, sending)
            tg.cancel_scope.cancel()


PAGE_DIR = Path(__file__).parent / "page"
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/page/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/page/style.css": ("style.css", "text/css; charset=utf-8"),
}
"""The web page (``server/http/page/``): its paths, files and types, read once at startup."""

PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "media-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
}
"""Same-origin only: the page talks to this server's API and nothing else."""


def page_routes() -> list[Route]:
    """``GET /`` (the page) and its assets, served from memory."""

    def serve(body: bytes, media_type: str) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def endpoint(request: Request) -> Response:
            return Response(body, media_type=media_type, headers=PAGE_HEADERS)

        return endpoint

    return [
        Route(path, serve((PAGE_DIR / name).read_bytes(), media), methods=["GET"])
        for path, (name, media) in PAGE_FILES.items()
    ]


def build_app(state: ServerState) -> ASGIApp:
    """The ASGI application over ``state``'s runtime."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with state.runtime:
            for spec in list(state.runtime.specs.values()):
                if not spec.lazy:
                    await state.runtime.load_model(spec.id)
            yield

    routes = [
        *page_routes(),
        Route("/health", routes_models.health, methods=["GET"]),
        Route("/v1/models", routes_models.models, methods=["GET"]),
        Route("/v1/models/load", routes_models.load, methods=["POST"]),
        Route("/v1/models/unload", routes_models.unload, methods=["POST"]),
        Route("/v1/models/{id}", routes_models.model, methods=["GET"]),
        Route("/v1/tasks/unload_models", routes_models.unload_models, methods=["POST"]),
        Route("/v1/tasks/unload_all_models", routes_models.unload_all, methods=["POST"]),
        Route("/v1/audio/speech", routes_audio.speech, methods=["POST"]),
        Route("/v1/audio/transcriptions", routes_audio.transcriptions, methods=["POST"]),
        Route("/v1/audio/vad", routes_audio.vad, methods=["POST"]),
        WebSocketRoute(routes_live.LIVE_PATH, routes_live.vad_live),
        Route(routes_live.LIVE_PATH, routes_live.upgrade_required, methods=["GET"]),
        Route("/v1/audio/voices", routes_audio.voices, methods=["GET"]),
        Route("/v1/tasks/run", routes_tasks.run, methods=["POST"]),
        Route("/v1/tasks/batch", routes_tasks.batch, methods=["POST"]),
        Route("/v1/tasks/stream", routes_tasks.stream, methods=["POST"]),
        Route("/metrics", routes_models.metrics, methods=["GET"]),
        Route("/openapi.json", routes_models.openapi, methods=["GET"]),
    ]

    async def http_error(request, exc):  # type: ignore[no-untyped-def]
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            return await errors.method_not_allowed(request, exc)
        return await errors.not_found(request, exc)

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: errors.api_error,
            RuntimeErrorBase: errors.runtime_error,
            HTTPException: http_error,
            Exception: errors.server_error,
        },
    )
    app.state.vox = state
    gone = state.metrics.clients_gone
    inner = CancelOnDisconnect(
        routes_live.WebSocketNotFound(app), lambda route: gone.labels(route).inc()
    )
    return Observe(BodyLimit(inner, state.config.max_request_body_bytes, app.routes), state)
