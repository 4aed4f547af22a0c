"""The ingress deployment: voxpool's HTTP API in front of the model replicas.

The ingress reads each request (the whole body, under
``max_request_body_bytes``: 413 otherwise), finds the model it names
(:func:`model_of`) and forwards it (:class:`server.ray.exchange.Forwarded`) to
the model deployment with that model as Ray Serve's multiplexed model id, so
Ray routes it to a replica that has the model loaded. The replica's response
streams back unchanged (SSE and raw audio included).

Retries (:meth:`IngressApp.forward`): a replica that answers 503
``server_busy`` before anything reached the client, or that dies or becomes
unreachable before then, makes the ingress try again, up to ``retries`` more
times, avoiding the replicas that answered busy (:mod:`server.ray.routing`);
then the client gets the last 503, or a clean 503 ``server_busy`` naming the
lost replica. A replica lost after the
response started ends the response: the client sees the connection close
early, never a hang.

``GET /v1/models`` and ``GET /metrics`` are fleet-wide (:mod:`server.ray.directory`),
``GET /health`` is the ingress's own; management requests (load, unload,
bulk unload) go to every replica (:mod:`server.ray.broadcast`); everything
else (the page, ``/openapi.json``, voices) to one replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

import attrs
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from core.policy import retry_pause
from server.config import MODEL_ID, ServerConfig
from server.http.body import BodyLimit
from server.http.errors import error_response
from server.ray.broadcast import broadcast, is_management
from server.ray.directory import directory, fleet_metrics, fleet_models
from server.ray.exchange import Forwarded, Start, answer

log = logging.getLogger("voxpool.ray")

MODEL_FIELDS = {"/v1/models/load": "id", "/v1/models/unload": "id"}
"""Routes whose model is named by another field than ``model``."""


async def model_of(request: Forwarded) -> str | None:
    """The model id the request names (JSON or form field ``model``, or the query's), if any."""
    field = MODEL_FIELDS.get(request.path, "model")
    query = parse_qs(request.query_string.decode("latin-1"))
    if field in query:
        return query[field][0]
    content_type = dict(request.headers).get(b"content-type", b"").decode("latin-1").lower()
    value: Any = None
    if content_type.startswith("application/json") or (not content_type and request.body):
        try:
            body = json.loads(request.body)
        except ValueError:
            return None
        value = body.get(field) if isinstance(body, dict) else None
    elif content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        value = await _form_field(request, field)
    return value if isinstance(value, str) and value else None


async def _form_field(request: Forwarded, field: str) -> Any:
    """One field of a form body, or None when the form cannot be read."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": request.body, "more_body": False}

    try:
        async with Request(request.scope(), receive).form() as form:
            value = form.get(field)
            return value if isinstance(value, str) else None
    except Exception:  # a malformed form: the replica answers it with its 400
        return None


async def read_request(scope: Scope, receive: Receive) -> Forwarded | None:
    """The whole request, or None if the client went away while sending it."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    client = scope.get("client")
    return Forwarded(
        method=scope["method"],
        path=scope["path"],
        query_string=scope.get("query_string", b""),
        headers=tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", [])),
        body=bytes(body),
        client=tuple(client) if client else None,
    )


def is_busy(start: Start, body: bytes) -> bool:
    """A 503 ``server_busy`` answer: another replica may take the request."""
    if start.status != 503:
        return False
    try:
        return bool(json.loads(body)["error"]["type"] == "server_busy")
    except (ValueError, KeyError, TypeError):
        return False


class IngressApp:
    """The ingress's ASGI app (Ray Serve runs it in every ingress replica)."""

    def __init__(self, models: Any, config: ServerConfig, app_name: str, retries: int) -> None:
        self.models = models
        self.config = config
        self.app_name = app_name
        self.retries = retries
        self.directory: Any = None  # the directory actor, found at the first fleet view
        # a management command waits for the busiest replica's managers at most this long
        self.management_timeout_s = (config.busy_timeout_ms or 300_000) / 1000.0 + 30.0
        self._limited = BodyLimit(self._http, config.max_request_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            await self._limited(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = await read_request(scope, receive)
        if request is None:
            return
        key = (request.method, request.path)
        if key == ("GET", "/v1/models"):
            reports = await self._reports()
            body = json.dumps({"object": "list", "data": fleet_models(reports)}).encode()
            await _respond(send, 200, body, b"application/json")
        elif key == ("GET", "/metrics"):
            body = fleet_metrics(await self._reports())
            await _respond(send, 200, body, b"text/plain; version=0.0.4; charset=utf-8")
        elif key == ("GET", "/health"):
            replicas = len(await self._reports())
            body = json.dumps({"status": "ok", "replicas": replicas, "ray": True}).encode()
            await _respond(send, 200, body, b"application/json")
        elif is_management(request):
            start, body = await broadcast(self._directory(), request, self.management_timeout_s)
            await _respond(send, start.status, body, None, start.headers)
        else:
            await self.forward(request, send)

    def _directory(self) -> Any:
        if self.directory is None:
            self.directory = directory(self.app_name)
        return self.directory

    async def _reports(self) -> list[Any]:
        try:
            return list(await self._directory().reports.remote())
        except Exception:  # its owner went away: start (or find) a new one
            self.directory = None
            return list(await self._directory().reports.remote())

    async def forward(self, request: Forwarded, send: Send) -> None:
        """Send ``request`` to a replica of its model; retry busy or lost replicas.

        Every try names the model (Ray prefers a replica that has it loaded;
        any well-formed id, as models registered at run time are not in the
        config: a replica drops an id its runtime does not hold); a retry after
        a busy answer also names the replicas that refused it, which the
        deployment's router (server.ray.routing) then avoids.
        """
        model = await model_of(request)
        affinity = model if model and MODEL_ID.fullmatch(model) else ""
        handle = self.models.options(stream=True, multiplexed_model_id=affinity)
        last: tuple[Start, bytes] | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(retry_pause(attempt))
            outcome = await self._attempt(handle, request, send, attempt + 1)
            if outcome is None:
                return
            last = outcome
            if last[0].replica:
                request = attrs.evolve(request, avoid=(*request.avoid, last[0].replica))
        assert last is not None
        start, body = last
        await _respond(send, start.status, body, None, _tried(start.headers, self.retries + 1))

    async def _attempt(
        self, handle: Any, request: Forwarded, send: Send, attempt: int
    ) -> tuple[Start, bytes] | None:
        """One try (the ``attempt``-th): None when the response went to the client, else the
        503 to retry on."""
        started = False
        parts = handle.handle.remote(request)
        try:
            async for part in parts:
                if isinstance(part, Start):
                    start = part
                    if start.status == 503:
                        body = b"".join([p async for p in parts if isinstance(p, bytes)])
                        if is_busy(start, body):
                            return start, body
                        await _respond(send, 503, body, None, _tried(start.headers, attempt))
                        return None
                    await send(
                        {
                            "type": "http.response.start",
                            "status": start.status,
                            "headers": _tried(start.headers, attempt),
                        }
                    )
                    started = True
                else:
                    await send({"type": "http.response.body", "body": part, "more_body": True})
        except asyncio.CancelledError:
            parts.cancel()
            raise
        except Exception as exc:
            if started:
                raise  # the response is under way: the connection closes early
            log.warning("a replica was lost before answering: %s", exc)
            return _lost(exc)
        await send({"type": "http.response.body", "body": b""})
        return None


ATTEMPTS_HEADER = b"x-voxpool-attempts"
"""How many replicas the ingress tried for the answer (1: the first one answered)."""


def _tried(
    headers: tuple[tuple[bytes, bytes], ...], attempts: int
) -> tuple[tuple[bytes, bytes], ...]:
    """A replica's answer headers plus the ingress's attempt count."""
    return (*headers, (ATTEMPTS_HEADER, str(attempts).encode()))


def _lost(exc: Exception) -> tuple[Start, bytes]:
    """The 503 a client gets when every try lost its replica."""
    message = f"the replica serving this request was lost ({type(exc).__name__})"
    return answer(error_response(503, message, "server_busy"))


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    media_type: bytes | None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    out = list(headers) if headers else []
    if media_type is not None:
        out += [(b"content-type", media_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    """The ingress holds nothing across requests: startup and shutdown just complete."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class VoxpoolIngress:
    """The ingress deployment's class (wrapped by ``serve.ingress`` and
    ``serve.deployment`` in :mod:`server.ray.app`)."""

    def __init__(self, models: Any, config: ServerConfig, app_name: str, retries: int) -> None:
        self._app = IngressApp(models, config, app_name, retries)

    def __serve_build_asgi_app__(self) -> IngressApp:
        return self._app
