"""Build the ASGI app: routes, error handlers, body limit, CORS, latency metrics, lifespan."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.families import ApiError
from server.http import errors, routes_audio, routes_models, routes_tasks
from server.http.body import BodyLimit
from server.http.state import ServerState
from server.runtime.errors import RuntimeErrorBase


class Observe:
    """ASGI middleware: per-route latency histogram and CORS echo (``cors_origins = "*"``)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 499  # no response sent: the client went away (cancelled) before one started
        origin = next((v for k, v in scope.get("headers", []) if k == b"origin"), None)
        cors = self.state.config.cors_origins == "*" and origin is not None

        async def wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if cors:
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"], (b"access-control-allow-origin", origin)]
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            model = scope.get("state", {}).get("model", "-")
            self.state.metrics.request_seconds.labels(model, scope.get("path", ""), str(status)).observe(time.perf_counter() - t0)


class CancelOnDisconnect:
    """ASGI middleware: a client that goes away cancels its request.

    Once the request body has been read, a watcher waits for ``http.disconnect``
    and, if no response has started, cancels the handler, so a request still
    queued for a slot leaves the queue (and one running releases its lease when
    its current step ends) instead of holding its place for a client that is
    gone. Once a response has started it is left alone: streaming responses
    watch for the disconnect themselves, and the listener aborts a client that
    stops reading once its write deadline has passed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
            started = True
            await send(message)

        async def watch(cancel: anyio.CancelScope) -> None:
            await body_read.wait()
            if not disconnected.is_set():
                while (await receive())["type"] != "http.disconnect":
                    pass
                disconnected.set()
            if not started:
                cancel.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            await self.app(scope, tracked, sending)
            tg.cancel_scope.cancel()


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
        Route("/health", routes_models.health, methods=["GET"]),
        Route("/v1/models", routes_models.models, methods=["GET"]),
        Route("/v1/models/load", routes_models.load, methods=["POST"]),
        Route("/v1/models/unload", routes_models.unload, methods=["POST"]),
        Route("/v1/tasks/unload_models", routes_models.unload_models, methods=["POST"]),
        Route("/v1/tasks/unload_all_models", routes_models.unload_all, methods=["POST"]),
        Route("/v1/audio/speech", routes_audio.speech, methods=["POST"]),
        Route("/v1/audio/transcriptions", routes_audio.transcriptions, methods=["POST"]),
        Route("/v1/audio/vad", routes_audio.vad, methods=["POST"]),
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
    return Observe(BodyLimit(CancelOnDisconnect(app), state.config.max_request_body_bytes), state)
