"""voxpool's HTTP/1.1 server: h11 over anyio sockets, with a deadline on every client I/O.

It replaces hypercorn, whose trio TCP server shields every socket write
(``send_all`` inside a shielded cancel scope), so neither a handler nor a
shutdown could interrupt a write to a client that stopped reading: two such
clients held a model's slots, and the process, for as long as they liked.
Here this module owns the sockets, and every wait on a client is bounded:

* **head**: a complete request head must arrive within ``header_s`` of the
  connection opening or of the previous response ending. An idle keep-alive
  connection is closed quietly; one that sent part of a head is aborted and
  counted (``header``).
* **body**: each read of the request body must bring bytes within ``body_s``;
  otherwise the connection is aborted (``body``) and the handler sees
  ``http.disconnect``.
* **write**: each write of at most :data:`WRITE_SLICE` bytes must be taken by
  the kernel within ``write_s``. A write that makes no progress aborts the
  connection (``write``); the handler sees ``http.disconnect``, a stream is
  cancelled at its next chunk boundary and its lease is released.
* **shutdown** (:meth:`HttpServer.shutdown`): the listeners close at once,
  idle and half-received connections are closed, in-flight exchanges run to
  completion for up to ``shutdown_s``; whatever is still open then is aborted
  (``shutdown``), its handler cancelled between chunks.

An abort resets the connection (``SO_LINGER`` 0) instead of leaving the
kernel to deliver a buffer the client is not reading.

Requests that h11 cannot parse (a garbage request line, a bad
``Content-Length``, an oversized head) are answered, where the connection still
allows it, with the API's JSON error shape ``{"error": {"message", "type"}}``
and ``Connection: close``. The ASGI interface is spec version 2.3: after a
disconnect ``send`` is a no-op and ``receive`` returns ``http.disconnect``.

**WebSockets.** A ``GET`` whose ``Upgrade`` header names ``websocket`` is a
WebSocket handshake (RFC 6455; :mod:`wsproto` for the handshake's checks and the
framing, sans-IO as h11 is): a malformed one (no ``Sec-WebSocket-Key``, a wrong
version, a body, another method) is answered here with a 400 (426 for the
version) in the JSON error shape. Otherwise the app gets an ASGI ``websocket``
scope (spec 2.4, with the ``websocket.http.response`` extension, so an app may
refuse the upgrade with an ordinary HTTP response, which closes the connection).
No extension (compression) is negotiated. The client's messages are assembled
up to ``ws_max_message_bytes`` (a longer one is closed with 1009); pings are
answered; every write has the write deadline, as above; after either side's
close frame the connection lingers (at most ``LINGER_S``) for the other's, then
closes. The scope's ``voxpool.shutdown`` extension holds an event set when the
server starts to shut down, for an app that ends long-lived sockets then.
"""

from __future__ import annotations

import contextlib
import enum
import json
import socket
import struct
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

import anyio
import anyio.abc
import anyio.lowlevel
import attrs
import h11
import wsproto.events as ws_events
from starlette.types import ASGIApp, Message
from wsproto import ConnectionType
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState as WsState
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError as WsRemoteProtocolError

MAX_RECV = 64 * 1024
"""Bytes asked of the kernel per socket read."""
WRITE_SLICE = 64 * 1024
"""Writes are cut into slices of at most this size; each must be taken within the write deadline."""
MAX_HEAD_BYTES = 16 * 1024
"""Largest request head (request line and headers); a longer one gets 431."""
PIPELINE_BYTES = 64 * 1024
"""Bytes of pipelined requests read ahead while a response is running, at most."""
LINGER_S = 1.0
LINGER_BYTES = 1024 * 1024
"""A connection closed with request bytes unread first drains them (bounded), so the
kernel does not reset the connection before the client has read our response."""

DISCONNECT: Message = {"type": "http.disconnect"}
WS_MAX_MESSAGE_BYTES = 1024 * 1024
"""Longest WebSocket message a client may send by default (its fragments together)."""
WS_CLOSE_REASON_BYTES = 123
"""A close frame's reason is at most this many bytes of UTF-8 (RFC 6455: 125 with the code)."""
WS_EARLY_BYTES = 64 * 1024
"""Bytes a client may send before the handshake completes (kept for the WebSocket), at most."""


class AbortKind(enum.Enum):
    """Why a connection was aborted: the deadline that ran out (the metric's ``kind`` label)."""

    HEADER = "header"
    BODY = "body"
    WRITE = "write"
    SHUTDOWN = "shutdown"


@attrs.frozen
class Deadlines:
    """The bounds on waiting for a client, in seconds (see the module docstring)."""

    header_s: float = 5.0
    body_s: float = 30.0
    write_s: float = 30.0
    shutdown_s: float = 30.0


@attrs.frozen
class ShutdownReport:
    """What :meth:`HttpServer.shutdown` did.

    Connections drained, connections aborted, seconds taken.
    """

    drained: int
    aborted: int
    seconds: float


def _log(message: str) -> None:
    print(f"voxpool: {message}", file=sys.stderr, flush=True)


def json_error(
    status: int, message: str, error_type: str, request_id: str | None = None
) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of an error in the API's shape, closing the connection; like every
    response it has an ``X-Request-Id`` (the application's for the request, else a fresh one)."""
    body = json.dumps({"error": {"message": message, "type": error_type}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (b"x-request-id", (request_id or uuid.uuid4().hex[:16]).encode()),
    ]
    return headers, body


FRAMED_TWICE = (
    "malformed HTTP request: both Content-Length and Transfer-Encoding "
    "(send one of them; RFC 9112, section 6.3)"
)


def framed_twice(request: h11.Request) -> bool:
    """Whether ``request`` states its body's length both ways. h11 reads such a body as
    chunked and keeps the connection; a proxy in front that trusts ``Content-Length``
    would see another request boundary than this server (request smuggling), so the
    request gets a 400 and the connection closes (RFC 9112 allows either)."""
    names = {name for name, _ in request.headers}
    return b"content-length" in names and b"transfer-encoding" in names


def _malformed(exc: h11.RemoteProtocolError) -> str:
    """The client-facing text of a parse failure (h11 may quote the request line: cut it short)."""
    text = str(exc) or type(exc).__name__
    return "malformed HTTP request: " + (text if len(text) <= 160 else text[:157] + "...")


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class _Exchange:
    """One request and its response on a connection: the ASGI ``receive`` and ``send``."""

    def __init__(self, conn: _Connection, request: h11.Request, tg: anyio.abc.TaskGroup) -> None:
        self.conn = conn
        self.tg = tg
        self.method = request.method.upper()
        self.disconnected = anyio.Event()
        self.pending: Message | None = None
        self.body_done = False
        self.started = False
        self.done = False
        self.status = 0
        self.protocol_error: h11.RemoteProtocolError | None = None
        self.failure: BaseException | None = None

    @property
    def suppress_body(self) -> bool:
        return self.method == b"HEAD" or self.status in (204, 304) or self.status < 200

    def disconnect(self) -> None:
        self.disconnected.set()

    def prefetch(self) -> None:
        """Take what h11 already holds: an empty body completes at once (no socket read)."""
        event = self._next_event()
        if isinstance(event, h11.Data):
            self.pending = {"type": "http.request", "body": bytes(event.data), "more_body": True}
        elif isinstance(event, h11.EndOfMessage):
            self._body_complete()
            self.pending = {"type": "http.request", "body": b"", "more_body": False}

    def _next_event(self) -> Any:
        try:
            return self.conn.h11.next_event()
        except h11.RemoteProtocolError as exc:  # also a body cut short by the client's EOF:
            self.protocol_error = exc  # answered with a 400 if the client still reads
            self.disconnect()
            return None

    def _body_complete(self) -> None:
        self.body_done = True
        self.tg.start_soon(self._watch)

    async def receive(self) -> Message:
        if self.pending is not None:
            message, self.pending = self.pending, None
            return message
        if self.disconnected.is_set():
            return DISCONNECT
        if self.body_done:
            await self.disconnected.wait()
            return DISCONNECT
        conn = self.conn
        while True:
            event = self._next_event()
            if isinstance(event, h11.Data):
                return {"type": "http.request", "body": bytes(event.data), "more_body": True}
            if isinstance(event, h11.EndOfMessage):
                self._body_complete()
                return {"type": "http.request", "body": b"", "more_body": False}
            if event is not h11.NEED_DATA:  # a protocol error, or the client gone
                self.disconnect()
                return DISCONNECT
            if conn.h11.they_are_waiting_for_100_continue:
                await conn.write(
                    conn.h11.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                )
            if conn.closed:
                self.disconnect()
                return DISCONNECT
            with anyio.move_on_after(conn.server.deadlines.body_s) as timer:
                data = await conn.recv()
            if timer.cancelled_caught:
                await conn.abort(AbortKind.BODY)
                return DISCONNECT
            conn.h11.receive_data(data)

    async def _watch(self) -> None:
        """After the body: notice the client going away (EOF or reset) while the handler runs."""
        read_ahead = 0
        while read_ahead < PIPELINE_BYTES:
            data = await self.conn.recv()
            if not data:
                self.conn.keep_alive = False
                self.disconnect()
                return
            self.conn.h11.receive_data(data)  # a pipelined request, kept for the next cycle
            read_ahead += len(data)

    async def send(self, message: Message) -> None:
        conn = self.conn
        if conn.closed or self.protocol_error is not None:
            # the client is gone (or sent garbage, answered after the handler): a no-op, but a
            # checkpoint, so a handler that keeps sending is cancelled by its disconnect listener
            await anyio.lowlevel.checkpoint()
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.status = int(message["status"])
            headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            headers += conn.server.standard_headers()
            if conn.server.closing or conn.h11.their_state is not h11.DONE:
                headers.append((b"connection", b"close"))
            data = conn.h11.send(
                h11.Response(status_code=self.status, headers=headers, reason=_reason(self.status))
            )
            await conn.write(data or b"")
        elif kind == "http.response.body":
            if not self.started:
                raise RuntimeError("http.response.body sent before http.response.start")
            if self.done:
                return
            out = b""
            body = bytes(message.get("body", b""))
            if body and not self.suppress_body:
                out += conn.h11.send(h11.Data(data=body)) or b""
            if not message.get("more_body", False):
                out += conn.h11.send(h11.EndOfMessage()) or b""
                self.done = True
            if out:
                await conn.write(out)


class WebSocketClosed(OSError):
    """``send`` on a WebSocket that is closed (ASGI: a server-specific subclass of OSError)."""


def truncate_reason(reason: str) -> str:
    """``reason`` cut (at a character boundary) to fit a close frame."""
    data = reason.encode("utf-8")
    if len(data) <= WS_CLOSE_REASON_BYTES:
        return reason
    return data[:WS_CLOSE_REASON_BYTES].decode("utf-8", "ignore")


def json_reason(message: str, error_type: str = "invalid_request_error") -> str:
    """A close reason in the API's shape, ``{"type", "message"}``, that fits a close frame."""

    def render(text: str) -> str:
        return json.dumps({"type": error_type, "message": text}, separators=(",", ":"))

    reason = render(message)
    while len(reason.encode()) > WS_CLOSE_REASON_BYTES and message:
        message = message[: len(message) - max(1, len(reason.encode()) - WS_CLOSE_REASON_BYTES)]
        reason = render(message.rstrip() + "...")
    return reason


def wants_websocket(request: h11.Request) -> bool:
    """Whether ``request`` asks for a WebSocket (its ``Upgrade`` header names ``websocket``)."""
    return any(
        name == b"upgrade" and any(t.strip().lower() == b"websocket" for t in value.split(b","))
        for name, value in request.headers
    )


class _WsExchange:
    """One WebSocket on a connection, from the handshake to the close: the ASGI ``receive``
    and ``send`` of a ``websocket`` scope (see the module docstring)."""

    def __init__(self, conn: _Connection, handshake: H11Handshake) -> None:
        self.conn = conn
        self.handshake = handshake
        self.ws: WsConnection | None = None
        self.connect_sent = False
        self.accepted = False
        self.responded = False  # an HTTP response instead of the upgrade (denial or error)
        self.response_done = False
        self.closed = False  # no more frames either way: the app sees (or saw) a disconnect
        self.close_sent = False
        self.close_code = 1006
        self.close_reason = ""
        self.early = b""
        self.parts: list[bytes | str] = []
        self.part_bytes = 0
        self.failure: BaseException | None = None
        self.changed = anyio.Event()
        self.reading = anyio.Lock()
        self.writing = anyio.Lock()

    # the connection calls this when it is aborted (a deadline, shutdown)
    def disconnect(self) -> None:
        self.closed = True
        self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    @property
    def disconnected(self) -> Message:
        return {
            "type": "websocket.disconnect",
            "code": self.close_code,
            "reason": self.close_reason,
        }

    # ------------------------------------------------------------- receive
    async def receive(self) -> Message:
        if not self.connect_sent:
            self.connect_sent = True
            return {"type": "websocket.connect"}
        async with self.reading:
            while True:
                if self.ws is not None:
                    message = await self._next_message()
                    if message is not None:
                        return message
                if self.closed or self.conn.closed:
                    self.closed = True
                    return self.disconnected
                if self.ws is None and len(self.early) >= WS_EARLY_BYTES:
                    await self.changed.wait()  # frames before the handshake: read no more
                    continue
                data = await self.conn.recv()
                if self.ws is not None and self.ws.state is WsState.CLOSED:
                    self.closed = True  # both close frames went by (the send side saw the last)
                elif self.ws is not None:
                    self.ws.receive_data(data or None)
                elif data:
                    self.early += data
                else:
                    self.closed = True
                    return self.disconnected

    async def _next_message(self) -> Message | None:
        """Process the frames wsproto has parsed: a whole message, a disconnect, or None
        (more bytes are needed)."""
        ws = self.ws
        assert ws is not None
        limit = self.conn.server.ws_max_message_bytes
        for event in ws.events():
            if isinstance(event, ws_events.Message):
                data = event.data
                self.part_bytes += len(data) if isinstance(data, bytes) else len(data.encode())
                if limit and self.part_bytes > limit:
                    await self._close(1009, json_reason(f"message longer than {limit} bytes"))
                    return self.disconnected
                self.parts.append(bytes(data) if isinstance(data, bytearray) else data)
                if event.message_finished:
                    parts, self.parts, self.part_bytes = self.parts, [], 0
                    if isinstance(event, ws_events.TextMessage):
                        return {"type": "websocket.receive", "text": "".join(map(str, parts))}
                    return {
                        "type": "websocket.receive",
                        "bytes": b"".join(p for p in parts if isinstance(p, bytes)),
                    }
            elif isinstance(event, ws_events.Ping):
                if ws.state is WsState.OPEN:
                    await self._write(event.response())
            elif isinstance(event, ws_events.CloseConnection):
                if ws.state is WsState.OPEN:  # not the client's close: a frame wsproto refused
                    await self._close(event.code, json_reason(event.reason or "protocol error"))
                    return self.disconnected
                self.close_code, self.close_reason = event.code, event.reason or ""
                if ws.state is WsState.REMOTE_CLOSING:
                    await self._write(event.response())
                    self.close_sent = True
                self.closed = True
                self._changed()
                return self.disconnected
        return None

    # ---------------------------------------------------------------- send
    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            await self._accept(message)
        elif kind == "websocket.send":
            if not self.accepted:
                raise RuntimeError("websocket.send before websocket.accept")
            if self.closed or self.close_sent or self.conn.closed:
                raise WebSocketClosed("the WebSocket is closed")
            text, data = message.get("text"), message.get("bytes")
            event: ws_events.Event = (
                ws_events.TextMessage(data=text)
                if text is not None
                else ws_events.BytesMessage(data=bytes(data or b""))
            )
            if not await self._write(event):
                raise WebSocketClosed("the WebSocket is closed")
        elif kind == "websocket.close":
            if not self.accepted:
                if not self.responded:
                    self.responded = self.response_done = True
                    await self.conn.send_error(
                        403, "the server refused the WebSocket connection", "permission_error"
                    )
                return
            code = int(message.get("code") or 1000)
            await self._close(code, str(message.get("reason") or ""))
        elif kind == "websocket.http.response.start":
            if self.accepted or self.responded:
                raise RuntimeError("websocket.http.response.start after the handshake's answer")
            self.responded = True
            headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
            headers = [(k, v) for k, v in headers if k != b"connection"]
            headers += [(b"connection", b"close"), *self.conn.server.standard_headers()]
            status = int(message["status"])
            data = self.conn.h11.send(
                h11.Response(status_code=status, headers=headers, reason=_reason(status))
            )
            await self.conn.write(data or b"")
        elif kind == "websocket.http.response.body":
            if not self.responded or self.response_done:
                raise RuntimeError("websocket.http.response.body without its start")
            out = b""
            body = bytes(message.get("body", b""))
            if body:
                out += self.conn.h11.send(h11.Data(data=body)) or b""
            if not message.get("more_body", False):
                out += self.conn.h11.send(h11.EndOfMessage()) or b""
                self.response_done = True
            if out:
                await self.conn.write(out)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} on a WebSocket")

    async def _accept(self, message: Message) -> None:
        if self.accepted or self.responded:
            raise RuntimeError("websocket.accept sent twice, or after a response")
        headers = [(bytes(k).lower(), bytes(v)) for k, v in message.get("headers", [])]
        accept = ws_events.AcceptConnection(
            subprotocol=message.get("subprotocol"),
            extra_headers=headers + self.conn.server.standard_headers(),
        )
        data = self.handshake.send(accept)
        self.ws = self.handshake.connection
        self.accepted = True
        trailing, eof = self.conn.h11.trailing_data
        async with self.writing:
            if not await self.conn.write_whole(data):
                return
        assert self.ws is not None
        self.ws.receive_data(bytes(trailing) + self.early)
        self.early = b""
        if eof:
            self.ws.receive_data(None)
        self._changed()

    async def _write(self, event: ws_events.Event) -> bool:
        """Render (in order, under the write lock) and write one frame; False if the
        connection ended."""
        ws = self.ws
        assert ws is not None
        async with self.writing:
            if self.conn.closed:
                return False
            return await self.conn.write_whole(ws.send(event))

    async def _close(self, code: int, reason: str) -> None:
        """Our close frame (once), then the app's disconnect."""
        ws = self.ws
        if not self.close_sent and ws is not None and not self.conn.closed:
            self.close_sent = True
            if ws.state in (WsState.OPEN, WsState.REMOTE_CLOSING):
                event = ws_events.CloseConnection(code=code, reason=truncate_reason(reason))
                await self._write(event)
        if not self.closed:
            self.close_code, self.close_reason = code, reason
        self.closed = True
        self._changed()

    async def finish(self) -> None:
        """After the app: close the socket if it did not (1011 after a failure, 1000
        otherwise), then wait (briefly) for the client's close frame before the TCP close."""
        if not self.accepted:
            return
        if not self.close_sent and not self.conn.closed:
            await self._close(1011 if self.failure is not None else 1000, "")
        ws = self.ws
        if ws is None or self.conn.closed or ws.state is not WsState.LOCAL_CLOSING:
            return
        with anyio.move_on_after(LINGER_S):
            drained = 0
            while ws.state is WsState.LOCAL_CLOSING and drained < LINGER_BYTES:
                data = await self.conn.recv()
                if not data:
                    return
                drained += len(data)
                ws.receive_data(data)
                for _ in ws.events():
                    pass


class _Connection:
    """One client socket: request cycles until the client or a deadline ends it."""

    def __init__(self, server: HttpServer, stream: anyio.abc.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.scope = anyio.CancelScope()
        self.head_scope: anyio.CancelScope | None = None
        self.shielded: set[anyio.CancelScope] = set()
        self.exchange: _Exchange | _WsExchange | None = None
        self.aborted: AbortKind | None = None
        self.closed = False
        self.eof = False
        self.keep_alive = True
        self.client = _address(stream, anyio.abc.SocketAttribute.remote_address)
        self.local = _address(stream, anyio.abc.SocketAttribute.local_address)

    # ------------------------------------------------------------------ I/O
    async def recv(self) -> bytes:
        """Bytes from the client; ``b""`` once it has closed (or the socket is gone)."""
        if self.closed or self.eof:
            return b""
        try:
            data = await self.stream.receive(MAX_RECV)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            data = b""
        if not data:
            self.eof = True
        return data

    async def write(self, data: bytes) -> bool:
        """Send ``data`` slice by slice, each within the write deadline.

        False if the connection ended.
        """
        view = memoryview(data)
        for start in range(0, len(view), WRITE_SLICE):
            if self.closed:
                return False
            with anyio.move_on_after(self.server.deadlines.write_s) as timer:
                try:
                    await self.stream.send(bytes(view[start : start + WRITE_SLICE]))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    self.closed = True
                    self.keep_alive = False
                    if self.exchange is not None:
                        self.exchange.disconnect()
                    return False
            if timer.cancelled_caught:
                await self.abort(AbortKind.WRITE)
                return False
        return True

    async def write_whole(self, data: bytes) -> bool:
        """:meth:`write`, shielded from the caller's cancellation, so that a WebSocket frame is
        never cut in half; still bounded by the write deadline, and cancelled by an abort from
        outside (:meth:`cancel`), which ends the connection anyway."""
        with anyio.CancelScope(shield=True) as scope:
            self.shielded.add(scope)
            try:
                return await self.write(data)
            finally:
                self.shielded.discard(scope)
        return False  # cancelled by an abort: the connection is gone

    def mark_aborted(self, kind: AbortKind) -> None:
        """Count the abort (once) and tell the running handler the client is gone."""
        if self.aborted is None:
            self.aborted = kind
            self.server.count_abort(kind)
        self.keep_alive = False
        if self.exchange is not None:
            self.exchange.disconnect()

    async def abort(self, kind: AbortKind) -> None:
        """Abort from inside the connection: count it and reset the socket now."""
        self.mark_aborted(kind)
        await self._reset()

    def cancel(self, kind: AbortKind) -> None:
        """Abort from outside (the shutdown deadline).

        Count it and cancel everything the connection runs.
        """
        self.mark_aborted(kind)
        self.scope.cancel()
        for scope in list(self.shielded):
            scope.cancel()

    def on_shutdown(self) -> None:
        """Shutdown began: a connection waiting for a request head closes now."""
        if self.head_scope is not None:
            self.head_scope.cancel()

    async def _reset(self) -> None:
        if self.closed:
            return
        self.closed = True
        raw = self.stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()

    async def _close(self) -> None:
        """End of the connection: reset if aborted, else close.

        Closing drains unread request bytes first.
        """
        if self.aborted is not None:
            await self._reset()
            return
        if self.closed:
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            if not self.eof and self.h11.their_state in (h11.SEND_BODY, h11.ERROR):
                try:
                    await self.stream.send_eof()
                    drained = 0
                    with anyio.move_on_after(LINGER_S):
                        while drained < LINGER_BYTES:
                            drained += len(await self.stream.receive(MAX_RECV))
                except (
                    anyio.EndOfStream,
                    anyio.BrokenResourceError,
                    anyio.ClosedResourceError,
                    OSError,
                ):
                    pass
            await self.stream.aclose()

    # --------------------------------------------------------------- cycles
    async def run(self) -> None:
        try:
            with self.scope:
                while True:
                    request = await self._read_head()
                    if request is None:
                        break
                    if wants_websocket(request):  # the connection is the socket's from now on
                        await self._websocket(request)
                        break
                    await self._exchange(request)
                    if not self._next_cycle():
                        break
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _read_head(self) -> h11.Request | None:
        """The next request head, or None.

        None: client gone, head deadline, shutdown, or a protocol error.
        """
        if self.server.closing:
            return None
        got_bytes = False
        with anyio.CancelScope(
            deadline=anyio.current_time() + self.server.deadlines.header_s
        ) as scope:
            self.head_scope = scope
            try:
                while True:
                    try:
                        event = self.h11.next_event()
                    except h11.RemoteProtocolError as exc:
                        await self._protocol_error(exc)
                        return None
                    if isinstance(event, h11.Request):
                        if framed_twice(event):
                            self.keep_alive = False
                            await self.send_error(400, FRAMED_TWICE, "invalid_request_error")
                            return None
                        return event
                    if event is not h11.NEED_DATA:  # the client closed between requests
                        return None
                    data = await self.recv()
                    got_bytes = got_bytes or bool(data)
                    self.h11.receive_data(data)
            finally:
                self.head_scope = None
        if got_bytes:  # stalled part-way through a head: the deadline, or shutdown
            self.mark_aborted(AbortKind.SHUTDOWN if self.server.closing else AbortKind.HEADER)
        return None

    async def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        self.keep_alive = False
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self.send_error(exc.error_status_hint, _malformed(exc), "invalid_request_error")

    async def send_error(
        self,
        status: int,
        message: str,
        error_type: str,
        *,
        head_only: bool = False,
        request_id: str | None = None,
        extra: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """A complete error response in the API's JSON shape (the connection closes after it)."""
        headers, body = json_error(status, message, error_type, request_id)
        headers += extra
        try:
            out = (
                self.h11.send(
                    h11.Response(
                        status_code=status,
                        headers=headers + self.server.standard_headers(),
                        reason=_reason(status),
                    )
                )
                or b""
            )
            if not head_only:
                out += self.h11.send(h11.Data(data=body)) or b""
            out += self.h11.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return
        await self.write(out)

    async def _exchange(self, request: h11.Request) -> None:
        scope = self.server.scope_for(request, self.client, self.local)
        async with anyio.create_task_group() as tg:
            exchange = _Exchange(self, request, tg)
            self.exchange = exchange
            exchange.prefetch()
            try:
                await self.server.app(scope, exchange.receive, exchange.send)
            except Exception as exc:  # a handler failure: answered below if nothing was sent
                exchange.failure = exc
            tg.cancel_scope.cancel()  # the disconnect watcher
        self.exchange = None
        await self._finish(exchange, scope)

    async def _websocket(self, request: h11.Request) -> None:
        """A WebSocket handshake: checked here (a JSON 4xx if malformed), then the app's."""
        self.keep_alive = False
        try:
            event = self.h11.next_event()
        except h11.RemoteProtocolError as exc:
            await self._protocol_error(exc)
            return
        if request.method != b"GET" or request.http_version != b"1.1":
            await self.send_error(
                400, "a WebSocket handshake is an HTTP/1.1 GET", "invalid_request_error"
            )
            return
        if not isinstance(event, h11.EndOfMessage):
            await self.send_error(
                400, "a WebSocket handshake carries no body", "invalid_request_error"
            )
            return
        handshake = H11Handshake(ConnectionType.SERVER)
        try:
            handshake.initiate_upgrade_connection(list(request.headers), request.target)
            asked = next(e for e in handshake.events() if isinstance(e, ws_events.Request))
        except WsRemoteProtocolError as exc:
            hint = exc.event_hint
            status = hint.status_code if isinstance(hint, ws_events.RejectConnection) else 400
            extra = [(b"sec-websocket-version", b"13")] if status == 426 else []
            # wsproto names a version other than 13 as a missing header: say what it is
            problem = "only Sec-WebSocket-Version 13 is spoken" if status == 426 else str(exc)
            await self.send_error(
                status,
                f"malformed WebSocket handshake: {problem}",
                "invalid_request_error",
                extra=extra,
            )
            return
        except Exception as exc:  # anything else wsproto cannot take (a target h11 let through)
            await self.send_error(
                400, f"malformed WebSocket handshake: {type(exc).__name__}", "invalid_request_error"
            )
            return
        scope = self.server.websocket_scope(request, asked.subprotocols, self.client, self.local)
        exchange = _WsExchange(self, handshake)
        self.exchange = exchange
        try:
            await self.server.app(scope, exchange.receive, exchange.send)
        except Exception as exc:
            exchange.failure = exc
        finally:
            self.exchange = None
        failure = exchange.failure
        request_id = scope.get("state", {}).get("request_id")
        if failure is not None and not isinstance(failure, WebSocketClosed):
            where = f"WebSocket {scope['path']} (request id {request_id})"
            if exchange.accepted or exchange.responded:
                _log(f"{where} ended with {type(failure).__name__}: {str(failure)[:200]}")
            else:
                _log(f"{where} failed without a response:")
                traceback.print_exception(failure, file=sys.stderr)
        if self.closed:
            return
        if not exchange.accepted and not exchange.responded:
            what = "internal error" if failure else "the handler sent no response"
            await self.send_error(
                500,
                f"{what} (details are in the server log)",
                "server_error",
                request_id=request_id,
            )
        elif exchange.responded and not exchange.response_done:
            await self._reset()  # a response the app began and never ended: cut it
        else:
            await exchange.finish()

    async def _finish(self, exchange: _Exchange, scope: Mapping[str, Any]) -> None:
        if exchange.protocol_error is not None and not self.closed:
            self.keep_alive = False
            if self.h11.our_state is h11.SEND_RESPONSE:
                await self.send_error(
                    400,
                    _malformed(exchange.protocol_error),
                    "invalid_request_error",
                )
            return
        failure = exchange.failure
        request_id = scope.get("state", {}).get("request_id")  # the app's id for the request
        if failure is not None and not self.closed and not exchange.disconnected.is_set():
            where = f"{scope['method']} {scope['path']} (request id {request_id})"
            if exchange.started:  # the application answered it (and logged it) already
                _log(f"{where} ended with {type(failure).__name__}: {str(failure)[:200]}")
            else:
                _log(f"{where} failed without a response:")
                traceback.print_exception(failure, file=sys.stderr)
        if self.closed or exchange.done:
            return
        self.keep_alive = False
        if not exchange.started and self.h11.our_state is h11.SEND_RESPONSE:
            what = "internal error" if exchange.failure else "the handler sent no response"
            message = f"{what} (details are in the server log)"
            await self.send_error(
                500,
                message,
                "server_error",
                head_only=exchange.method == b"HEAD",
                request_id=request_id,
            )

    def _next_cycle(self) -> bool:
        """Ready for another request on this connection (keep-alive), or False to close it."""
        if self.closed or not self.keep_alive or self.server.closing:
            return False
        # a body the handler left unread: skip it if it is all here already
        while self.h11.their_state is h11.SEND_BODY:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:
                return False
            if event is h11.NEED_DATA:
                return False
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


def _address(stream: anyio.abc.SocketStream, attribute: Any) -> tuple[str, int] | None:
    value = stream.extra(attribute, None)
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


class HttpServer:
    """Serve an ASGI app on listeners until :meth:`shutdown`.

    ``on_abort`` is called once per aborted connection with the deadline that
    ran out; ``send_buffer_bytes`` (0: the kernel's autotuning) bounds how much
    of a response the kernel holds for a client, and so how soon a client that
    stopped reading meets the write deadline. ``max_connections`` (0: no limit)
    bounds the connections served at once: one more is answered 503 with the JSON
    error shape and closed at once, without reading its request, so the memory
    held for request bodies stays below ``max_connections`` times the body limit.
    ``ws_max_message_bytes`` (0: no limit) bounds a WebSocket message from a client.
    """

    def __init__(
        self,
        app: ASGIApp,
        deadlines: Deadlines | None = None,
        *,
        on_abort: Callable[[AbortKind], None] | None = None,
        send_buffer_bytes: int = 0,
        max_connections: int = 0,
        state: Mapping[str, Any] | None = None,
        ws_max_message_bytes: int = WS_MAX_MESSAGE_BYTES,
    ) -> None:
        self.app = app
        self.ws_max_message_bytes = ws_max_message_bytes
        self.shutting_down = anyio.Event()
        self.max_connections = max_connections
        self.refused = 0
        self.deadlines = deadlines or Deadlines()
        self.on_abort = on_abort
        self.send_buffer_bytes = send_buffer_bytes
        self.state: dict[str, Any] = dict(state or {})
        self.connections: set[_Connection] = set()
        self.closing = False
        self.aborts: dict[AbortKind, int] = dict.fromkeys(AbortKind, 0)
        self._accepting = anyio.CancelScope()
        self._drain: anyio.CancelScope | None = None
        self._forced = False
        self._all_closed = anyio.Event()
        self._stopped = anyio.Event()
        self._reported = anyio.Event()
        self._report: ShutdownReport | None = None

    # --------------------------------------------------------------- helpers
    def count_abort(self, kind: AbortKind) -> None:
        self.aborts[kind] += 1
        if self.on_abort is not None:
            self.on_abort(kind)

    @staticmethod
    def standard_headers() -> list[tuple[bytes, bytes]]:
        return [(b"date", formatdate(usegmt=True).encode()), (b"server", b"voxpool")]

    def scope_for(
        self, request: h11.Request, client: tuple[str, int] | None, local: tuple[str, int] | None
    ) -> dict[str, Any]:
        """The ASGI HTTP scope of one request."""
        target = bytes(request.target)
        # absolute-form (a proxy-style request line)
        if not target.startswith(b"/") and target != b"*":
            parts = urlsplit(target.decode("latin-1"))
            target = (parts.path or "/").encode("latin-1") + (
                b"?" + parts.query.encode("latin-1") if parts.query else b""
            )
        raw_path, _, query = target.partition(b"?")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": request.method.decode("ascii").upper(),
            "scheme": "http",
            "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": [(name, value) for name, value in request.headers],
            "client": client,
            "server": local,
            "state": dict(self.state),
            "extensions": {},
        }

    def websocket_scope(
        self,
        request: h11.Request,
        subprotocols: Sequence[str],
        client: tuple[str, int] | None,
        local: tuple[str, int] | None,
    ) -> dict[str, Any]:
        """The ASGI WebSocket scope of one handshake (see the module docstring)."""
        scope = self.scope_for(request, client, local)
        del scope["method"]
        scope.update(
            {
                "type": "websocket",
                "asgi": {"version": "3.0", "spec_version": "2.4"},
                "scheme": "ws",
                "subprotocols": list(subprotocols),
                "extensions": {
                    "websocket.http.response": {},
                    "voxpool.shutdown": {"event": self.shutting_down},
                },
            }
        )
        return scope

    # ---------------------------------------------------------------- serving
    async def serve(self, listeners: Sequence[anyio.abc.SocketListener]) -> None:
        """Accept connections until :meth:`shutdown`; return once every connection has ended."""
        try:
            async with anyio.create_task_group() as connections:
                with self._accepting:
                    async with anyio.create_task_group() as accepting:
                        for listener in listeners:
                            accepting.start_soon(self._accept, listener, connections)
                with anyio.CancelScope(shield=True):
                    for listener in listeners:
                        await listener.aclose()
        finally:
            self._stopped.set()

    async def _accept(
        self, listener: anyio.abc.SocketListener, connections: anyio.abc.TaskGroup
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except anyio.ClosedResourceError:
                return
            except (anyio.BrokenResourceError, OSError) as exc:  # out of descriptors, a reset
                _log(f"accept failed: {exc}")
                await anyio.sleep(0.1)
                continue
            if self.send_buffer_bytes:
                raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                with contextlib.suppress(OSError):
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            if self.max_connections and len(self.connections) >= self.max_connections:
                self.refused += 1
                connections.start_soon(self._refuse, stream)
                continue
            connections.start_soon(self._handle, stream)

    async def _refuse(self, stream: anyio.abc.SocketStream) -> None:
        """Over ``max_connections``: a 503 in the JSON error shape, then close (the request
        is never read; the write is bounded by the write deadline)."""
        headers, body = json_error(
            503,
            f"the server is at its limit of {self.max_connections} connections; retry later",
            "server_busy",
        )
        headers += [(b"retry-after", b"1"), *self.standard_headers()]
        head = b"HTTP/1.1 503 Service Unavailable\r\n"
        head += b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers) + b"\r\n"
        with anyio.move_on_after(self.deadlines.write_s), contextlib.suppress(Exception):
            await stream.send(head + body)
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await stream.aclose()

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        conn = _Connection(self, stream)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            if self.closing and not self.connections:
                self._all_closed.set()

    def force(self) -> None:
        """End the drain now (a second signal): what is still open is aborted at once."""
        self._forced = True
        if self._drain is not None:
            self._drain.cancel()

    async def shutdown(self) -> ShutdownReport:
        """Stop accepting, let in-flight exchanges finish within ``shutdown_s``, abort the rest.

        Returns once every connection has ended (handlers cancelled at the
        deadline unwind first: a model call in progress finishes, a stream
        stops at its next chunk). A second call waits for the first one's end.
        """
        if self.closing:
            await self._all_closed.wait()
            await self._reported.wait()
            assert self._report is not None
            return self._report
        t0 = time.monotonic()
        self.closing = True
        self.shutting_down.set()
        self._accepting.cancel()
        open_at_start = len(self.connections)
        for conn in list(self.connections):
            conn.on_shutdown()
        if not self.connections:
            self._all_closed.set()
        with anyio.move_on_after(self.deadlines.shutdown_s) as drain:
            self._drain = drain
            if self._forced:
                drain.cancel()
            await self._all_closed.wait()
        late = list(self.connections)
        for conn in late:
            conn.cancel(AbortKind.SHUTDOWN)
        await self._all_closed.wait()
        self._report = ShutdownReport(
            drained=open_at_start - len(late), aborted=len(late), seconds=time.monotonic() - t0
        )
        self._reported.set()
        return self._report

    async def stopped(self) -> None:
        """Wait until :meth:`serve` has returned."""
        await self._stopped.wait()


async def bind(host: str, port: int) -> list[anyio.abc.SocketListener]:
    """Listening sockets on ``host:port`` (one per address family the host resolves to)."""
    multi = await anyio.create_tcp_listener(local_host=host, local_port=port)
    return [
        listener for listener in multi.listeners if isinstance(listener, anyio.abc.SocketListener)
    ]
