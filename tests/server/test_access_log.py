"""Request ids and the access log, on live servers.

Every response carries ``X-Request-Id`` (the client's when sane, else a fresh
one); every request ends in one ``voxpool.access`` line on stderr naming its
method, path, status, duration, model and that id; a 500 names the same id in
its body, its header and the logged traceback. ``--log-level`` decides which
lines are written (status polls at debug, the rest at info).
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.cli import build_parser
from tests.server.gated import HANG_GUARD_S, serving, wait_until
from tests.server.live import DATA, HELLO_WAV, LiveServer, in_thread, sse_events

GENERATED = re.compile(r"[0-9a-f]{16}")
ACCESS = re.compile(
    r"^\S+ \S+ (?P<level>[A-Z]+) voxpool\.access: (?P<method>[A-Z]+) (?P<path>\S+) "
    r"(?P<status>\d{3}) (?P<ms>\d+\.\d)ms model=(?P<model>\S+) id=(?P<id>\S+)$",
    re.MULTILINE,
)


def access_lines(server: LiveServer) -> list[dict[str, str]]:
    return [m.groupdict() for m in ACCESS.finditer(server.log())]


def access_line(server: LiveServer, request_id: str) -> dict[str, str]:
    """The access line of the request with this id (waits for it: the line follows the response)."""

    def found() -> dict[str, str] | None:
        return next((line for line in access_lines(server) if line["id"] == request_id), None)

    return wait_until(f"the access line of request {request_id}", found)


def test_a_client_request_id_is_echoed_and_logged_with_the_request(
    main_server: LiveServer, http: httpx.Client
) -> None:
    resp = http.post(
        "/v1/audio/speech",
        json={"model": "piper", "input": "Access log.", "response_format": "wav"},
        headers={"X-Request-Id": "client-id-42"},
    )
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["x-request-id"] == "client-id-42"
    line = access_line(main_server, "client-id-42")
    assert line["level"] == "INFO"
    assert (line["method"], line["path"], line["status"], line["model"]) == (
        "POST",
        "/v1/audio/speech",
        "200",
        "piper",
    )
    # the logged duration covers the whole request, the synthesis included
    assert float(line["ms"]) >= float(resp.headers["x-voxpool-wall-ms"]) - 0.1


@pytest.mark.parametrize(
    "sent",
    [None, "", "has space", "x" * 129, "-leading-dash", "semi;colon", "caf\u00e9"],
    ids=["absent", "empty", "space", "too-long", "leading-dash", "semicolon", "non-ascii"],
)
def test_an_absent_or_insane_request_id_is_replaced_by_a_fresh_one(
    main_server: LiveServer, sent: str | None
) -> None:
    headers = [] if sent is None else [(b"X-Request-Id", sent.encode("utf-8"))]
    resp = httpx.get(main_server.url + "/v1/audio/voices", headers=headers, timeout=HANG_GUARD_S)
    assert resp.status_code == 200
    request_id = resp.headers["x-request-id"]
    assert GENERATED.fullmatch(request_id), request_id
    line = access_line(main_server, request_id)
    assert (line["method"], line["path"], line["status"]) == ("GET", "/v1/audio/voices", "200")


def test_fresh_ids_differ_between_requests(main_server: LiveServer, http: httpx.Client) -> None:
    ids = {http.get("/v1/audio/voices").headers["x-request-id"] for _ in range(20)}
    assert len(ids) == 20


def test_error_responses_carry_the_id_and_are_logged_with_their_status(
    main_server: LiveServer, http: httpx.Client
) -> None:
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("GET", "/no/such/route", {}, 404, "-"),
        ("DELETE", "/v1/models", {}, 405, "-"),
        ("POST", "/v1/audio/speech", {"content": b"not json"}, 400, "-"),
        ("POST", "/v1/audio/speech", {"json": {"model": "piper", "input": ""}}, 400, "piper"),
        ("POST", "/v1/audio/speech", {"json": {"model": "ghost", "input": "x"}}, 404, "-"),
    ]
    for n, (method, path, kwargs, status, model) in enumerate(cases):
        request_id = f"error-case-{n}"
        resp = http.request(method, path, headers={"X-Request-Id": request_id}, **kwargs)
        assert resp.status_code == status, (path, resp.text[:300])
        assert resp.headers["x-request-id"] == request_id
        assert "request_id" not in resp.json()["error"]  # only a 500's body names the id
        line = access_line(main_server, request_id)
        assert (line["method"], line["path"], line["status"], line["model"]) == (
            method,
            path,
            str(status),
            model,
        )


def test_a_path_cannot_forge_log_lines(main_server: LiveServer, http: httpx.Client) -> None:
    resp = http.get("/x%0A2000-01-01%2000:00:00,000%20INFO%20voxpool.access:%20forged")
    assert resp.status_code == 404
    line = access_line(main_server, resp.headers["x-request-id"])
    assert (
        line["path"] == "/x\\x0a2000-01-01\\x2000:00:00,000\\x20INFO\\x20voxpool.access:\\x20forged"
    )
    assert "\n2000-01-01 00:00:00,000 INFO" not in main_server.log()


def test_a_malformed_request_answered_by_the_listener_has_an_id(main_server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", main_server.port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    assert head.startswith("http/1.1 400"), head
    found = re.search(r"^x-request-id: ([0-9a-f]{16})\r?$", head, re.MULTILINE)
    assert found, head


def test_a_500_names_one_id_in_its_body_header_traceback_and_access_line(tmp_path: Path) -> None:
    with serving(DATA / "main.json", tmp_path) as server:
        (server.gate_dir / "fail-load-silero_vad").touch()  # its next load fails
        resp = httpx.post(
            server.url + "/v1/audio/vad",
            files={"file": ("hello.wav", HELLO_WAV.read_bytes(), "audio/wav")},
            data={"model": "silero_vad"},
            headers={"X-Request-Id": "load-fails-1"},
            timeout=HANG_GUARD_S,
        )
        assert resp.status_code == 500, resp.text[:300]
        error = resp.json()["error"]
        assert error["request_id"] == resp.headers["x-request-id"] == "load-fails-1"
        assert "injected" not in resp.text  # the cause stays in the log
        line = access_line(server, "load-fails-1")
        assert (line["method"], line["path"], line["status"], line["model"]) == (
            "POST",
            "/v1/audio/vad",
            "500",
            "silero_vad",
        )
        log = server.log()
        logged = re.search(r"ERROR voxpool\.http: request load-fails-1 failed: (.*)", log)
        assert logged, log[-3000:]
        after = log[logged.end() :]
        assert "Traceback" in after and "injected load failure for 'silero_vad'" in after


def test_a_stream_is_logged_once_when_it_ends(main_server: LiveServer, http: httpx.Client) -> None:
    body = {"model": "piper", "input": "One sentence. And another one.", "stream": True}
    with http.stream(
        "POST", "/v1/audio/speech", json=body, headers={"X-Request-Id": "stream-1"}
    ) as resp:
        assert resp.status_code == 200 and resp.headers["x-request-id"] == "stream-1"
        events = sse_events(resp.iter_lines())
    assert events[-1] == "[DONE]"
    line = access_line(main_server, "stream-1")
    assert (line["path"], line["status"], line["model"]) == ("/v1/audio/speech", "200", "piper")
    assert sum(found["id"] == "stream-1" for found in access_lines(main_server)) == 1


def test_a_client_gone_before_the_response_is_logged_as_499(tmp_path: Path) -> None:
    with serving(DATA / "main.json", tmp_path) as server, server.held("tts1") as step:
        holder = in_thread(
            lambda: httpx.post(
                server.url + "/v1/audio/speech",
                json={"model": "tts1", "input": "I hold the only slot."},
                timeout=HANG_GUARD_S,
            )
        )
        server.wait_arrived("tts1", step + 1)  # tts1's one slot, held at the gate
        data = json.dumps({"model": "tts1", "input": "Nobody waits for this."}).encode()
        head = (
            "POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: gone-1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
            sock.sendall(head.encode() + data)
            server.wait_for("tts1", lambda row: row["queued_requests"] == 1)
        # the client closed while queued: the request leaves the queue and ends without a response
        line = access_line(server, "gone-1")
        assert (line["path"], line["status"], line["model"]) == ("/v1/audio/speech", "499", "tts1")
        server.open("tts1")
        assert holder.result(timeout=HANG_GUARD_S).status_code == 200


def _metric(server: LiveServer, line_start: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=HANG_GUARD_S).text
    found = next((ln for ln in text.splitlines() if ln.startswith(line_start + " ")), None)
    return float(found.split()[-1]) if found else 0.0


def test_a_client_gone_while_its_request_runs_is_logged_as_499(tmp_path: Path) -> None:
    """A transcription that cannot stop mid-file (a session's whole run) still ends after its
    client went away: its answer is dropped, not sent, and the request is a 499 in the
    access log and the metrics, not a 200 nobody read; the departure is counted once it is
    seen (``voxpool_clients_gone_total``), which is when the test lets the run end."""
    gone = 'voxpool_clients_gone_total{route="/v1/audio/transcriptions"}'
    status = 'voxpool_request_seconds_count{model="whisper",route="/v1/audio/transcriptions",'
    with serving(DATA / "main.json", tmp_path) as server, server.held("whisper") as step:
        before = _metric(server, gone)
        wav = HELLO_WAV.read_bytes()
        parts = (
            b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
            b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + wav + b"\r\n--b--\r\n"
        )
        head = (
            "POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-Id: gone-2\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {len(parts)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_GUARD_S) as sock:
            sock.sendall(head.encode() + parts)
            server.wait_arrived("whisper", step + 1)  # running in its slot, held at the gate
        wait_until("the departure to be seen", lambda: _metric(server, gone) > before)
        server.open("whisper")
        line = access_line(server, "gone-2")
        assert (line["path"], line["status"], line["model"]) == (
            "/v1/audio/transcriptions",
            "499",
            "whisper",
        )
        assert _metric(server, status + 'status="499"}') == 1.0
        assert _metric(server, status + 'status="200"}') == 0.0


def test_metrics_label_requests_by_route_not_by_the_path_asked_for(
    main_server: LiveServer, http: httpx.Client
) -> None:
    """A client cannot add metric series (and memory) by asking for paths or ids that do not
    exist: they are counted under the route they matched, or under ``(unmatched)``."""

    def metrics() -> str:
        return http.get("/metrics").text

    for i in range(3):
        assert http.get(f"/v1/nothing/{i}-x").status_code == 404
        assert http.get(f"/v1/models/ghost-{i}").status_code == 404
    for path in ("/v1/audio/transcriptions", "/v1/nothing/big"):  # refused before routing
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {10**15}\r\n\r\n"
        with socket.create_connection(("127.0.0.1", main_server.port), timeout=HANG_GUARD_S) as s:
            s.sendall(head.encode())
            assert s.recv(64).startswith(b"HTTP/1.1 413 ")
    # a request is counted once its response has gone out: wait for both
    labels = ('route="/v1/audio/transcriptions",status="413"', 'route="(unmatched)",status="413"')
    wait_until("both 413s counted", lambda: all(label in metrics() for label in labels))
    text = metrics()
    assert 'route="(unmatched)",status="404"' in text
    assert 'route="/v1/models/{id}",status="404"' in text
    assert "ghost-" not in text and "/v1/nothing" not in text


LEVEL_REQUESTS = (
    ("GET", "/v1/models", 200),  # a status poll: debug
    ("GET", "/health", 200),  # a status poll: debug
    ("GET", "/v1/audio/voices", 200),
    ("GET", "/no/such/route", 404),
    ("GET", "/v1/models/nope", 404),  # not a poll: info
)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (None, {"/v1/audio/voices", "/no/such/route", "/v1/models/nope"}),
        ("info", {"/v1/audio/voices", "/no/such/route", "/v1/models/nope"}),
        (
            "debug",
            {"/v1/models", "/health", "/v1/audio/voices", "/no/such/route", "/v1/models/nope"},
        ),
        ("warning", set()),
        ("error", set()),
    ],
)
def test_log_level_decides_which_access_lines_are_written(
    tmp_path: Path, level: str | None, expected: set[str]
) -> None:
    extra = () if level is None else ("--log-level", level)
    server = LiveServer(DATA / "restricted.json", tmp_path, extra=extra).start()
    try:
        sent = []
        with server.client(timeout=HANG_GUARD_S) as client:
            for method, path, status in LEVEL_REQUESTS:
                resp = client.request(method, path)
                assert resp.status_code == status, (path, resp.text[:200])
                sent.append((path, resp.headers["x-request-id"]))
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    # stopped: every line the process would write is in the file now
    lines = {line["id"]: line for line in access_lines(server)}
    logged = {path for path, request_id in sent if request_id in lines}
    assert logged == expected, server.log()[-3000:]
    for path, request_id in sent:
        if request_id in lines:
            debug = path in ("/v1/models", "/health")
            assert lines[request_id]["level"] == ("DEBUG" if debug else "INFO")
    assert "shutting down" in server.log()  # the server's own messages stay at every level


def test_log_level_takes_only_known_levels() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).log_level == "info"
    assert parser.parse_args(["serve", "--log-level", "debug"]).log_level == "debug"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--log-level", "verbose"])
    assert exc.value.code == 2
