"""No connection holds a slot or the process forever (issue #11): a real server, raw sockets.

A client that stops reading a stream loses its slot after ``write_timeout_s``
and the slot is reused; a half-sent body or head is closed after its deadline;
SIGTERM with stalled clients exits 0 once ``shutdown_timeout_s`` has passed;
garbage gets the JSON error shape; a 503's ``Retry-After`` follows the hold
times the server observed. Waits are on ``/v1/models`` and socket state with
generous hang guards; the timing assertions are bounds that hold by
construction (a deadline cannot fire before it is due; an estimate lies
between what the client measured on either side of it).
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.live import LiveServer, assert_error, closed_by_server

GUARD_S = 120.0
"""Hang guard for any wait (model loads and syntheses on a busy 2-core machine)."""
WRITE_S = 3.0
BODY_S = 1.0
HEADER_S = 1.0
STALL_TEXT = " ".join(["Then another sentence follows, and it is quite a long one."] * 40)
"""Forty sentences: far more audio than the socket buffers hold, so a client that stops reading
stalls the stream."""
STREAMS: dict[str, dict[str, Any]] = {
    "sse": {"stream": True},
    "raw audio": {"stream": True, "stream_format": "audio", "response_format": "pcm"},
}


def write_config(tmp: Path, **overrides: Any) -> Path:
    config = {
        "write_timeout_s": WRITE_S,
        "body_read_timeout_s": BODY_S,
        "header_timeout_s": HEADER_S,
        "shutdown_timeout_s": 30,
        "send_buffer_bytes": 65536,
        "models": [
            {"id": "tts1", "family": "piper", "mode": "streaming", "slots": 1},
            {"id": "tts2", "family": "piper", "mode": "streaming", "slots": 1},
        ],
        **overrides,
    }
    path = tmp / "deadlines.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """tts1 and tts2 (piper, streaming, 1 slot each); write 3 s, body 1 s, header 1 s; 64 KiB
    send buffers."""
    live = LiveServer(write_config(tmp_path_factory.mktemp("deadlines")), server_logs).start()
    try:
        yield live
    finally:
        assert live.stop() == 0, live.log()[-4000:]


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(GUARD_S)
    s.connect(("127.0.0.1", port))
    return s


def post(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def stalled_stream(port: int, model: str, options: dict[str, Any]) -> socket.socket:
    """A streamed speech request whose client reads the response head, then nothing more."""
    s = connect(port, rcvbuf=4096)
    s.sendall(
        post(
            "/v1/audio/speech",
            json.dumps({"model": model, "input": STALL_TEXT, **options}).encode(),
        )
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1024)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 "), head
    return s


def aborted(server: LiveServer, kind: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    match = re.search(rf'^voxpool_connections_aborted_total{{kind="{kind}"}} (\S+)$', text, re.M)
    assert match, text[-2000:]
    return float(match.group(1))


def roundtrip(port: int, data: bytes) -> bytes:
    with connect(port) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("stream", list(STREAMS))
def test_a_stream_client_that_stops_reading_loses_its_slot_and_the_slot_is_reused(
    server: LiveServer, stream: str
) -> None:
    before = aborted(server, "write")
    asked = time.monotonic()  # the server cannot start a write before the request
    s = stalled_stream(server.port, "tts1", STREAMS[stream])
    try:
        assert server.model("tts1")["active_slots"] == 1
        server.wait_for("tts1", lambda r: r["active_slots"] == 0, timeout=GUARD_S)
        released = time.monotonic() - asked
        assert released >= WRITE_S
        assert aborted(server, "write") == before + 1
        assert closed_by_server(s) == "reset"  # aborted, not politely ended
    finally:
        s.close()
    # the slot is free for the next request at once
    r = httpx.post(
        server.url + "/v1/audio/speech",
        json={"model": "tts1", "input": "Hi.", "busy_timeout_ms": 2000},
        timeout=GUARD_S,
    )
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    print(f"{stream}: slot released {released:.2f} s after the request (write_timeout_s={WRITE_S})")


def test_a_half_sent_body_and_a_half_sent_head_are_closed_after_their_deadlines(
    server: LiveServer,
) -> None:
    body_before, header_before = aborted(server, "body"), aborted(server, "header")
    with connect(server.port) as body, connect(server.port) as head:
        t0 = time.monotonic()
        body.sendall(post("/v1/audio/speech", b'{"model": "tts1", "input": "Hello there."}')[:-10])
        head.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-")
        assert closed_by_server(body) == "reset"
        assert closed_by_server(head) == "reset"
        assert time.monotonic() - t0 >= min(BODY_S, HEADER_S)
    assert aborted(server, "body") == body_before + 1
    assert aborted(server, "header") == header_before + 1
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("request_bytes", "contains"),
    [
        (b"GARBAGE\r\n\r\n", "illegal request line"),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32) + b"\r\n\r\n",
            "malformed HTTP request",
        ),
        (
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
            "Content-Length",
        ),
        (
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: t\r\n"
            b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            "Content-Length",
        ),
        (b"GET /health HTTP/1.1\r\n\r\n", "Host"),
    ],
)
def test_protocol_errors_get_the_json_error_shape(
    server: LiveServer, request_bytes: bytes, contains: str
) -> None:
    response = roundtrip(server.port, request_bytes)
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert status == 400, response[:300]
    headers = [(k, v) for k, _, v in (line.partition(b": ") for line in head.split(b"\r\n")[1:])]
    r = httpx.Response(status, headers=headers, content=body)
    assert_error(r, 400, "invalid_request_error", contains)


def test_retry_after_on_a_503_reflects_observed_hold_times(server: LiveServer) -> None:
    """tts2 is held once by a stalled stream (a hold of at least the write deadline); while a
    second stalled stream holds it, a request that may wait 100 ms gets 503. The estimate is
    the observed hold minus what the second holder has already run, rounded up: it lies
    between ceil(WRITE_S - e_max) and ceil(h_max), both measured by this client."""
    server.wait_idle("tts2")
    asked = time.monotonic()
    first = stalled_stream(server.port, "tts2", STREAMS["sse"])
    try:
        server.wait_for("tts2", lambda r: r["active_slots"] == 0, timeout=GUARD_S)
        h_max = time.monotonic() - asked  # the first hold lasted at most this, and at least WRITE_S
    finally:
        first.close()
    second_asked = time.monotonic()
    second = stalled_stream(server.port, "tts2", STREAMS["sse"])
    try:
        r = httpx.post(
            server.url + "/v1/audio/speech",
            json={"model": "tts2", "input": "Hi.", "busy_timeout_ms": 100},
            timeout=GUARD_S,
        )
        e_max = time.monotonic() - second_asked  # the second holder had run at most this
        assert_error(r, 503, "server_busy")
        retry_after = int(r.headers["retry-after"])
        assert math.ceil(WRITE_S - e_max) <= retry_after <= math.ceil(h_max), (
            retry_after,
            e_max,
            h_max,
        )
        print(
            f"Retry-After {retry_after} s (first hold <= {h_max:.2f} s, "
            f"second holder at <= {e_max:.2f} s)"
        )
    finally:
        second.close()
    server.wait_for("tts2", lambda r: r["active_slots"] == 0, timeout=GUARD_S)


def test_sigterm_with_stalled_clients_exits_0_after_the_shutdown_deadline(
    server_logs: Path, tmp_path: Path
) -> None:
    """Deadlines far off except shutdown's (2 s): a non-reading stream client, a half-sent body
    and a half-sent head are all still there at SIGTERM; the process exits 0 once the
    shutdown deadline has passed (plus the teardown), counting them as shutdown aborts."""
    shutdown_s = 2.0
    config = write_config(
        tmp_path,
        write_timeout_s=600,
        body_read_timeout_s=600,
        header_timeout_s=600,
        shutdown_timeout_s=shutdown_s,
    )
    live = LiveServer(config, server_logs).start()
    try:
        stream = stalled_stream(live.port, "tts1", STREAMS["raw audio"])
        body = connect(live.port)
        body.sendall(post("/v1/audio/speech", b'{"model": "tts1", "input": "Hello there."}')[:-5])
        head = connect(live.port)
        head.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert (
            httpx.get(live.url + "/health", timeout=10).status_code == 200
        )  # all three accepted by now
        assert live.proc is not None
        live.signal()
        t0 = time.monotonic()
        code = live.proc.wait(GUARD_S)
        exited = time.monotonic() - t0
        assert code == 0, live.log()[-3000:]
        assert exited >= shutdown_s
        for s in (stream, body):
            assert closed_by_server(s) == "reset"
        assert closed_by_server(head) in ("reset", "eof")  # closed at once when shutdown starts
        log = live.log()
        assert "shutting down" in log
        match = re.search(r"aborted at shutdown_timeout_s=2: (\d+)", log)
        assert match and int(match.group(1)) == 2, log[-2000:]
        print(f"exited {exited:.2f} s after SIGTERM (shutdown_timeout_s={shutdown_s})")
        for s in (stream, body, head):
            s.close()
    finally:
        live.stop()
