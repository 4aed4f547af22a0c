"""One HTTP exchange carried between the Ray ingress and a model replica.

The ingress reads the client's request (head and whole body, under the body
limit) into a :class:`Forwarded`, a plain picklable value; the replica replays
it against its own voxpool ASGI app (:func:`replay`) and yields the response
as a :class:`Start` followed by body chunks, which Ray streams back to the
ingress. Because the replica runs the very app that ``voxpool serve`` runs,
every route, validation, error and stream format is the same byte for byte.

When the ingress stops reading (its client went away, Ray cancelled the call)
the replica's generator is closed: the app then sees ``http.disconnect``, as
it would on a socket, so a queued request leaves its queue and a streaming one
releases its slot; the app gets :data:`DISCONNECT_GRACE_S` to do so before its
task is cancelled outright.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import attrs
from starlette.responses import Response
from starlette.types import ASGIApp, Message

DISCONNECT_GRACE_S = 30.0
"""How long a replayed request may take to wind down after its caller left."""


@attrs.frozen
class Forwarded:
    """A client request as the ingress read it: head, query and the whole body."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    client: tuple[str, int] | None = None
    avoid: tuple[str, ...] = ()
    """Replicas that answered this request busy: a retry goes elsewhere (server.ray.routing)."""

    def scope(self) -> dict[str, Any]:
        """The ASGI HTTP scope that replays this request."""
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": self.method,
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode("latin-1", "replace"),
            "root_path": "",
            "query_string": self.query_string,
            "headers": [(k, v) for k, v in self.headers],
            "client": self.client,
            "server": None,
            "state": {},
        }


@attrs.frozen
class Start:
    """The response head: status and headers (the body chunks follow as bytes), and the
    replica that answered."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    replica: str = ""


Part = Start | bytes
"""What a replica yields: one :class:`Start`, then the body in chunks."""


def answer(response: Response) -> tuple[Start, bytes]:
    """A whole Starlette response (an error's JSON, a merged answer) as a head and body."""
    headers = tuple((bytes(k), bytes(v)) for k, v in response.raw_headers)
    return Start(response.status_code, headers), bytes(response.body)


async def replay(app: ASGIApp, request: Forwarded) -> AsyncIterator[Part]:
    """Run ``request`` through ``app`` and yield its response as it is produced.

    Closing the generator early (the caller left) tells the app that the
    client disconnected and waits, up to :data:`DISCONNECT_GRACE_S`, for it to
    release what it holds.
    """
    parts: asyncio.Queue[Part | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if gone.is_set():
            raise OSError("the caller went away")
        if message["type"] == "http.response.start":
            headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", []))
            await parts.put(Start(int(message["status"]), headers))
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            if chunk:
                await parts.put(chunk)

    async def run() -> None:
        try:
            await app(request.scope(), receive, send)
        finally:
            await parts.put(None)

    task = asyncio.ensure_future(run())
    try:
        while (part := await parts.get()) is not None:
            yield part
        await task  # the app's own failure, if any, surfaces here
    finally:
        if not task.done():
            gone.set()
            await _wind_down(task)


async def complete(app: ASGIApp, request: Forwarded) -> tuple[int, bytes]:
    """Run ``request`` through ``app`` to the end: its status and whole body."""
    status, body = 0, bytearray()
    async for part in replay(app, request):
        if isinstance(part, Start):
            status = part.status
        else:
            body += part
    return status, bytes(body)


async def _wind_down(task: asyncio.Future[None]) -> None:
    """Let ``task`` notice the disconnect and finish; cancel it after the grace period.

    If the caller itself is cancelled meanwhile, ``task`` is cancelled at once
    and the cancellation goes on.
    """
    try:
        await asyncio.wait_for(asyncio.shield(task), DISCONNECT_GRACE_S)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    except Exception:  # the grace ran out, or the app failed (it logged why)
        pass
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
