"""Responses that hold a lease: the body owns it until the exchange ends.

A streamed response (SSE or raw audio) or a deferred batch acquires its lease
*before* the headers are sent (so a busy model still gets a 503) and releases it
when the body finishes, fails, the client disconnects, or the response is
dropped unstarted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from server.http.errors import CUT_STATUS, ApiError, internal_error, log


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON (or the literal ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class LeasedResponse(StreamingResponse):
    """A streaming response whose exit stack (holding the lease) closes when it ends.

    A client error raised by the body once the headers are out (a speech limit
    a later sentence breaks, in a raw-audio stream) cannot be answered any more:
    the body is cut short (no final chunk, so the client sees an incomplete
    response), a warning names the error and the status it would have had, and
    that status goes in the scope state's :data:`~server.http.errors.CUT_STATUS`
    for the access log and the latency metric. It is not a server failure.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        stack: AsyncExitStack,
        media_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            body, media_type=media_type, headers={"Cache-Control": "no-cache", **(headers or {})}
        )
        self._body = body
        self._stack = stack
        self._scope: Scope = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self._body, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._stack.aclose()

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except ApiError as exc:  # the headers are out: cut the body (see the class docstring)
            self.ended_early(exc)

    def ended_early(self, exc: Exception, how: str = "cut short") -> None:
        """The body ended on ``exc`` after the headers (``how``: cut short, or closed by an
        error event): its status (a client error's, else 500) goes in
        :data:`~server.http.errors.CUT_STATUS`; a client error is logged as a warning here
        (a server error was logged with its traceback where it was caught)."""
        status = exc.status if isinstance(exc, ApiError) else 500
        self._scope.setdefault("state", {})[CUT_STATUS] = status
        if isinstance(exc, ApiError):
            log.warning(
                "request %s: response %s by a client error after its headers "
                "(it would have been status %d): %s",
                self._scope.get("state", {}).get("request_id", "-"),
                how,
                exc.status,
                exc.message,
            )


def sse_error(exc: BaseException) -> bytes:
    """The error event: a client error's own message; anything else only a logged request id."""
    if isinstance(exc, ApiError):
        return sse({"type": "error", "error": {"message": exc.message, "type": exc.error_type}})
    message, request_id = internal_error(exc, "the stream failed")
    return sse(
        {
            "type": "error",
            "error": {"message": message, "type": "server_error", "request_id": request_id},
        }
    )


async def sse_events(
    payloads: AsyncIterator[Any], failed: Callable[[Exception], None] = lambda exc: None
) -> AsyncIterator[bytes]:
    """Every payload as one SSE event, then ``[DONE]``.

    A failure mid-stream ends it with one error event, after ``failed(exc)``.

    Headers are already sent when a stream fails, so the error travels in the
    body, as audio.cpp's transport does.
    """
    try:
        async for payload in payloads:
            yield sse(payload)
        yield sse("[DONE]")
    except Exception as exc:
        event = sse_error(exc)
        failed(exc)
        yield event


def sse_response(payloads: AsyncIterator[Any], stack: AsyncExitStack) -> LeasedResponse:
    """:func:`sse_events` as a leased response: an error event is the request's status in
    the access log and the latency metric (:meth:`LeasedResponse.ended_early`), not 200."""
    response: LeasedResponse | None = None

    def failed(exc: Exception) -> None:
        assert response is not None  # the body runs only once the response exists
        response.ended_early(exc, "ended with an error event")

    response = LeasedResponse(sse_events(payloads, failed), stack, "text/event-stream")
    return response
