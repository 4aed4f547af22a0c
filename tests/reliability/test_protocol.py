"""Protocol-level errors (issue #11 section 3): what the server answers to requests broken
below HTTP's application layer, sent as raw bytes. The transport (server/cmd_serve.py,
server/http/listener.py) is another change's; this test records what it does today
(docs/reliability.md, "Protocol-level errors") and holds the parts that must not regress:
a 4xx status where the server can still answer, never a 5xx, the JSON error shape on any
body, and a healthy server afterwards.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.reliability.cases import assert_healthy, error_of
from tests.server.live import HELLO_WAV, LiveServer

RAW = {
    "garbage-request-line": (b"GARBAGE\r\n\r\n", {400}),
    "content-length-letters": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        {400},
    ),
    "content-length-negative": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        {400},
    ),
    "content-length-twice": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        {400},
    ),
    "content-length-and-chunked": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        {400},
    ),
    "bad-chunk-size": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        {400},
    ),
    "missing-host": (b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", {400}),
    "header-with-space": (b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", {400}),
    "header-100k": (
        b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
        {400, 431},
    ),
    "body-shorter-than-declared": (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}",
        {400},
    ),
}


def exchange(port: int, data: bytes, half_close: bool) -> bytes:
    """Send ``data``, optionally half-close, and read until the server closes (or 10 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                return out
            if not chunk:
                return out
            out += chunk
            if b"\r\n\r\n" in out and _complete(out):
                return out


def _complete(raw: bytes) -> bool:
    head, _, body = raw.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


@pytest.mark.parametrize("name", sorted(RAW))
def test_protocol_error_gets_a_4xx(reliability_server: LiveServer, name: str) -> None:
    data, statuses = RAW[name]
    raw = exchange(reliability_server.port, data, half_close=name == "body-shorter-than-declared")
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    status = int(raw.split(b" ", 2)[1])
    assert status in statuses, raw[:300]
    head, _, body = raw.partition(b"\r\n\r\n")
    if body:
        assert b"content-type: application/json" in head.lower(), raw[:300]
        error_of(httpx.Response(status, headers={"content-type": "application/json"}, content=body))
        assert "request_id" not in json.loads(body)["error"]


def test_server_is_healthy_after_protocol_errors(
    reliability_server: LiveServer, rel: httpx.Client
) -> None:
    assert_healthy(reliability_server, rel, HELLO_WAV.read_bytes())
