"""Request bodies: the size limit, JSON objects, multipart forms, typed fields."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.policy import TIMEOUT_MS_MAX
from server.http.errors import ApiError, bad, error_response, show

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

    def __init__(self, app: ASGIApp, limit: int, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.limit = limit
        self.routes = routes  # to name the route of a request refused before routing

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
                if (
                    drain
                    and message["type"] == "http.response.body"
                    and not message.get("more_body", False)
                ):
                    await _drain(receive)
                await send(message)

            self._name_route(scope)
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
            elif (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and not finished
            ):
                finished = True
                await _drain(receive)
            await send(message)

        try:
            await self.app(scope, counted, watch)
        except _TooLarge:
            if not started:
                await self._too_large(scope, receive, watch)

    def _name_route(self, scope: Scope) -> None:
        """Record in ``scope`` the route a request refused before routing would have reached
        (as the router does), so that its metrics and log name that route, not
        ``(unmatched)``."""
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                scope["route"] = route
                return
            if match is Match.PARTIAL and partial is None:
                partial = route  # the path, not the method: the router's 405
        if partial is not None:
            scope["route"] = partial

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            f"request body exceeds max_request_body_bytes={self.limit}",
            "invalid_request_error",
        )
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


JSON_THREAD_BYTES = 64 * 1024
"""JSON bodies larger than this are parsed in a worker thread, off the event loop."""
MAX_JSON_CONTAINERS = 1_000_000
"""At most this many ``{``, ``[`` and ``,`` bytes in a JSON body: each can make one Python
object (at most about 80 bytes), so the parsed body stays within ``4 * body + 80 MB``."""
MAX_NUMBER_TEXT = 32
"""The longest numeric string accepted for a number field (form fields are strings)."""
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(raw: bytes) -> Any:
    """``raw`` as JSON, or a 400.

    Never a RecursionError, digit-limit ValueError or lone surrogate.
    """
    if raw.count(b"{") + raw.count(b"[") + raw.count(b",") > MAX_JSON_CONTAINERS:
        raise bad(f"request body has more than {MAX_JSON_CONTAINERS} JSON values")
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        raise bad("request body nests JSON too deeply") from None
    except UnicodeDecodeError:
        raise bad("request body is not valid UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise bad(f"request body is not valid JSON: {exc.msg} at byte {exc.pos}") from None
    except ValueError as exc:  # the int digit limit, NaN/Infinity
        text = str(exc)
        if "digits" in text:
            raise bad(
                "request body is not valid JSON here: an integer has too many digits"
            ) from None
        raise bad(f"request body is not valid JSON: {text[:80]}") from None
    _check_strings(value)
    return value


def _check_strings(value: Any) -> None:
    """400 if any key or string holds a lone surrogate (``"\\ud800"``): it has no UTF-8 form."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise bad("request body has a string with a lone UTF-16 surrogate") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


async def json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong.

    Large bodies parse off the loop.
    """
    try:
        raw = await request.body()
    except ClientDisconnect:  # the body ended before its Content-Length (a half-closed socket)
        raise bad("request body ended before its declared Content-Length") from None
    if not raw:
        raise bad("request body must be a JSON object")
    if len(raw) > JSON_THREAD_BYTES:
        value = await anyio.to_thread.run_sync(parse_json, raw)
    else:
        value = parse_json(raw)
    if not isinstance(value, dict):
        raise bad("request body must be a JSON object")
    return value


def is_multipart(request: Request) -> bool:
    return request.headers.get("content-type", "").lower().startswith("multipart/form-data")


def check_json_or_multipart(request: Request) -> None:
    """400 unless the body's ``Content-Type`` is one an audio route reads: multipart/form-data
    or JSON (``application/json``, or no ``Content-Type`` at all, read as JSON)."""
    given = request.headers.get("content-type", "")
    media = given.split(";", 1)[0].strip().lower()
    if media and media != "application/json" and not is_multipart(request):
        raise bad(
            f"Content-Type {show(given)} is not accepted here; send multipart/form-data "
            "(a 'file' part) or application/json"
        )


class _Multipart(MultiPartParser):
    """Starlette's multipart parser, noting whether the closing boundary arrived:
    python-multipart does not check, so a truncated body would parse as its complete parts."""

    complete = False

    def on_end(self) -> None:
        self.complete = True


async def form_fields(request: Request) -> tuple[dict[str, Any], bytes | None, str | None]:
    """Multipart fields (strings), the ``file`` part's bytes and its filename.

    A 400 names what is wrong: a body that ends before its closing boundary
    (truncated), or a ``file`` part without ``filename=`` (a text field, not an upload).
    """
    parser = _Multipart(request.headers, request.stream(), max_files=4, max_fields=64)
    try:
        form = await parser.parse()
    except ApiError:
        raise
    except Exception as exc:
        raise bad(f"malformed multipart body: {str(exc)[:120]}") from exc
    fields: dict[str, Any] = {}
    data: bytes | None = None
    filename: str | None = None
    try:
        if not parser.complete:
            raise bad("malformed multipart body: it ends before its closing boundary (truncated?)")
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "file":
                    continue
                if data is not None:
                    raise bad("give exactly one 'file' part")
                data = await value.read()
                filename = value.filename
            elif key == "file":
                raise bad(
                    "the 'file' part has no filename in its Content-Disposition, so it is a "
                    'text field, not an upload: add filename="..." (any name)'
                )
            elif key.endswith("[]"):  # a repeated array field (OpenAI's timestamp_granularities[])
                fields.setdefault(key, []).append(value)
            else:
                fields[key] = value
    finally:
        await form.close()
    return fields, data, filename


FORM_BOOLEANS = ("true", "True", "1", "false", "False", "0")
"""The strings a boolean field accepts (form fields are strings): the first three are true."""


def boolean(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """A boolean field: JSON true/false, or one of :data:`FORM_BOOLEANS`."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in FORM_BOOLEANS:
        return FORM_BOOLEANS.index(value) < 3
    raise bad(f"'{key}' must be true or false")


def _range_text(lo: float, hi: float, is_open: bool) -> str:
    return f"> {lo:g} and < {hi:g}" if is_open else f"between {lo:g} and {hi:g}"


def integer(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    """An optional integer field in ``[lo, hi]``: a JSON integer (or integral float), or a string
    of ASCII digits. Booleans, fractions, non-finite numbers, digit look-alikes (``"²"``,
    ``"--5"``) and numbers out of range are a 400 naming the field and its range."""
    value = body.get(key)
    if value is None:
        return None
    error = bad(f"'{key}' must be an integer between {lo} and {hi}")
    if isinstance(value, bool):
        raise error
    if isinstance(value, str):
        if len(value) > MAX_NUMBER_TEXT or not _INT_TEXT.fullmatch(value):
            raise error
        value = int(value)
    elif isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer() and lo <= value <= hi):
            raise error
        value = int(value)
    if not isinstance(value, int) or not lo <= value <= hi:
        raise error
    return value


def number(
    body: Mapping[str, Any], key: str, lo: float, hi: float, *, is_open: bool = False
) -> float | None:
    """An optional finite number field in ``[lo, hi]`` (``(lo, hi)`` when ``is_open``): a JSON
    number or a plain ASCII decimal string; anything else is a 400 naming the field and range."""
    value = body.get(key)
    if value is None:
        return None
    error = bad(f"'{key}' must be a number {_range_text(lo, hi, is_open)}")
    if isinstance(value, bool):
        raise error
    if isinstance(value, str):
        if len(value) > MAX_NUMBER_TEXT or not _FLOAT_TEXT.fullmatch(value):
            raise error
        value = float(value)
    if not isinstance(value, int | float):
        raise error
    # compare before converting: a 400-digit integer is out of range, not an OverflowError
    if isinstance(value, float) and not math.isfinite(value):
        raise error
    if value > hi or value < lo or (is_open and value in (lo, hi)):
        raise error
    return float(value)


def busy_timeout(body: Mapping[str, Any]) -> int | None:
    """The request's ``busy_timeout_ms`` override (0 = keep the ceiling): the form or JSON
    syntax of :func:`integer`, the range of core.policy's one rule."""
    return integer(body, "busy_timeout_ms", 0, TIMEOUT_MS_MAX)


def string(
    body: Mapping[str, Any], key: str, *, max_chars: int, required: bool = False
) -> str | None:
    """An optional (or required) non-empty string field of at most ``max_chars`` characters."""
    value = body.get(key)
    if value is None:
        if required:
            raise bad(f"'{key}' is required")
        return None
    if not isinstance(value, str) or not value:
        raise bad(f"'{key}' must be a non-empty string")
    if len(value) > max_chars:
        raise bad(f"'{key}' is too long (at most {max_chars} characters)")
    return value


def choice(
    body: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str | None = None
) -> str | None:
    """An optional field that must be one of ``allowed``.

    The default when absent, null or empty.
    """
    value = body.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str) or value not in allowed:
        raise bad(f"unsupported {key} {show(value)}; supported: {', '.join(allowed)}")
    return value


__all__ = [
    "ApiError",
    "BodyLimit",
    "boolean",
    "busy_timeout",
    "check_json_or_multipart",
    "choice",
    "form_fields",
    "integer",
    "is_multipart",
    "json_object",
    "number",
    "parse_json",
    "string",
]
