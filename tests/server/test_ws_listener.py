"""The listener's WebSockets in-process, with a fake ASGI app: no model, no Starlette routing.

The handshake is checked by the listener (a malformed one is a JSON 4xx before any
app runs), an accepted socket carries text and binary messages both ways
(fragmented ones assembled, pings answered), a message over the size limit and
a frame the protocol forbids are closed with their codes, an app may refuse the
upgrade with an HTTP answer, a client that stops reading is aborted at the write
deadline (the app's send fails), and shutdown is announced in the scope. The
client is the real ``websockets`` package (its sync client, in a worker thread)
or a raw socket where the test needs bytes no client would send. Waits are on
observable state; time limits are hang guards.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import numpy as np
import pytest
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from server.http.listener import AbortKind, Deadlines, HttpServer, bind
from tests.server.test_listener import GUARD_S, blocking, connect, json_body, read_all, serving

KEY = base64.b64encode(os.urandom(16)).decode()


class WsApp:
    """``/echo``: accepts and echoes every message until the client closes; ``/deny``: a 409
    JSON answer instead of the upgrade; ``/refuse``: closes before accepting; ``/boom``: raises
    before accepting; ``/flood``: accepts and sends 64 KiB messages until a send fails;
    ``/shutdown``: accepts, waits for the server's shutdown, closes 1001."""

    def __init__(self) -> None:
        self.disconnects: list[dict[str, Any]] = []
        self.flood_failed = anyio.Event()
        self.accepted = anyio.Event()
        self.scope: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "websocket"
        self.scope = dict(scope)
        assert (await receive())["type"] == "websocket.connect"
        path = scope["path"]
        if path == "/deny":
            await JSONResponse({"error": {"message": "no", "type": "conflict"}}, 409)(
                scope, receive, send
            )
        elif path == "/refuse":
            await send({"type": "websocket.close", "code": 1000})
        elif path == "/boom":
            raise RuntimeError("boom")
        elif path == "/echo":
            await send({"type": "websocket.accept", "headers": [(b"x-app", b"1")]})
            self.accepted.set()
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    self.disconnects.append(message)
                    return
                await send({**message, "type": "websocket.send"})
        elif path == "/flood":
            await send({"type": "websocket.accept"})
            self.accepted.set()
            try:
                while True:
                    await send({"type": "websocket.send", "bytes": b"x" * 65536})
            except OSError:
                self.flood_failed.set()
        elif path == "/shutdown":
            await send({"type": "websocket.accept"})
            self.accepted.set()
            await scope["extensions"]["voxpool.shutdown"]["event"].wait()
            await send({"type": "websocket.close", "code": 1001, "reason": "bye"})


def run(test: Callable[[], Any], backend: str) -> None:
    anyio.run(test, backend=backend)


@pytest.fixture(params=["trio", "asyncio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def handshake(path: str = "/echo", extra: bytes = b"", method: bytes = b"GET") -> bytes:
    return (
        method + b" " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n"
    )


def frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = True) -> bytes:
    """One client frame (masked, as a client must, unless told not to)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    bit = 0x80 if mask else 0
    if size < 126:
        head += bytes([bit | size])
    elif size < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", size)
    if not mask:
        return head + payload
    key = os.urandom(4)
    mask_bytes = np.frombuffer((key * (size // 4 + 1))[:size], np.uint8)
    return head + key + (np.frombuffer(payload, np.uint8) ^ mask_bytes).tobytes()


def read_frame(s: socket.socket) -> tuple[int, bytes]:
    """One server frame (unmasked): its opcode and payload."""

    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = s.recv(n - len(out))
            assert got, "the server closed mid-frame"
            out += got
        return out

    first, second = exactly(2)
    size = second & 0x7F
    if size == 126:
        size = struct.unpack("!H", exactly(2))[0]
    elif size == 127:
        size = struct.unpack("!Q", exactly(8))[0]
    return first & 0x0F, exactly(size)


def upgraded(s: socket.socket, request: bytes) -> bytes:
    """Send ``request``; the 101 head (everything up to the blank line)."""
    s.sendall(request)
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        got = s.recv(1)
        assert got, head
        head += got
    return head


def test_echo_text_binary_fragments_and_ping(backend: str) -> None:
    async def main() -> None:
        app = WsApp()
        async with serving(app, Deadlines()) as (_, port):

            def client() -> tuple[Any, ...]:
                with ws_connect(f"ws://127.0.0.1:{port}/echo?x=1", proxy=None) as ws:
                    ws.send("hello")
                    text = ws.recv(timeout=GUARD_S)
                    ws.send(b"\x00\x01" * 1000)
                    data = ws.recv(timeout=GUARD_S)
                    ws.send(["frag", "ment"])  # one message in two frames
                    fragmented = ws.recv(timeout=GUARD_S)
                    assert ws.ping().wait(GUARD_S)
                    headers = dict(ws.response.headers)
                return text, data, fragmented, headers

            text, data, fragmented, headers = await blocking(client)
            assert (text, data, fragmented) == ("hello", b"\x00\x01" * 1000, "fragment")
            assert headers["x-app"] == "1" and headers["server"] == "voxpool"
            with anyio.fail_after(GUARD_S):
                while not app.disconnects:
                    await anyio.sleep(0.01)
            assert app.disconnects[0]["code"] == 1000
            assert app.scope["scheme"] == "ws" and app.scope["query_string"] == b"x=1"
            assert "websocket.http.response" in app.scope["extensions"]

    run(main, backend)


@pytest.mark.parametrize(
    ("request_bytes", "status", "contains"),
    [
        (handshake(), 400, "Sec-WebSocket-Key"),
        (
            handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode()).replace(b": 13", b": 12"),
            426,
            "only Sec-WebSocket-Version 13",  # not wsproto's "Missing header"
        ),
        (
            handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode(), method=b"POST"),
            400,
            "GET",
        ),
        (
            handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\nContent-Length: 3\r\n".encode()) + b"abc",
            400,
            "no body",
        ),
        (
            handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode()).replace(
                b"Connection: Upgrade", b"Connection: keep-alive"
            ),
            400,
            "Connection: Upgrade",
        ),
    ],
)
def test_malformed_handshakes_get_json_4xx_before_any_app(
    request_bytes: bytes, status: int, contains: str, backend: str
) -> None:
    async def main() -> None:
        app = WsApp()
        async with serving(app, Deadlines()) as (_, port):
            with await blocking(lambda: connect(port)) as s:
                await blocking(lambda: s.sendall(request_bytes))
                response = await blocking(lambda: read_all(s))
            assert response.startswith(f"HTTP/1.1 {status} ".encode()), response[:300]
            error = json_body(response)["error"]
            assert error["type"] == "invalid_request_error", error
            assert contains in error["message"], error
            if status == 426:
                assert b"sec-websocket-version: 13" in response.lower()
            assert app.scope == {}, "the app ran for a malformed handshake"

    run(main, backend)


@pytest.mark.parametrize(
    ("path", "status", "error_type"),
    [("/deny", 409, "conflict"), ("/refuse", 403, "permission_error"), ("/boom", 500, None)],
)
def test_an_app_may_refuse_the_upgrade_with_an_http_answer(
    path: str, status: int, error_type: str | None, backend: str
) -> None:
    async def main() -> None:
        async with serving(WsApp(), Deadlines()) as (_, port):
            with await blocking(lambda: connect(port)) as s:
                request = handshake(path, f"Sec-WebSocket-Key: {KEY}\r\n".encode())
                await blocking(lambda: s.sendall(request))
                response = await blocking(lambda: read_all(s))
            assert response.startswith(f"HTTP/1.1 {status} ".encode()), response[:300]
            assert b"connection: close" in response.lower()
            error = json_body(response)["error"]
            assert error["type"] == (error_type or "server_error"), error

    run(main, backend)


def test_oversized_and_forbidden_frames_are_closed_with_their_codes(backend: str) -> None:
    async def main() -> None:
        app = WsApp()
        async with serving(app, Deadlines(), ws_max_message_bytes=1000) as (_, port):

            def too_big() -> tuple[int, str]:
                with ws_connect(f"ws://127.0.0.1:{port}/echo", max_size=None, proxy=None) as ws:
                    ws.send("ok")
                    assert ws.recv(timeout=GUARD_S) == "ok"
                    with pytest.raises(ConnectionClosed) as closed:
                        # Each fragment fits, the message does not. websockets ends
                        # an iterable with an empty final frame, so the server's
                        # close may already be in when that frame goes: send raises.
                        ws.send(["x" * 600, "y" * 600])
                        ws.recv(timeout=GUARD_S)
                rcvd = closed.value.rcvd
                assert rcvd is not None
                return rcvd.code, rcvd.reason

            code, reason = await blocking(too_big)
            assert code == 1009 and "1000 bytes" in reason

            def unmasked() -> tuple[int, bytes]:
                with connect(port) as s:
                    head = upgraded(s, handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode()))
                    assert head.startswith(b"HTTP/1.1 101 "), head
                    s.sendall(frame(0x1, b"hi", mask=False))
                    return read_frame(s)

            opcode, payload = await blocking(unmasked)
            assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1002, payload
            assert json.loads(payload[2:])["type"] == "invalid_request_error"

            def bad_utf8() -> tuple[int, bytes]:
                with connect(port) as s:
                    head = upgraded(s, handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode()))
                    assert head.startswith(b"HTTP/1.1 101 "), head
                    s.sendall(frame(0x1, b"\xff\xfe"))
                    return read_frame(s)

            opcode, payload = await blocking(bad_utf8)
            assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1007, payload
            with anyio.fail_after(GUARD_S):
                while len(app.disconnects) < 3:
                    await anyio.sleep(0.01)
            assert sorted(d["code"] for d in app.disconnects) == [1002, 1007, 1009]

    run(main, backend)


def test_frames_sent_with_the_handshake_are_kept(backend: str) -> None:
    async def main() -> None:
        async with serving(WsApp(), Deadlines()) as (_, port):

            def early() -> tuple[int, bytes]:
                with connect(port) as s:
                    request = handshake(extra=f"Sec-WebSocket-Key: {KEY}\r\n".encode())
                    head = upgraded(s, request + frame(0x2, b"early"))
                    assert head.startswith(b"HTTP/1.1 101 "), head
                    got = read_frame(s)
                    s.sendall(frame(0x8, struct.pack("!H", 1000)))
                    assert read_frame(s)[0] == 0x8  # the close echoed
                    return got

            assert await blocking(early) == (0x2, b"early")

    run(main, backend)


def test_a_client_that_stops_reading_is_aborted_at_the_write_deadline(backend: str) -> None:
    async def main() -> None:
        app = WsApp()
        deadlines = Deadlines(write_s=0.5)
        aborts: list[AbortKind] = []
        async with serving(app, deadlines, send_buffer_bytes=16384, on_abort=aborts.append) as (
            _,
            port,
        ):
            s = await blocking(lambda: connect(port, rcvbuf=4096))
            request = handshake("/flood", f"Sec-WebSocket-Key: {KEY}\r\n".encode())
            await blocking(lambda: s.sendall(request))
            with anyio.fail_after(GUARD_S):
                await app.flood_failed.wait()  # the app's send raised: the client is gone
            assert aborts == [AbortKind.WRITE]
            s.close()

    run(main, backend)


def test_shutdown_is_announced_to_open_sockets(backend: str) -> None:
    async def main() -> None:
        app = WsApp()
        box: dict[str, Any] = {}

        def client(port: int) -> None:
            with (
                ws_connect(f"ws://127.0.0.1:{port}/shutdown", proxy=None) as ws,
                pytest.raises(ConnectionClosed) as closed,
            ):
                ws.recv(timeout=GUARD_S)
            box["rcvd"] = closed.value.rcvd

        async with (
            anyio.create_task_group() as tg,
            serving(app, Deadlines(shutdown_s=GUARD_S)) as (server, port),
        ):
            tg.start_soon(blocking, lambda: client(port))
            with anyio.fail_after(GUARD_S):
                await app.accepted.wait()
            # leaving the block shuts the server down first: the app closes 1001
        rcvd = box["rcvd"]
        assert rcvd is not None and (rcvd.code, rcvd.reason) == (1001, "bye")
        assert server.aborts[AbortKind.SHUTDOWN] == 0

    run(main, backend)


def test_a_plain_request_with_an_upgrade_header_of_another_protocol_is_http() -> None:
    async def main() -> None:
        async def http_app(scope: Scope, receive: Receive, send: Send) -> None:
            assert scope["type"] == "http"
            await JSONResponse({"ok": True})(scope, receive, send)

        server = HttpServer(http_app, Deadlines())
        listeners = await bind("127.0.0.1", 0)
        port = int(listeners[0].extra(anyio.abc.SocketAttribute.local_port))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listeners)
            request = (
                b"GET / HTTP/1.1\r\nHost: t\r\nUpgrade: h2c\r\nConnection: Upgrade, close\r\n\r\n"
            )
            with await blocking(lambda: connect(port)) as s:
                await blocking(lambda: s.sendall(request))
                response = await blocking(lambda: read_all(s))
            assert json.loads(response.partition(b"\r\n\r\n")[2]) == {"ok": True}
            await server.shutdown()

    run(main, "trio")
