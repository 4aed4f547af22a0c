"""Live voice activity over a WebSocket against a real ``voxpool serve`` (issue #14).

The client is the real ``websockets`` package (its sync client). What a live stream
gives equals what the offline route gives for the same audio (probabilities within
the batched tolerance, the same segments; its speech events equal the SSE
stream's); several sockets advance in shared batched steps; every malformed
input gets its HTTP answer (before the upgrade) or its close code and JSON
reason (after it); the idle timeout, a client that vanishes and a client that
stops reading all give the slot back (waited for on ``/v1/models``, never on a
sleep); SIGTERM ends a live socket with its summary and 1001; the server is
healthy after all of it.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from server.http.routes_live import Live
from tests.server.live import LiveServer, in_thread, parse_sse
from tests.server.test_ws_listener import KEY, frame, handshake, upgraded

WHISPER_DATA = Path(__file__).resolve().parents[1] / "data" / "whisper"
ROUTE = "/v1/audio/vad/live"
VAD_TOLERANCE = 1e-5
"""Batched VAD probabilities within 1e-5 of the offline route's (docs/server.md, batching)."""
GUARD_S = 60.0
"""A hang guard on any single wait, never a verdict."""
IDLE_S = 3.0
WRITE_S = 2.0


def config(tmp: Path) -> Path:
    path = tmp / "live.json"
    path.write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "port": 18099,
                "busy_timeout_ms": 120000,
                "body_read_timeout_s": IDLE_S,
                "write_timeout_s": WRITE_S,
                "send_buffer_bytes": 4096,
                "models": [
                    {"id": "vad", "family": "silero_vad", "slots": 8, "batching": True},
                    {"id": "vad1", "family": "silero_vad", "slots": 1, "batching": True},
                    {"id": "plain", "family": "silero_vad", "slots": 1},
                    {"id": "tts", "family": "piper", "slots": 1},
                ],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def live(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = LiveServer(config(tmp_path_factory.mktemp("live")), server_logs).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()[-4000:]


def pcm(name: str) -> bytes:
    with wave.open(str(WHISPER_DATA / f"{name}.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        return w.readframes(w.getnframes())


def url(server: LiveServer, query: str = "model=vad") -> str:
    return f"ws://127.0.0.1:{server.port}{ROUTE}" + (f"?{query}" if query else "")


def open_ws(server: LiveServer, query: str = "model=vad", **options: Any) -> ClientConnection:
    return ws_connect(url(server, query), proxy=None, open_timeout=GUARD_S, **options)


def pieces(data: bytes, sizes: tuple[int, ...] = (3000, 1024, 6, 20000)) -> Iterator[bytes]:
    """``data`` in messages of varied (even) lengths: the server frames its own chunks."""
    at, i = 0, 0
    while at < len(data):
        yield data[at : at + sizes[i % len(sizes)]]
        at += sizes[i % len(sizes)]
        i += 1


def drain(ws: ClientConnection) -> tuple[list[dict[str, Any]], Any]:
    """Every message until the server closes, and its close frame."""
    messages = []
    try:
        while True:
            messages.append(json.loads(ws.recv(timeout=GUARD_S)))
    except ConnectionClosed as closed:
        return messages, closed.rcvd


def stream(server: LiveServer, data: bytes, query: str = "model=vad", start: Any = None) -> Any:
    """One whole live stream: the messages and the close."""
    with open_ws(server, query) as ws:
        if start is not None:
            ws.send(json.dumps(start))
        for piece in pieces(data):
            ws.send(piece)
        ws.send(json.dumps({"type": "end"}))
        return drain(ws)


def offline(server: LiveServer, name: str, **fields: str) -> dict[str, Any]:
    audio = (WHISPER_DATA / f"{name}.wav").read_bytes()
    r = httpx.post(
        server.url + "/v1/audio/vad",
        files={"file": (f"{name}.wav", audio, "audio/wav")},
        data={"model": "vad", "include_probabilities": "true", **fields},
        timeout=GUARD_S,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def sse_events(server: LiveServer, name: str) -> list[dict[str, Any]]:
    audio = (WHISPER_DATA / f"{name}.wav").read_bytes()
    r = httpx.post(
        server.url + "/v1/audio/vad",
        files={"file": (f"{name}.wav", audio, "audio/wav")},
        data={"model": "vad", "stream": "true"},
        timeout=GUARD_S,
    )
    assert r.status_code == 200, r.text
    return [e for e in parse_sse(r.text) if isinstance(e, dict) and e["type"] != "vad.done"]


def probabilities_of(messages: list[dict[str, Any]]) -> list[float]:
    out: list[float] = []
    for m in messages:
        if m["type"] == "vad.probabilities":
            assert m["index"] == len(out) and m["start_sample"] == 512 * len(out), m
            out.extend(m["probabilities"])
    return out


def assert_equal_to_offline(messages: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    got = probabilities_of(messages)
    want = reference["probabilities"]
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst <= VAD_TOLERANCE, worst
    done = messages[-1]
    assert done["type"] == "vad.done" and done["reason"] == "end", done
    assert done["segments"] == reference["segments"]
    assert (done["duration"], done["sample_rate"]) == (reference["duration"], 16000)
    assert done["chunks"] == len(want)


def slots_free(server: LiveServer, model: str = "vad") -> None:
    row = server.wait_idle(model, timeout=GUARD_S)
    assert row["active_slots"] == 0, row


def metric(server: LiveServer, prefix: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10.0).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(prefix))


def wait_log(server: LiveServer, text: str) -> None:
    """Wait until the server's log holds ``text`` (the access line is written as the socket's
    handler returns, just after the client saw the close)."""
    deadline = time.monotonic() + GUARD_S
    while text not in server.log():
        assert time.monotonic() < deadline, f"{text!r} not in the log:\n{server.log()[-3000:]}"
        time.sleep(0.02)


def close_json(rcvd: Any, code: int) -> dict[str, Any]:
    """The close frame's JSON reason, after checking its code."""
    assert rcvd is not None and rcvd.code == code, rcvd
    reason = json.loads(rcvd.reason)
    assert set(reason) == {"type", "message"}, reason
    return dict(reason)


# ------------------------------------------------------------------ equality
def test_live_stream_equals_the_offline_route(live: LiveServer) -> None:
    messages, rcvd = stream(live, pcm("meeting"))
    assert rcvd.code == 1000, rcvd
    assert_equal_to_offline(messages, offline(live, "meeting"))
    # its speech events are the SSE stream's, in order
    events = [m for m in messages if m["type"].startswith("vad.speech.")]
    assert events == sse_events(live, "meeting") and events
    slots_free(live)
    wait_log(live, "GET /v1/audio/vad/live 101")
    wait_log(live, "ws_close=1000")


def test_a_start_message_configures_the_stream_as_the_query_does(live: LiveServer) -> None:
    start = {"type": "start", "model": "vad", "threshold": 0.3, "min_silence_duration_ms": 300}
    messages, rcvd = stream(live, pcm("weather"), query="", start=start)
    assert rcvd.code == 1000, rcvd
    reference = offline(live, "weather", threshold="0.3", min_silence_duration_ms="300")
    assert_equal_to_offline(messages, reference)
    assert reference["segments"] != offline(live, "weather")["segments"]  # the options mattered
    by_query, _ = stream(
        live, pcm("weather"), query="model=vad&threshold=0.3&min_silence_duration_ms=300"
    )
    assert by_query[-1] == messages[-1]


def test_several_sockets_advance_in_shared_batched_steps(live: LiveServer) -> None:
    names = ("meeting", "recipe", "weather", "short")
    audio = {name: pcm(name) * 3 for name in names}
    steps0 = metric(live, 'voxpool_batch_steps_total{model="vad"}')
    members0 = metric(live, 'voxpool_batch_members_total{model="vad"}')
    ready = threading.Barrier(len(names))

    def one(name: str) -> Any:
        with open_ws(live) as ws:
            ready.wait(GUARD_S)  # every socket is open (its member admitted) before any audio
            for piece in pieces(audio[name]):
                ws.send(piece)
            ws.send(json.dumps({"type": "end"}))
            return drain(ws)

    futures = {name: in_thread(lambda n=name: one(n)) for name in names}
    results = {name: f.result(GUARD_S * 3) for name, f in futures.items()}
    steps = metric(live, 'voxpool_batch_steps_total{model="vad"}') - steps0
    members = metric(live, 'voxpool_batch_members_total{model="vad"}') - members0
    assert members > steps > 0, (members, steps)
    for name, (messages, rcvd) in results.items():
        assert rcvd.code == 1000, (name, rcvd)
        assert messages[-1]["chunks"] == -(-len(audio[name]) // 2 // 512), name
    slots_free(live)


# ------------------------------------------------- refused before the upgrade
@pytest.mark.parametrize(
    ("query", "status", "error_type", "contains"),
    [
        ("model=nope", 404, "not_found_error", "nope"),
        ("model=tts", 400, "invalid_request_error", "task"),
        ("model=plain", 400, "invalid_request_error", "batching"),
        ("model=vad&threshold=2", 400, "invalid_request_error", "'threshold'"),
        ("model=vad&speech_pad_ms=-1", 400, "invalid_request_error", "'speech_pad_ms'"),
        ("model=vad&busy_timeout_ms=x", 400, "invalid_request_error", "'busy_timeout_ms'"),
        ("model=vad&include_probabilities=true", 400, "invalid_request_error", "unknown field"),
        ("threshold=0.3", 400, "invalid_request_error", "'model'"),
    ],
)
def test_a_bad_handshake_gets_an_http_error(
    live: LiveServer, query: str, status: int, error_type: str, contains: str
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        open_ws(live, query)
    response = refused.value.response
    assert response.status_code == status
    error = json.loads(response.body)["error"]
    assert error["type"] == error_type and contains in error["message"], error
    assert response.headers["x-request-id"]


def test_other_handshake_refusals(live: LiveServer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        open_ws(live, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    assert "cross-origin" in json.loads(refused.value.response.body)["error"]["message"]
    with open_ws(live, origin=f"http://127.0.0.1:{live.port}") as ws:  # the page's own origin
        ws.send(json.dumps({"type": "end"}))
        assert drain(ws)[1].code == 1000
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(f"ws://127.0.0.1:{live.port}/v1/audio/vad", proxy=None)
    assert refused.value.response.status_code == 404
    r = httpx.get(live.url + ROUTE, timeout=10.0)
    assert r.status_code == 426 and r.headers["upgrade"] == "websocket"
    assert ROUTE in r.json()["error"]["message"]


def test_a_busy_model_is_503_before_the_upgrade_and_1013_after(live: LiveServer) -> None:
    with open_ws(live, "model=vad1") as holder:
        live.wait_for("vad1", lambda r: r["active_slots"] == 1, GUARD_S)
        with pytest.raises(InvalidStatus) as refused:
            open_ws(live, "model=vad1&busy_timeout_ms=1")
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["retry-after"]
        assert json.loads(refused.value.response.body)["error"]["type"] == "server_busy"
        with open_ws(live, "") as ws:
            ws.send(json.dumps({"type": "start", "model": "vad1", "busy_timeout_ms": 1}))
            messages, rcvd = drain(ws)
        assert close_json(rcvd, 1013)["type"] == "server_busy"
        assert [m["type"] for m in messages] == ["error"]
        # a handshake queued for the slot, whose client gives up, leaves the queue at once
        waiter = socket.create_connection(("127.0.0.1", live.port), timeout=GUARD_S)
        request = handshake(f"{ROUTE}?model=vad1", f"Sec-WebSocket-Key: {KEY}\r\n".encode())
        waiter.sendall(request.replace(b"Host: t", f"Host: 127.0.0.1:{live.port}".encode()))
        live.wait_for("vad1", lambda r: r["queued_requests"] == 1, GUARD_S)
        waiter.close()
        row = live.wait_for("vad1", lambda r: r["queued_requests"] == 0, GUARD_S)
        assert row["active_slots"] == 1  # the holder still streams
        holder.send(json.dumps({"type": "end"}))
        assert drain(holder)[1].code == 1000
    slots_free(live, "vad1")


def test_a_start_message_queued_for_a_slot_keeps_its_audio_or_leaves_the_queue(
    live: LiveServer,
) -> None:
    with open_ws(live, "model=vad1") as holder:
        live.wait_for("vad1", lambda r: r["active_slots"] == 1, GUARD_S)
        with open_ws(live, "") as queued, open_ws(live, "") as leaving:
            leaving.send(json.dumps({"type": "start", "model": "vad1"}))
            live.wait_for("vad1", lambda r: r["queued_requests"] == 1, GUARD_S)
            leaving.close_socket()  # gone while queued: out of the queue at once
            live.wait_for("vad1", lambda r: r["queued_requests"] == 0, GUARD_S)
            # the whole stream sent while queued: kept, and served once admitted
            queued.send(json.dumps({"type": "start", "model": "vad1"}))
            for piece in pieces(pcm("weather")):
                queued.send(piece)
            queued.send(json.dumps({"type": "end"}))
            live.wait_for("vad1", lambda r: r["queued_requests"] == 1, GUARD_S)
            holder.send(json.dumps({"type": "end"}))
            assert drain(holder)[1].code == 1000
            messages, rcvd = drain(queued)
    assert rcvd.code == 1000, rcvd
    assert_equal_to_offline(messages, offline(live, "weather"))
    slots_free(live, "vad1")


def test_a_queued_client_that_sent_more_than_the_backlog_and_left_leaves_the_queue(
    live: LiveServer,
) -> None:
    """20 s of audio while queued (more than a running stream's 10 s backlog): the queued
    socket is still read (up to max_audio_seconds), so its close is seen and it leaves the
    queue at once, instead of waiting for a slot or its busy timeout."""
    audio = pcm("story")[: 20 * 16000 * 2]
    with open_ws(live, "model=vad1") as holder:
        live.wait_for("vad1", lambda r: r["active_slots"] == 1, GUARD_S)
        with open_ws(live, "") as leaving:
            leaving.send(json.dumps({"type": "start", "model": "vad1"}))
            live.wait_for("vad1", lambda r: r["queued_requests"] == 1, GUARD_S)
            for start in range(0, len(audio), 32000):
                leaving.send(audio[start : start + 32000])
                holder.send(audio[:1024])  # within its idle timeout
            leaving.close_socket()
            live.wait_for("vad1", lambda r: r["queued_requests"] == 0, GUARD_S)
            holder.send(audio[:1024])
            assert live.model("vad1")["active_slots"] == 1  # the holder still streams
        holder.send(json.dumps({"type": "end"}))
        assert drain(holder)[1].code == 1000
    slots_free(live, "vad1")


# ---------------------------------------------------- closed after the upgrade
@pytest.mark.parametrize(
    ("query", "send", "code", "contains"),
    [
        ("model=vad", [b"\x00\x01\x02"], 1003, "odd"),
        ("model=vad", ["not json"], 1003, "JSON"),
        ("model=vad", ["[1, 2]"], 1008, "JSON objects"),
        ("model=vad", [json.dumps({"type": "pause"})], 1008, "unknown message type"),
        ("model=vad", [json.dumps({"type": "start", "model": "vad"})], 1008, "a second 'start'"),
        ("model=vad", ["{}"], 1008, "without a 'type'"),
        ("model=vad", [json.dumps({"type": None})], 1008, "without a 'type'"),
        ("model=vad", [b"\x00" * (1024 * 1024 + 2)], 1009, "1048576 bytes"),
        ("", [b"\x00\x00"], 1008, "first message"),
        ("", [json.dumps({"type": "start", "model": "nope"})], 1008, "unknown model"),
        ("", [json.dumps({"type": "start", "model": "n" * 300})], 1008, "unknown model"),
        ("", [json.dumps({"type": "start", "model": "plain"})], 1008, "batching"),
        ("", [json.dumps({"type": "start", "model": "vad", "threshold": 0})], 1008, "threshold"),
        ("", [json.dumps({"type": "begin", "model": "vad"})], 1008, "'start'"),
        ("", ["{"], 1003, "JSON"),
    ],
)
def test_malformed_input_is_closed_with_its_code_and_a_json_reason(
    live: LiveServer, query: str, send: list[Any], code: int, contains: str
) -> None:
    with open_ws(live, query, max_size=None) as ws:
        if query:  # a stream under way
            ws.send(b"\x00\x00" * 2048)
        for message in send:
            ws.send(message)
        messages, rcvd = drain(ws)
    reason = close_json(rcvd, code)
    assert contains in reason["message"] or contains in messages[-1]["error"]["message"], (
        reason,
        messages,
    )
    if code != 1009:  # the listener's own close (the message is never assembled) sends no error
        assert messages[-1]["type"] == "error" and messages[-1]["error"]["type"] == reason["type"]
    slots_free(live)


# ------------------------------------------------------------- slots come back
def test_the_idle_timeout_ends_the_stream_with_its_summary(live: LiveServer) -> None:
    with open_ws(live) as ws:
        ws.send(pcm("short")[: 16000 * 2])  # one second, then nothing
        messages, rcvd = drain(ws)
    reason = close_json(rcvd, 1008)
    assert reason["type"] == "timeout" and "body_read_timeout_s" in reason["message"]
    done = messages[-1]
    assert done["type"] == "vad.done" and done["reason"] == "idle_timeout"
    assert done["chunks"] == len(probabilities_of(messages)) == 32  # 16000 samples, 31.25 chunks
    slots_free(live)


def test_a_client_that_vanishes_mid_stream_frees_its_slot(live: LiveServer) -> None:
    with open_ws(live) as ws:
        ws.send(pcm("meeting"))
        live.wait_for("vad", lambda r: r["active_slots"] == 1, GUARD_S)
        ws.close_socket()  # no close frame: the TCP connection just ends
    slots_free(live)
    wait_log(live, "ws_close=1006")


def test_a_chunk_after_the_client_left_is_dropped_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client left (the reader cancelled the stream, the sender closed its end of the
    results), yet the member's chunk iterator hands the puller one more chunk: its wake-up
    came before the cancellation, and anyio delivers none to a task whose wait is already
    done. That chunk is dropped; it is no model failure (no 1011, no ERROR with a
    traceback in the log, as a client that reset its connection once got)."""
    st = SimpleNamespace(config=SimpleNamespace(max_audio_seconds=600, body_read_timeout_s=30))

    async def one_chunk() -> Any:
        yield SimpleNamespace(index=0, start=0, probability=0.5, events=())

    async def pull() -> Live:
        live = Live(None, st, None, None, None)  # type: ignore[arg-type]  # the puller needs none
        send, receive = anyio.create_memory_object_stream[Any](math.inf)
        receive.close()  # the sender is gone
        with anyio.CancelScope() as scope:
            await live.puller(one_chunk(), send, scope)
        return live

    with caplog.at_level(logging.ERROR):
        live = anyio.run(pull)
    assert live.error is None, live.error and live.error.message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("repeats", [1, 2])
def test_a_client_that_stops_reading_is_aborted_and_frees_its_slot(
    live: LiveServer, repeats: int
) -> None:
    """Messages of 11 s, and of 22 s (each more than ``MAX_BACKLOG_S``: the reader waits for
    the backlog after every one; under the 1 MiB message limit): either way the write
    deadline ends the socket."""
    aborted0 = metric(live, 'voxpool_connections_aborted_total{kind="write"}')
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(GUARD_S)
    s.connect(("127.0.0.1", live.port))
    request = handshake(f"{ROUTE}?model=vad", f"Sec-WebSocket-Key: {KEY}\r\n".encode())
    request = request.replace(b"Host: t", f"Host: 127.0.0.1:{live.port}".encode())
    assert upgraded(s, request).startswith(b"HTTP/1.1 101 ")
    message = frame(0x2, pcm("meeting") * repeats)  # 11 s a repeat
    sent = 0
    try:
        while sent < 50 // repeats:  # 550 s at most, under max_audio_seconds; never reads
            s.sendall(message)
            sent += 1
    except OSError:
        pass  # reset by the server's abort (or stalled past the guard)
    slots_free(live)
    assert metric(live, 'voxpool_connections_aborted_total{kind="write"}') > aborted0
    s.close()


def test_max_audio_seconds_and_shutdown_end_streams_with_their_summary(
    server_logs: Path, tmp_path: Path
) -> None:
    path = config(tmp_path)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "max_audio_seconds": 2}))
    server = LiveServer(path, server_logs).start()
    try:
        with open_ws(server) as ws:
            try:
                for piece in pieces(pcm("weather")):
                    ws.send(piece)
            except ConnectionClosed:
                pass  # the server ended the stream at the limit
            messages, rcvd = drain(ws)
        reason = close_json(rcvd, 1008)
        assert "max_audio_seconds=2" in reason["message"]
        done = messages[-1]
        assert done["reason"] == "max_audio_seconds" and done["duration"] == 2.0
        assert done["chunks"] == len(probabilities_of(messages)) == 63
        # SIGTERM: an open socket gets the summary of what it sent, then 1001
        with open_ws(server) as ws, open_ws(server, "") as waiting:  # waiting: no start yet
            ws.send(pcm("short")[:32000])
            messages = []
            while len(probabilities_of(messages)) < 31:  # every whole chunk sent was processed
                messages.append(json.loads(ws.recv(timeout=GUARD_S)))
            server.signal()
            rest, rcvd = drain(ws)
            nothing, waited = drain(waiting)
        messages += rest
        assert close_json(rcvd, 1001)["type"] == "server_shutdown"
        assert close_json(waited, 1001)["type"] == "server_shutdown"
        assert [m["type"] for m in nothing] == ["error"]  # it had no stream to summarize
        assert messages[-1]["type"] == "vad.done" and messages[-1]["reason"] == "shutdown"
        assert messages[-1]["chunks"] == 32
        assert server.proc is not None and server.proc.wait(GUARD_S) == 0  # drained, exited
        assert "aborted at shutdown_timeout_s=30: 0" in server.log()
    finally:
        assert server.stop() == 0, server.log()[-4000:]


def test_the_server_is_healthy_after_all_of_it(live: LiveServer) -> None:
    assert httpx.get(live.url + "/health", timeout=10.0).json()["status"] == "ok"
    for model in ("vad", "vad1"):
        slots_free(live, model)
    messages, rcvd = stream(live, pcm("short"))
    assert rcvd.code == 1000 and messages[-1]["type"] == "vad.done", (rcvd, messages[-3:])
    log = live.log()
    assert "internal error" not in log and "Traceback" not in log, log[-6000:]
