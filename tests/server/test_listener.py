"""The HTTP/1.1 listener in-process, with a fake ASGI app and raw client sockets.

Every client I/O is bounded: a client that stops reading is aborted after the
write deadline and its stream is cancelled; a half-sent body or head is
aborted after its deadline; shutdown drains what is running and aborts what
is stalled after the shutdown deadline; malformed requests get JSON errors.
Waits are on observable state (events set by the app, sockets closing); time
limits are hang guards, and the only timing assertions are lower bounds that
hold by construction (a deadline cannot fire before it is due).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from server.http.listener import AbortKind, Deadlines, HttpServer, bind
from tests.server.live import closed_by_server

T = TypeVar("T")
GUARD_S = 30.0
SEND_BUFFER = 16384  # bytes: a small kernel buffer, so a stalled reader blocks writes soon
"""Hang guard for any single wait in these tests."""
CHUNK = b"x" * 65536


class FakeApp:
    """``/stream``: endless 64 KiB chunks, counted as an active "lease" while it runs;
    ``/echo``: the body's length; ``/slow``: answers when ``go`` is set; anything else:
    ``hello``."""

    def __init__(self) -> None:
        self.active = 0
        self.stream_started = anyio.Event()
        self.stream_ended = anyio.Event()
        self.slow_started = anyio.Event()
        self.go = anyio.Event()
        self.chunks_sent = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        path = scope["path"]
        if path == "/stream":
            self.active += 1
            self.stream_started.set()
            try:
                await StreamingResponse(self.chunks(), media_type="application/octet-stream")(
                    scope, receive, send
                )
            finally:
                self.active -= 1
                self.stream_ended.set()
        elif path == "/echo":
            body = await Request(scope, receive).body()
            await JSONResponse({"length": len(body)})(scope, receive, send)
        elif path == "/slow":
            self.slow_started.set()
            await self.go.wait()
            await PlainTextResponse("done")(scope, receive, send)
        elif path == "/boom":
            raise RuntimeError("boom")
        else:
            await PlainTextResponse("hello")(scope, receive, send)

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            yield CHUNK
            self.chunks_sent += 1


@asynccontextmanager
async def serving(
    app: Any, deadlines: Deadlines, **options: Any
) -> AsyncIterator[tuple[HttpServer, int]]:
    """``app`` behind our listener on a free loopback port (HttpServer ``options``; the
    tests here a 16 KiB send buffer), shut down after."""
    server = HttpServer(app, deadlines, **options)
    listeners = await bind("127.0.0.1", 0)
    port = int(listeners[0].extra(anyio.abc.SocketAttribute.local_port))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, listeners)
        try:
            yield server, port
        finally:
            with anyio.fail_after(GUARD_S):
                await server.shutdown()


async def blocking(fn: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(fn)


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(GUARD_S)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (b"" on a reset after nothing)."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def roundtrip(port: int, data: bytes) -> bytes:
    with connect(port) as s:
        s.sendall(data)
        return read_all(s)


def json_body(response: bytes) -> Any:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return json.loads(body)


def get(path: str, extra: bytes = b"") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + extra + b"\r\n"


@pytest.fixture(params=["trio", "asyncio"])
def backend(request: pytest.FixtureRequest) -> str:
    """``voxpool serve`` runs on trio; the listener is plain anyio and holds on asyncio too."""
    return str(request.param)


def run(test: Callable[[], Any], backend: str) -> None:
    anyio.run(test, backend=backend)


def test_a_client_that_stops_reading_is_aborted_after_the_write_deadline(backend: str) -> None:
    async def main() -> None:
        app = FakeApp()
        aborts: list[AbortKind] = []
        deadlines = Deadlines(write_s=0.5, shutdown_s=5)
        async with serving(app, deadlines, send_buffer_bytes=SEND_BUFFER) as (server, port):
            server.on_abort = aborts.append
            s = await blocking(lambda: connect(port, rcvbuf=4096))
            asked = time.monotonic()  # no write can start before the request is sent
            await blocking(lambda: s.sendall(get("/stream")))
            assert (await blocking(lambda: s.recv(100))).startswith(b"HTTP/1.1 200 ")
            with anyio.fail_after(GUARD_S):
                await app.stream_ended.wait()  # the stream was cancelled: its "lease" is released
            assert time.monotonic() - asked >= deadlines.write_s
            assert app.active == 0 and aborts == [AbortKind.WRITE]
            assert server.aborts[AbortKind.WRITE] == 1
            assert await blocking(lambda: closed_by_server(s)) == "reset"
            s.close()
            # the server is fine for everyone else
            assert (
                await blocking(lambda: roundtrip(port, get("/", b"Connection: close\r\n")))
            ).endswith(b"hello")

    run(main, backend)


def test_a_half_sent_body_is_aborted_after_the_body_deadline(backend: str) -> None:
    async def main() -> None:
        app = FakeApp()
        deadlines = Deadlines(body_s=1.5)
        async with serving(app, deadlines, send_buffer_bytes=SEND_BUFFER) as (server, port):
            with await blocking(lambda: connect(port)) as s:
                head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n"
                sent = time.monotonic()  # the server's last read cannot start before this
                await blocking(lambda: s.sendall(head + b"x" * 10))
                assert await blocking(lambda: closed_by_server(s)) in ("reset", "eof")
                assert time.monotonic() - sent >= deadlines.body_s
            assert server.aborts[AbortKind.BODY] == 1
            # a body that keeps coming is not cut off: each read only has to make progress
            with await blocking(lambda: connect(port)) as s:
                head = (
                    b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
                    b"Connection: close\r\n\r\n"
                )
                await blocking(lambda: s.sendall(head))
                for byte in (b"a", b"b", b"c"):
                    # pauses of 0.6 s: 1.8 s in all, longer than the deadline, but each read
                    # progresses
                    await anyio.sleep(0.6)
                    await blocking(lambda b=byte: s.sendall(b))  # type: ignore[misc]
                assert json_body(await blocking(lambda: read_all(s))) == {"length": 3}

    run(main, backend)


def test_a_partial_head_is_aborted_at_the_header_deadline_an_idle_one_closed(backend: str) -> None:
    async def main() -> None:
        app = FakeApp()
        async with serving(app, Deadlines(header_s=0.5), send_buffer_bytes=SEND_BUFFER) as (
            server,
            port,
        ):
            with (
                await blocking(lambda: connect(port)) as partial,
                await blocking(lambda: connect(port)) as idle,
            ):
                await blocking(lambda: partial.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n"))
                assert await blocking(lambda: closed_by_server(partial)) == "reset"
                assert await blocking(lambda: closed_by_server(idle)) == "eof"
            assert server.aborts[AbortKind.HEADER] == 1

    run(main, backend)


@pytest.mark.parametrize(
    ("request_bytes", "status", "contains"),
    [
        (b"GARBAGE\r\n\r\n", 400, "illegal request line"),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "Host"),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"a" * 20000, 431, "too long"),
        (
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
            "malformed HTTP request",
        ),
    ],
)
def test_protocol_errors_are_answered_with_the_json_error_shape(
    request_bytes: bytes, status: int, contains: str, backend: str
) -> None:
    async def main() -> None:
        async with serving(FakeApp(), Deadlines(), send_buffer_bytes=SEND_BUFFER) as (_, port):
            response = await blocking(lambda: roundtrip(port, request_bytes))
            assert response.startswith(f"HTTP/1.1 {status} ".encode()), response[:200]
            assert b"connection: close" in response.lower()
            error = json_body(response)["error"]
            assert error["type"] == "invalid_request_error" and contains in error["message"], error

    run(main, backend)


@pytest.mark.parametrize("order", ["length first", "encoding first"])
def test_a_body_framed_both_ways_is_refused_and_the_connection_closed(
    order: str, backend: str
) -> None:
    """Content-Length and Transfer-Encoding together (the request-smuggling shape: a proxy
    that trusts the length sees a second request where this server would see a body): a
    400 naming both, the connection closed, the request pipelined behind it not answered."""
    framing = [b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n"]
    if order == "encoding first":
        framing.reverse()
    smuggled = b"POST /echo HTTP/1.1\r\nHost: t\r\n" + b"".join(framing) + b"\r\n"
    smuggled += b"0\r\n\r\n" + get("/")

    async def main() -> None:
        async with serving(FakeApp(), Deadlines(), send_buffer_bytes=SEND_BUFFER) as (_, port):
            response = await blocking(lambda: roundtrip(port, smuggled))
            assert response.startswith(b"HTTP/1.1 400 "), response[:200]
            assert response.count(b"HTTP/1.1 ") == 1 and b"connection: close" in response.lower()
            message = json_body(response)["error"]["message"]
            assert "both Content-Length and Transfer-Encoding" in message, message

    run(main, backend)


def test_keep_alive_pipelining_head_continue_and_chunked_bodies(backend: str) -> None:
    async def main() -> None:
        async with serving(FakeApp(), Deadlines(), send_buffer_bytes=SEND_BUFFER) as (_, port):
            two = get("/") + get("/", b"Connection: close\r\n")
            response = await blocking(lambda: roundtrip(port, two))
            assert response.count(b"HTTP/1.1 200 OK") == 2 and response.endswith(b"hello")
            head = await blocking(
                lambda: roundtrip(port, b"HEAD / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            )
            assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")

            def expect_continue() -> bytes:
                with connect(port) as s:
                    s.sendall(
                        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
                        b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
                    )
                    interim = s.recv(100)
                    s.sendall(b"abcd")
                    return interim + read_all(s)

            response = await blocking(expect_continue)
            assert response.startswith(b"HTTP/1.1 100 ")
            assert json_body(response.split(b"\r\n\r\n", 1)[1]) == {"length": 4}
            chunked = (
                b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            )
            assert json_body(await blocking(lambda: roundtrip(port, chunked))) == {"length": 5}

    run(main, backend)


def test_a_failing_handler_gets_a_json_500(backend: str) -> None:
    async def main() -> None:
        async with serving(FakeApp(), Deadlines(), send_buffer_bytes=SEND_BUFFER) as (_, port):
            response = await blocking(lambda: roundtrip(port, get("/boom")))
            assert response.startswith(b"HTTP/1.1 500 ")
            assert json_body(response)["error"]["type"] == "server_error"
            assert b"boom" not in response  # internals stay in the log

    run(main, backend)


def test_shutdown_drains_running_work_and_refuses_new_connections(backend: str) -> None:
    async def main() -> None:
        app = FakeApp()
        async with serving(app, Deadlines(shutdown_s=GUARD_S), send_buffer_bytes=SEND_BUFFER) as (
            server,
            port,
        ):
            s = await blocking(lambda: connect(port))
            await blocking(lambda: s.sendall(get("/slow")))
            with anyio.fail_after(GUARD_S):
                await app.slow_started.wait()
            idle = await blocking(lambda: connect(port))
            with anyio.fail_after(GUARD_S):
                while len(server.connections) < 2:  # accepted, not just queued in the kernel
                    await anyio.sleep(0.01)
            async with anyio.create_task_group() as tg:
                reports = []

                async def stop() -> None:
                    reports.append(await server.shutdown())

                tg.start_soon(stop)
                assert (
                    await blocking(lambda: closed_by_server(idle)) == "eof"
                )  # idle: closed at once
                with pytest.raises(ConnectionRefusedError):
                    await blocking(lambda: connect(port))
                app.go.set()
                response = await blocking(lambda: read_all(s))
            assert response.startswith(b"HTTP/1.1 200 ") and response.endswith(b"done")
            assert b"connection: close" in response.lower()
            (report,) = reports
            assert report.aborted == 0 and report.drained == 2
            s.close()
            idle.close()

    run(main, backend)


def test_shutdown_aborts_a_client_that_stopped_reading_at_the_deadline(backend: str) -> None:
    async def main() -> None:
        app = FakeApp()
        deadlines = Deadlines(write_s=3600, shutdown_s=0.5)
        async with serving(app, deadlines, send_buffer_bytes=SEND_BUFFER) as (server, port):
            s = await blocking(lambda: connect(port, rcvbuf=4096))
            await blocking(lambda: s.sendall(get("/stream")))
            assert (await blocking(lambda: s.recv(100))).startswith(b"HTTP/1.1 200 ")
            # the stream never ends and the client never reads: it is open at the deadline
            with anyio.fail_after(GUARD_S):
                report = await server.shutdown()
            assert report.aborted == 1 and report.seconds >= deadlines.shutdown_s
            assert app.stream_ended.is_set() and app.active == 0
            assert server.aborts[AbortKind.SHUTDOWN] == 1 and server.aborts[AbortKind.WRITE] == 0
            assert await blocking(lambda: closed_by_server(s)) == "reset"
            s.close()

    run(main, backend)


def test_connections_over_the_limit_get_a_json_503_and_the_rest_are_served(backend: str) -> None:
    """max_connections=2: two idle connections fill it; a third is answered 503 (JSON, never
    read) and closed; once one of the two closes, a new connection is served again."""

    async def main() -> None:
        server = HttpServer(FakeApp(), Deadlines(), max_connections=2)
        listeners = await bind("127.0.0.1", 0)
        port = int(listeners[0].extra(anyio.abc.SocketAttribute.local_port))
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listeners)
            first, second = connect(port), connect(port)
            with anyio.fail_after(GUARD_S):
                while len(server.connections) < 2:
                    await anyio.sleep(0.01)
            refused = await blocking(lambda: roundtrip(port, get("/")))
            assert refused.startswith(b"HTTP/1.1 503 "), refused[:200]
            assert b"connection: close" in refused.lower() and b"retry-after: 1" in refused.lower()
            error = json_body(refused)["error"]
            assert error["type"] == "server_busy" and "limit of 2 connections" in error["message"]
            head = refused.partition(b"\r\n\r\n")[0].lower().split(b"\r\n")
            ids = [
                line[len(b"x-request-id: ") :] for line in head if line.startswith(b"x-request-id:")
            ]
            assert len(ids) == 1 and len(ids[0]) == 16, head  # like every response (docs/server.md)
            assert server.refused == 1
            first.close()
            with anyio.fail_after(GUARD_S):
                while len(server.connections) > 1:
                    await anyio.sleep(0.01)
            served = await blocking(lambda: roundtrip(port, get("/", b"Connection: close\r\n")))
            assert served.startswith(b"HTTP/1.1 200 ") and served.endswith(b"hello"), served[:200]
            second.close()
            with anyio.fail_after(GUARD_S):
                await server.shutdown()

    run(main, backend)
