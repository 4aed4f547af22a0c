"""OpenAI-shaped JSON errors: ``{"error": {"message", "type"}}`` with a stable type."""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.families import ApiError
from server.runtime.errors import BusyError, RuntimeErrorBase


def error_response(status: int, message: str, error_type: str, retry_after: float | None = None) -> JSONResponse:
    headers = {}
    if status == 503:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after or 1.0)))
    return JSONResponse({"error": {"message": message, "type": error_type}}, status_code=status, headers=headers)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.error_type)


async def runtime_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RuntimeErrorBase)
    retry = exc.retry_after if isinstance(exc, BusyError) else None
    return error_response(exc.status, exc.message, exc.error_type, retry)


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(404, f"unknown endpoint: {request.url.path}", "not_found_error")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return error_response(405, f"method {request.method} not allowed on {request.url.path}", "invalid_request_error")


async def server_error(request: Request, exc: Exception) -> Response:
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
