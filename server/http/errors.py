"""OpenAI-shaped JSON errors: ``{"error": {"message", "type"}}`` with a stable type.

Client errors say what is wrong with the request. A 500 never carries the
internal exception text: it is logged under the request's id, and the
response gives only that id (in the message, ``error.request_id`` and the
``X-Request-Id`` header), so an operator can find the traceback. The id is
the one the app's middleware gave the request (:data:`REQUEST_ID`, also in the
access log line and every response's ``X-Request-Id``); outside a request a
fresh one is made.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.runtime.errors import BusyError, RuntimeErrorBase

log = logging.getLogger("voxpool.http")

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "voxpool_request_id", default=None
)
"""The id of the request being handled (set by the app's middleware for the request's task)."""

CUT_STATUS = "cut_status"
"""The scope state key of a response cut short by a client error after its headers were sent
(:class:`~server.http.streaming.LeasedResponse`): the status it would have had, which the access
log and the latency metric record instead of the one sent."""

ECHO_CHARS = 80
"""The longest piece of a client's own input quoted back in an error message."""


class ApiError(Exception):
    """An HTTP error with an OpenAI-shaped JSON body."""

    def __init__(
        self, status: int, message: str, error_type: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


def bad(message: str) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message)


def show(value: Any) -> str:
    """``repr(value)`` cut to :data:`ECHO_CHARS`, for quoting client input in a message."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


class ErrorJSON(JSONResponse):
    """JSON rendered ASCII-only, so any echoed client text (lone surrogates included) encodes."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_response(
    status: int,
    message: str,
    error_type: str,
    retry_after: float | None = None,
    headers: dict[str, str] | None = None,
    request_id: str | None = None,
) -> JSONResponse:
    out = dict(headers or {})
    if status == 503:
        out["Retry-After"] = str(max(1, math.ceil(retry_after or 1.0)))
    error: dict[str, Any] = {"message": message, "type": error_type}
    if request_id is not None:
        error["request_id"] = request_id
        out["X-Request-Id"] = request_id
    return ErrorJSON({"error": error}, status_code=status, headers=out)


def new_request_id() -> str:
    """A fresh request id: 16 hex digits."""
    return uuid.uuid4().hex[:16]


def internal_error(exc: BaseException, what: str = "internal error") -> tuple[str, str]:
    """Log ``exc`` under the request's id (:data:`REQUEST_ID`, else a fresh one); the
    client-facing message and the id."""
    request_id = REQUEST_ID.get() or new_request_id()
    log.error("request %s failed: %s", request_id, what, exc_info=exc)
    return f"{what} (request id {request_id}; details are in the server log)", request_id


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.error_type)


async def runtime_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RuntimeErrorBase)
    if exc.status >= 500 and not isinstance(
        exc, BusyError
    ):  # a load failure: the model's internals
        message, request_id = internal_error(exc, "the model could not be loaded")
        return error_response(exc.status, message, exc.error_type, request_id=request_id)
    retry = exc.retry_after if isinstance(exc, BusyError) else None
    return error_response(exc.status, exc.message, exc.error_type, retry)


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, f"unknown endpoint: {show(request.url.path)}", "not_found_error")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    allow = exc.headers.get("Allow") if isinstance(exc, HTTPException) and exc.headers else None
    return error_response(
        405,
        f"method {show(request.method)} not allowed on {show(request.url.path)}",
        "invalid_request_error",
        headers={"Allow": allow} if allow else None,
    )


async def server_error(request: Request, exc: Exception) -> Response:
    message, request_id = internal_error(exc)
    return error_response(500, message, "server_error", request_id=request_id)
