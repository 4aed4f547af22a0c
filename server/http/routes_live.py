"""Live voice activity over a WebSocket: ``/v1/audio/vad/live`` (issue #14).

A client streams 16 kHz mono PCM (s16le) while it is captured; the server runs it
as a *live member* of a batching ``silero_vad`` model
(``Runtime.open_stream(model, request, feed=Feed())``: every open socket advances
in the model's shared batched steps) and sends back, as JSON text messages, each
chunk's speech probability and the speech start/end events as they are decided,
then a summary with the segments the offline route gives for the same audio.
The protocol, its limits and close codes are in docs/server.md ("Live voice
activity").

Shape of one socket: the handshake names the model (query string) or the first
message does (``{"type": "start", ...}``); admission happens before the upgrade
in the first case (a busy model is a 503 answer to the handshake), after it in
the second (close 1013). Then four tasks share the stream: the *reader* takes
the client's messages into the feed (bounded: it stops reading while more than
:data:`MAX_BACKLOG_S` of audio waits to be processed, so a fast client meets
TCP's flow control, not our memory), the *puller* reads the member's chunks,
the *sender* writes them out, batched per message, and a shutdown watcher. A
client that goes away, or sends something malformed, ends the stream at once
(the member is aborted and the slot freed when the stream's block exits); the
client's ``end``, the idle timeout, the duration limit and a server shutdown end
it gracefully: the audio already received is processed and summarized first.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import numpy as np
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from core.engine import Feed
from server.families.http import VAD_RANGES
from server.http.body import busy_timeout
from server.http.errors import ApiError, bad, error_response, internal_error, show
from server.http.listener import json_reason
from server.http.state import ServerState
from server.runtime.errors import BusyError, RuntimeErrorBase
from server.runtime.ports import ModelSpec

LIVE_PATH = "/v1/audio/vad/live"
SAMPLE_RATE = 16000
CHUNK = 512
"""Samples per probability (32 ms)."""
MAX_BACKLOG_S = 10.0
"""Audio received but not yet processed (or whose results are not yet sent), at most: beyond
it the server reads no more from the socket until the stream catches up."""
FIELDS = frozenset({"model", "busy_timeout_ms", *VAD_RANGES})
"""What the query string or the start message may name."""

# close codes (RFC 6455 section 7.4.1; 1009, a message too long, is the listener's)
NORMAL = 1000
GOING_AWAY = 1001  # the server is shutting down
UNSUPPORTED = 1003  # data of a kind the route cannot take: odd bytes, text that is not JSON
POLICY = 1008  # any other bad message or option, the idle timeout, the duration limit
INTERNAL = 1011  # the model failed
TRY_AGAIN = 1013  # busy


class Refusal(Exception):
    """How a socket ends: a close ``code`` with a JSON reason (``error_type``, ``message``).
    An error (``label`` empty) is also sent as an ``error`` message before the close; a
    graceful end (``label``: the summary's ``reason``) follows the summary."""

    def __init__(self, code: int, error_type: str, message: str, label: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.error_type = error_type
        self.message = message
        self.label = label


ENDED = Refusal(NORMAL, "", "", "end")
"""The client's ``end``: the summary, then a normal close."""


def state_of(websocket: WebSocket) -> ServerState:
    state: ServerState = websocket.app.state.vox
    return state


def check_origin(websocket: WebSocket, st: ServerState) -> None:
    """A browser page of another origin may not open the socket unless ``cors_origins`` is
    ``"*"`` (browsers apply no CORS to WebSockets: the server must). Clients that send no
    ``Origin`` (anything but a browser) are not concerned."""
    origin = websocket.headers.get("origin")
    if origin is None or st.config.cors_origins == "*":
        return
    host = websocket.headers.get("host", "")
    if urlsplit(origin).netloc.lower() != host.lower():
        raise ApiError(
            403,
            f"cross-origin WebSocket from {show(origin)} refused "
            "(set cors_origins to '*' to allow it)",
            "permission_error",
        )


def live_spec(st: ServerState, fields: Mapping[str, Any]) -> ModelSpec:
    """The model a live stream names: a VAD model with a batched engine (400/404 otherwise)."""
    unknown = sorted(k for k in fields if k not in FIELDS)
    if unknown:
        raise bad(
            f"unknown field {show(unknown[0])}; a live stream takes {', '.join(sorted(FIELDS))}"
        )
    spec = st.spec(fields.get("model"), "vad")
    if not spec.batching:
        raise bad(
            f"model '{spec.id}' runs no batched engine: live streams need a silero_vad model "
            'registered with "batching": true'
        )
    return spec


def live_request(st: ServerState, spec: ModelSpec, fields: Mapping[str, Any]) -> Any:
    """The stream's request: no audio yet, the options given (each in its range)."""
    adapter = st.adapter(spec)
    adapter.check_fields(fields)
    return adapter.request(fields, np.zeros(0, np.float32))


async def vad_live(websocket: WebSocket) -> None:
    """``/v1/audio/vad/live``: see the module docstring and docs/server.md."""
    st = state_of(websocket)
    check_origin(websocket, st)
    query = {k: v for k, v in websocket.query_params.items()}
    if query:  # the handshake configures the stream: its errors are HTTP answers
        spec = live_spec(st, query)
        websocket.state.model = spec.id
        request = live_request(st, spec, query)
        feed = Feed()
        await websocket.receive()  # websocket.connect
        stack, chunks, _ = await admitted(websocket, st, spec, request, busy_timeout(query), feed)
        if chunks is None:  # the client left while queued
            return
        async with stack:
            await websocket.accept()
            outcome = await Live(websocket, st, spec, request, feed).run(chunks)
        await finish(websocket, outcome)
        return
    await websocket.accept()
    try:
        spec, request, timeout = await start_message(websocket, st)
    except Refusal as refusal:
        await finish(websocket, refusal)
        return
    except WebSocketDisconnect:
        return
    websocket.state.model = spec.id
    feed = Feed()
    try:
        stack, chunks, early = await admitted(websocket, st, spec, request, timeout, feed)
        if chunks is None:  # the client left while queued
            return
        async with stack:
            outcome = await Live(websocket, st, spec, request, feed, early).run(chunks)
    except BusyError as exc:
        outcome = Refusal(TRY_AGAIN, exc.error_type, f"{exc.message}; retry later")
    except RuntimeErrorBase as exc:
        outcome = Refusal(POLICY if exc.status < 500 else INTERNAL, exc.error_type, exc.message)
    await finish(websocket, outcome)


async def admitted(
    websocket: WebSocket,
    st: ServerState,
    spec: ModelSpec,
    request: Any,
    timeout: int | None,
    feed: Feed,
) -> tuple[AsyncExitStack, AsyncIterator[Any] | None, list[Message]]:
    """Lease the stream (raises BusyError and the like: before the upgrade, the handshake's
    answer). Meanwhile the socket is read: a client that leaves while queued leaves the
    queue at once (chunks None); after the upgrade (a start message), what it sends while
    queued is kept for the stream to take first, up to ``max_audio_seconds`` of audio (the
    request's own bound; then reading waits), so a client that sent more than a running
    stream's :data:`MAX_BACKLOG_S` and left is still seen leaving."""
    stack = AsyncExitStack()
    gone = False
    refused: Exception | None = None  # raised outside the task group, which would wrap it
    chunks: AsyncIterator[Any] | None = None
    early: list[Message] = []
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            nonlocal gone
            size = 0  # before the accept the listener answers only when the client goes away
            most = max(MAX_BACKLOG_S, st.config.max_audio_seconds) * SAMPLE_RATE * 2
            while size <= most:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    gone = True
                    tg.cancel_scope.cancel()
                    return
                early.append(message)
                size += len(message.get("bytes") or message.get("text") or "")

        tg.start_soon(watch)
        try:
            chunks = await stack.enter_async_context(
                st.runtime.open_stream(spec.id, request, timeout, feed=feed)
            )
        except Exception as exc:  # busy, or the model cannot load: the handshake's answer
            refused = exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            raise
        tg.cancel_scope.cancel()
    if refused is not None:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        raise refused
    if gone:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        return stack, None, early
    return stack, chunks, early


async def start_message(websocket: WebSocket, st: ServerState) -> tuple[ModelSpec, Any, int | None]:
    """The first message when the query string names no model: ``{"type": "start",
    "model": ..., options}``, within the idle timeout (a shutdown meanwhile closes 1001)."""
    idle = st.config.body_read_timeout_s
    with anyio.move_on_after(idle):
        message = await until_shutdown(websocket, websocket.receive())
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(int(message.get("code", 1006)))
        text = message.get("text")
        if text is None:
            raise Refusal(
                POLICY,
                "invalid_request_error",
                'the first message must be {"type": "start", "model": ...} '
                "(or name the model in the query string)",
            )
        fields = parse_json(text)
        if fields.get("type") != "start":
            raise Refusal(
                POLICY, "invalid_request_error", "the first message's type must be 'start'"
            )
        fields = {k: v for k, v in fields.items() if k != "type"}
        try:
            spec = live_spec(st, fields)
            request = live_request(st, spec, fields)
            return spec, request, busy_timeout(fields)
        except ApiError as exc:
            raise Refusal(POLICY, exc.error_type, exc.message) from None
    raise Refusal(POLICY, "timeout", f"no start message within body_read_timeout_s={idle:g}")


async def until_shutdown(websocket: WebSocket, wait: Awaitable[Message]) -> Message:
    """``wait``'s message, unless the server starts shutting down first (Refusal 1001)."""
    shutdown = websocket.scope.get("extensions", {}).get("voxpool.shutdown")
    if not shutdown:
        return await wait
    got: list[Message] = []
    async with anyio.create_task_group() as tg:

        async def take() -> None:
            got.append(await wait)
            tg.cancel_scope.cancel()

        tg.start_soon(take)
        await shutdown["event"].wait()
        tg.cancel_scope.cancel()
    if got:
        return got[0]
    raise Refusal(GOING_AWAY, "server_shutdown", "the server is shutting down")


def parse_json(text: str) -> dict[str, Any]:
    """A text message: a JSON object (1003 if not JSON, 1008 if not an object)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise Refusal(
            UNSUPPORTED, "invalid_request_error", "text messages must be JSON objects"
        ) from None
    if not isinstance(value, dict):
        raise Refusal(POLICY, "invalid_request_error", "text messages must be JSON objects")
    return value


def unexpected(kind: Any) -> str:
    """What is wrong with a text message of ``type`` ``kind`` after the start (anything but
    ``end``), in the client's terms: a second start, no type at all (missing or JSON
    ``null``), or a type the route does not know."""
    if kind == "start":
        return "a second 'start'"
    if kind is None:
        return "a text message without a 'type'"
    return f"unknown message type {show(kind)}"


async def finish(websocket: WebSocket, outcome: Refusal | None) -> None:
    """Close the socket as ``outcome`` says (None: the client is gone, nothing to send)."""
    if outcome is None:
        return
    try:
        if not outcome.label:
            error = {"message": outcome.message, "type": outcome.error_type}
            await websocket.send_json({"type": "error", "error": error})
        reason = "" if outcome.code == NORMAL else json_reason(outcome.message, outcome.error_type)
        await websocket.close(outcome.code, reason)
    except (WebSocketDisconnect, OSError, RuntimeError):
        pass  # the client left meanwhile


class Live:
    """One accepted live stream: reader, puller, sender and shutdown watcher (module doc)."""

    def __init__(
        self,
        websocket: WebSocket,
        st: ServerState,
        spec: ModelSpec,
        request: Any,
        feed: Feed,
        early: list[Message] | None = None,
    ) -> None:
        self.websocket = websocket
        self.early = list(early or [])  # messages read while the stream was queued
        self.st = st
        self.spec = spec
        self.request = request
        self.feed = feed
        self.limit = int(st.config.max_audio_seconds * SAMPLE_RATE)
        self.idle_s = st.config.body_read_timeout_s
        self.received = 0  # samples pushed into the feed
        self.sent = 0  # chunks whose results were sent
        self.probabilities: list[float] = []
        self.progress = anyio.Event()
        self.ending: Refusal | None = None  # a graceful end: summary, then this close
        self.error: Refusal | None = None  # an error: no summary
        self.gone = False

    async def run(self, chunks: AsyncIterator[Any]) -> Refusal | None:
        """Serve the stream until it ends; the close to send (None: the client is gone)."""
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.reader, tg.cancel_scope)
                tg.start_soon(self.puller, chunks, send, tg.cancel_scope)
                tg.start_soon(self.watch_shutdown)
                try:
                    await self.sender(receive)
                except WebSocketDisconnect:  # a write failed: the client is gone
                    self.gone = True
                tg.cancel_scope.cancel()
        finally:
            self.feed.close()
        if self.gone:
            return None
        if self.error is not None:
            return self.error
        return self.ending or ENDED

    # ------------------------------------------------------------- reader
    def end(self, ending: Refusal) -> None:
        """A graceful end: no more audio; what was received is processed and summarized."""
        if self.ending is None:
            self.ending = ending
        self.feed.close()

    def fail(self, error: Refusal, scope: anyio.CancelScope) -> None:
        self.error = error
        scope.cancel()

    async def reader(self, scope: anyio.CancelScope) -> None:
        ws = self.websocket
        while True:
            got: Message | None = None
            if self.early:
                got = self.early.pop(0)
            elif self.feed.closed:
                got = await ws.receive()  # only a disconnect or a stray message now
            else:
                with anyio.move_on_after(self.idle_s):
                    got = await ws.receive()
            if got is None:
                idle = f"no audio for {self.idle_s:g} s (body_read_timeout_s)"
                self.end(Refusal(POLICY, "timeout", idle, "idle_timeout"))
                return
            message = got
            if message["type"] == "websocket.disconnect":
                self.gone = True
                scope.cancel()
                return
            data, text = message.get("bytes"), message.get("text")
            if self.feed.closed:
                if self.ending is not ENDED:
                    return  # the server ended the stream: nothing more is read
                self.fail(Refusal(POLICY, "invalid_request_error", "a message after 'end'"), scope)
                return
            if data is not None:
                if len(data) % 2:
                    self.fail(
                        Refusal(
                            UNSUPPORTED,
                            "invalid_request_error",
                            f"binary messages are 16-bit samples: {len(data)} bytes is odd",
                        ),
                        scope,
                    )
                    return
                self.push(data)
                await self.wait_backlog()
                continue
            try:
                fields = parse_json(text or "")
            except Refusal as refusal:
                self.fail(refusal, scope)
                return
            kind = fields.get("type")
            if kind == "end":
                self.end(ENDED)
            else:
                self.fail(
                    Refusal(
                        POLICY,
                        "invalid_request_error",
                        f"{unexpected(kind)}: after the start, send audio "
                        'as binary messages and {"type": "end"}',
                    ),
                    scope,
                )
                return

    def push(self, data: bytes) -> None:
        """Push s16le samples (as the WAV reader converts them), up to the duration limit."""
        room = self.limit - self.received
        samples = np.frombuffer(data, "<i2")[: max(0, room)]
        if len(samples):
            self.feed.push(samples.astype(np.float32) / 32768.0)
            self.received += len(samples)
        if len(data) // 2 > room:
            limit = self.st.config.max_audio_seconds
            self.end(
                Refusal(
                    POLICY,
                    "invalid_request_error",
                    f"the stream is longer than max_audio_seconds={limit:g}",
                    "max_audio_seconds",
                )
            )

    async def wait_backlog(self) -> None:
        """Read no more while more than :data:`MAX_BACKLOG_S` of audio awaits its results."""
        most = int(MAX_BACKLOG_S * SAMPLE_RATE / CHUNK)
        while self.received // CHUNK - self.sent > most:
            await self.progress.wait()

    async def watch_shutdown(self) -> None:
        shutdown = self.websocket.scope.get("extensions", {}).get("voxpool.shutdown")
        if not shutdown:
            return
        await shutdown["event"].wait()
        self.end(Refusal(GOING_AWAY, "server_shutdown", "the server is shutting down", "shutdown"))

    # ------------------------------------------------------ puller, sender
    async def puller(
        self,
        chunks: AsyncIterator[Any],
        send: MemoryObjectSendStream[Any],
        scope: anyio.CancelScope,
    ) -> None:
        async with send:
            try:
                async for chunk in chunks:
                    send.send_nowait(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                # the sender is gone (the client left, the stream was cancelled), yet a chunk
                # came: its wake-up preceded the cancellation, which anyio then delivers only
                # at the next checkpoint. Nobody is left to send it to: no failure.
                return
            except (ValueError, TypeError) as exc:  # the engine refused the member's audio
                self.fail(Refusal(POLICY, "invalid_request_error", str(exc)), scope)
            except Exception as exc:  # the model failed: logged, only its id goes out
                message, _ = internal_error(exc, "the stream failed")
                self.fail(Refusal(INTERNAL, "server_error", message), scope)

    async def sender(self, receive: MemoryObjectReceiveStream[Any]) -> None:
        async with receive:
            while True:
                try:
                    batch = [await receive.receive()]
                except anyio.EndOfStream:
                    break
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self.send_batch(batch)
        await self.websocket.send_json(self.summary())

    async def send_batch(self, batch: list[Any]) -> None:
        ws = self.websocket
        probs = [float(c.probability) for c in batch]
        self.probabilities.extend(probs)
        await ws.send_json(
            {
                "type": "vad.probabilities",
                "index": int(batch[0].index),
                "start_sample": int(batch[0].start),
                "probabilities": [round(p, 6) for p in probs],
            }
        )
        for chunk in batch:
            for event in chunk.events:
                await ws.send_json(
                    {
                        "type": f"vad.speech.{event.kind}",
                        "sample": int(event.sample),
                        "time": round(event.seconds, 4),
                    }
                )
        self.sent += len(batch)
        self.progress.set()
        self.progress = anyio.Event()

    def summary(self) -> dict[str, Any]:
        """The last message: what the offline route answers for the audio received (its
        segments from the same probabilities), how many chunks, and why the stream ended."""
        probs = np.asarray(self.probabilities, np.float32)
        adapter = self.st.adapter(self.spec)
        out: dict[str, Any] = {"type": "vad.done"}
        out.update(adapter.live_json(self.request, probs, self.received))
        out["chunks"] = len(self.probabilities)
        out["reason"] = (self.ending or ENDED).label
        return out


class WebSocketNotFound:
    """ASGI middleware: a WebSocket handshake on any path but the live route gets the API's
    404 (HTTP, before the upgrade) instead of Starlette's bare close."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and scope.get("path") != LIVE_PATH:
            response: Response = error_response(
                404,
                f"unknown WebSocket endpoint: {show(scope.get('path', ''))} "
                f"(the WebSocket route is {LIVE_PATH})",
                "not_found_error",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def upgrade_required(request: Any) -> Response:
    """A plain HTTP GET of the live route: 426, it takes a WebSocket."""
    return error_response(
        426,
        f"{LIVE_PATH} takes a WebSocket: send Upgrade: websocket (see docs/server.md)",
        "invalid_request_error",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )
