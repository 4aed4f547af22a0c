"""Request bodies: the size limit, JSON objects, multipart forms, typed fields."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anyio
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.families import ApiError, bad
from server.http.errors import error_response

DRAIN_BYTES = 1024 * 1024
"""Unread request bytes discarded after an early response (403, 404, 413...), at most."""


class BodyLimit:
    """ASGI middleware: 413 for bodies over the limit (declared or actually sent).

    It also reads what is left of a small request body before the end of an
    early response (403, 404, 413... sent before the body was read): hypercorn
    closes such a connection as soon as the response ends, and a socket closed
    with unread bytes in it makes the kernel send a reset, which can destroy
    the response before the client reads it.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
        if declared is not None and (declared < 0 or declared > self.limit):
            drain = 0 <= declared <= self.limit + DRAIN_BYTES

            async def drained(message: Message) -> None:
                if drain and message["type"] == "http.response.body" and not message.get("more_body", False):
                    await _drain(receive)
                await send(message)

            await self._too_large(scope, receive, drained)
            return
        seen = 0
        started = False
        finished = False

        async def counted() -> Message:
            nonlocal seen, finished
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                finished = not message.get("more_body", False)
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            else:
                finished = True
            return message

        async def watch(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False) and not finished:
                finished = True
                await _drain(receive)
            await send(message)

        try:
            await self.app(scope, counted, watch)
        except _TooLarge:
            if not started:
                await self._too_large(scope, receive, watch)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(413, f"request body exceeds max_request_body_bytes={self.limit}", "invalid_request_error")
        await response(scope, receive, send)


async def _drain(receive: Receive) -> None:
    """Discard the rest of the request body (bounded in bytes and time)."""
    left = DRAIN_BYTES
    with anyio.move_on_after(5.0):
        while left > 0:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            left -= len(message.get("body", b""))


class _TooLarge(ApiError):
    """Raised from ``receive`` inside a handler, so the app's ApiError handler answers 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds max_request_body_bytes={limit}")


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong."""
    raw = await request.body()
    if not raw:
        raise bad("request body must be a JSON object")
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise bad("request body must be a JSON object")
    return value


def is_multipart(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


async def form_fields(request: Request) -> tuple[dict[str, Any], bytes | None, str | None]:
    """Multipart fields (strings), the ``file`` part's bytes and its filename."""
    try:
        form = await request.form(max_files=4, max_fields=64)
    except ApiError:
        raise
    except Exception as exc:
        raise bad(f"malformed multipart body: {exc}") from exc
    fields: dict[str, Any] = {}
    data: bytes | None = None
    filename: str | None = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key != "file":
                continue
            if data is not None:
                raise bad("give exactly one 'file' part")
            data = await value.read()
            filename = value.filename
        else:
            fields[key] = value
    return fields, data, filename


def boolean(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A boolean field: JSON true/false, or the form strings true/True/1/false/False/0."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("true", "True", "1"):
        return True
    if isinstance(value, str) and value in ("false", "False", "0"):
        return False
    raise bad(f"'{key}' must be true or false")


def busy_timeout(body: Mapping[str, Any]) -> int | None:
    """The request's ``busy_timeout_ms`` override: an integer >= 0 (0 = use the ceiling)."""
    value = body.get("busy_timeout_ms")
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad("'busy_timeout_ms' must be an integer >= 0")
    return value


def text_field(body: Mapping[str, Any], key: str, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise bad(f"'{key}' is required")
        return None
    if not isinstance(value, str) or not value:
        raise bad(f"'{key}' must be a non-empty string")
    return value


__all__ = ["ApiError", "BodyLimit", "boolean", "busy_timeout", "form_fields", "is_multipart", "json_object", "text_field"]
