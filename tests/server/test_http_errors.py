"""Every validation failure is a JSON ``{"error": {"message", "type"}}`` with a stable type."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.gated import GatedServer, granted_in, serving
from tests.server.live import DATA, LiveServer, assert_error, b64, in_thread, silence_wav
from tests.server.test_access_log import access_line

SPEECH = {"model": "piper", "input": "Hello."}


@pytest.mark.parametrize(
    ("body", "contains"),
    [
        ({"model": "piper"}, "'input' is required"),
        ({**SPEECH, "input": ""}, "'input'"),
        ({**SPEECH, "input": 5}, "'input' must be a string"),
        ({**SPEECH, "input": " "}, "'input' must be non-empty"),
        ({"input": "Hello."}, "'model' is required"),
        ({**SPEECH, "model": "whisper"}, "serves task 'asr'"),
        ({**SPEECH, "voice": "nobody"}, "unknown voice 'nobody'"),  # alloy is an alias (#12)
        ({**SPEECH, "response_format": "ogg"}, "unsupported response_format 'ogg'"),  # opus is
        ({**SPEECH, "busy_timeout_ms": -1}, "busy_timeout_ms"),
        ({**SPEECH, "busy_timeout_ms": "soon"}, "busy_timeout_ms"),
        ({**SPEECH, "busy_timeout_ms": 1.5}, "busy_timeout_ms"),
        ({**SPEECH, "busy_timeout_ms": True}, "busy_timeout_ms"),
        ({**SPEECH, "speed": 10}, "'speed'"),
        ({**SPEECH, "speed": "fast"}, "'speed'"),
        ({**SPEECH, "seed": -1}, "'seed'"),
        ({**SPEECH, "stream": "maybe"}, "'stream'"),
        ({**SPEECH, "stream_format": "ogg"}, "stream_format"),
    ],
)
def test_speech_validation_is_400(http: httpx.Client, body: dict[str, Any], contains: str) -> None:
    assert_error(http.post("/v1/audio/speech", json=body), 400, "invalid_request_error", contains)


@pytest.mark.parametrize("text", ["...", "\u200b"])
@pytest.mark.parametrize(
    ("route", "extra"),
    [
        ("/v1/audio/speech", {"response_format": "wav"}),
        ("/v1/audio/speech", {"response_format": "mp3"}),
        ("/v1/audio/speech", {"response_format": "pcm"}),
        ("/v1/audio/speech", {"response_format": "json"}),
        ("/v1/audio/speech", {"stream_format": "audio"}),
        ("/v1/audio/speech", {"stream": True}),
        ("/v1/tasks/run", {}),
        ("/v1/tasks/stream", {}),
    ],
)
def test_text_with_nothing_to_pronounce_is_400_on_every_route(
    main_server: LiveServer, http: httpx.Client, text: str, route: str, extra: dict[str, Any]
) -> None:
    """Text the voice gives no audio for is the same 400 whatever the route, format or
    streaming (it was a 200 with an empty body, or a header without samples, unless
    streamed), and the slot comes back."""
    r = http.post(route, json={"model": "piper", "input": text, **extra})
    assert_error(r, 400, "invalid_request_error", "produced no speech (nothing to pronounce)")
    assert main_server.wait_idle("piper", timeout=60.0)["active_slots"] == 0


def test_a_limit_after_a_raw_stream_started_is_a_client_error(
    main_server: LiveServer, http: httpx.Client
) -> None:
    """The third "Hi." breaks the per-character speech limit after the first was sent: the raw
    stream is cut (no final chunk), the log has a warning naming the limit and the 400 it would
    have been (no traceback, no "internal error"), and /metrics counts it as a 400."""
    body = {
        **SPEECH,
        "input": "Hi. Hi. Hi. Hi.",
        "stream_format": "audio",
        "response_format": "mp3",
        "length_scale": 10,
        "speed": 0.5,
    }
    counted = 'voxpool_request_seconds_count{model="piper",route="/v1/audio/speech",status="400"}'

    def count() -> float:
        lines = http.get("/metrics").text.splitlines()
        return next((float(x.split()[-1]) for x in lines if x.startswith(counted + " ")), 0.0)

    before, log_from = count(), len(main_server.log())
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
        request_id = r.headers["x-request-id"]
        got = b""
        with pytest.raises(httpx.RemoteProtocolError):  # the body ends without its last chunk
            for data in r.iter_bytes():
                got += data
    assert got  # the first sentences arrived
    log = main_server.log()[log_from:]
    cut = [line for line in log.splitlines() if request_id in line and "cut short" in line]
    assert len(cut) == 1 and "WARNING" in cut[0], log
    assert "status 400" in cut[0] and "speech_seconds_per_char" in cut[0], cut
    assert "internal error" not in log and "Traceback" not in log, log
    assert count() == before + 1


def test_a_limit_after_an_sse_stream_started_is_counted_as_the_400_it_is(
    main_server: LiveServer, http: httpx.Client
) -> None:
    """The same limit in an SSE stream: the stream ends with its error event, and the access
    log, the log's warning and /metrics say 400, not 200."""
    body = {**SPEECH, "input": "Hi. Hi. Hi. Hi.", "stream": True, "length_scale": 10}
    status = 'voxpool_request_seconds_count{model="piper",route="/v1/audio/speech",status="%s"}'

    def count(code: int) -> float:
        lines = http.get("/metrics").text.splitlines()
        name = status % code
        return next((float(x.split()[-1]) for x in lines if x.startswith(name + " ")), 0.0)

    before, ok_before, log_from = count(400), count(200), len(main_server.log())
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        request_id = r.headers["x-request-id"]
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[0].startswith('data: {"type":"speech.audio.delta"'), events[:1]
    assert '"type":"error"' in events[-1] and "speech_seconds_per_char" in events[-1], events[-1]
    assert access_line(main_server, request_id)["status"] == "400"  # waits: it follows the body
    log = main_server.log()[log_from:]
    said = [line for line in log.splitlines() if request_id in line and "error event" in line]
    assert len(said) == 1 and "WARNING" in said[0] and "status 400" in said[0], log
    assert "Traceback" not in log, log
    assert count(400) == before + 1 and count(200) == ok_before


def test_audio_routes_name_a_content_type_they_do_not_read(
    http: httpx.Client, hello_wav: bytes
) -> None:
    for headers in ({"content-type": "text/plain"}, {"content-type": "audio/wav"}):
        r = http.post("/v1/audio/transcriptions", content=hello_wav, headers=headers)
        error = assert_error(r, 400, "invalid_request_error", "is not accepted here")
        assert headers["content-type"] in error["message"]
        assert "multipart/form-data" in error["message"], error
    r = http.post("/v1/audio/vad", data={"model": "silero_vad"})  # a urlencoded form
    assert_error(r, 400, "invalid_request_error", "'application/x-www-form-urlencoded'")


def part(headers: str, data: bytes) -> bytes:
    return b"--XyZ\r\n" + headers.encode() + b"\r\n\r\n" + data + b"\r\n"


def test_multipart_errors_say_what_is_wrong(http: httpx.Client, hello_wav: bytes) -> None:
    """A body cut before its closing boundary, and a ``file`` part without ``filename=``."""
    model = part('Content-Disposition: form-data; name="model"', b"whisper")
    upload = 'Content-Disposition: form-data; name="file"; filename="a.wav"'
    headers = {"content-type": "multipart/form-data; boundary=XyZ"}
    whole = model + part(upload, hello_wav) + b"--XyZ--\r\n"
    for cut in (len(whole) - 9, len(model) + 200):  # in the closing boundary, in the file
        r = http.post("/v1/audio/transcriptions", content=whole[:cut], headers=headers)
        assert_error(r, 400, "invalid_request_error", "ends before its closing boundary")
    nameless = model + part('Content-Disposition: form-data; name="file"', b"RIFF") + b"--XyZ--"
    r = http.post("/v1/audio/transcriptions", content=nameless, headers=headers)
    assert_error(r, 400, "invalid_request_error", "'file' part has no filename")


@pytest.mark.parametrize("content", [b"{", b"[1, 2]", b"", b"\xff\xfe", b'"text"'])
def test_bad_json_bodies_are_400(http: httpx.Client, content: bytes) -> None:
    r = http.post("/v1/audio/speech", content=content, headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error")


def test_unknown_model_is_404(http: httpx.Client, hello_wav: bytes) -> None:
    assert_error(
        http.post("/v1/audio/speech", json={**SPEECH, "model": "nope"}),
        404,
        "not_found_error",
        "nope",
    )
    files = {"file": ("a.wav", hello_wav, "audio/wav")}
    r = http.post("/v1/audio/transcriptions", files=files, data={"model": "nope"})
    assert_error(r, 404, "not_found_error")
    assert_error(
        http.post("/v1/tasks/run", json={"model": "nope", "request": {}}), 404, "not_found_error"
    )
    assert_error(http.get("/v1/audio/voices", params={"model": "nope"}), 404, "not_found_error")


def test_unknown_route_is_404_and_wrong_method_is_json(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing/here"), 404, "not_found_error", "/v1/nothing/here")
    assert_error(http.post("/v2/audio/speech", json=SPEECH), 404, "not_found_error")
    assert_error(http.get("/v1/audio/speech"), 405, "invalid_request_error")
    for path in ("/v1/models/load", "/v1/models/unload"):  # not model ids: their routes' paths
        r = http.get(path)
        assert_error(r, 405, "invalid_request_error")
        assert r.headers["allow"] == "POST"
    assert_error(http.post("/v1/models/piper", json={}), 405, "invalid_request_error")
    assert_error(http.get("/v1/models/piper/extra"), 404, "not_found_error")


def transcribe(http: httpx.Client, name: str, data: bytes, **fields: str) -> httpx.Response:
    return http.post(
        "/v1/audio/transcriptions",
        files={"file": (name, data, "audio/wav")},
        data={"model": "whisper", **fields},
    )


def test_transcription_validation_is_400(http: httpx.Client, hello_wav: bytes) -> None:
    assert_error(  # MP3 is accepted (#12); this one is broken
        transcribe(http, "a.mp3", b"ID3\x03\x00fake mp3"), 400, "invalid_request_error", "mp3"
    )
    assert_error(
        transcribe(http, "a.wav", b"RIFF\x00\x00garbage" * 7), 400, "invalid_request_error", "WAV"
    )
    assert_error(
        transcribe(http, "a.wav", bytes(range(256))), 400, "invalid_request_error", "not a WAV"
    )
    assert_error(transcribe(http, "a.wav", b""), 400, "invalid_request_error")
    assert_error(
        transcribe(http, "a.wav", hello_wav, language="fr"),
        400,
        "invalid_request_error",
        "English-only",
    )
    assert_error(
        transcribe(http, "a.wav", hello_wav, response_format="xml"),
        400,
        "invalid_request_error",
        "xml",
    )
    assert_error(
        transcribe(http, "a.wav", hello_wav, busy_timeout_ms="-5"), 400, "invalid_request_error"
    )
    r = http.post(
        "/v1/audio/transcriptions", data={"model": "whisper"}, files={"other": ("x", b"1")}
    )
    assert_error(r, 400, "invalid_request_error", "'file'")
    r = http.post("/v1/audio/transcriptions", json={"model": "whisper"})
    assert_error(r, 400, "invalid_request_error", "audio is required")
    r = http.post(
        "/v1/audio/transcriptions", json={"model": "whisper", "audio_base64": "not base64!"}
    )
    assert_error(r, 400, "invalid_request_error", "base64")
    r = http.post(
        "/v1/audio/transcriptions", json={"model": "whisper", "audio_base64": b64(b"just bytes")}
    )
    assert_error(r, 400, "invalid_request_error", "not a WAV")
    r = http.post(
        "/v1/audio/vad",
        json={"model": "silero_vad", "audio_base64": b64(hello_wav), "threshold": "high"},
    )
    assert_error(r, 400, "invalid_request_error", "threshold")


def test_audio_paths_are_confined_to_audio_roots(http: httpx.Client) -> None:
    inside = DATA / "audio" / "hello.wav"
    for path in (
        str(DATA / "audio" / ".." / "main.json"),
        str(DATA / "main.json"),
        "/etc/passwd",
        str(DATA / "audio" / ".." / "audio" / ".." / "audio" / ".." / "main.json"),
    ):
        r = http.post("/v1/audio/vad", json={"model": "silero_vad", "audio_path": path})
        assert_error(r, 400, "invalid_request_error", "outside the configured audio_roots")
    r = http.post(
        "/v1/audio/vad",
        json={"model": "silero_vad", "audio_path": str(DATA / "audio" / "missing.wav")},
    )
    assert_error(r, 400, "invalid_request_error", "cannot read")
    # a traversal that comes back inside the root is inside
    back = str(DATA / "audio" / ".." / "audio" / "hello.wav")
    assert (
        http.post("/v1/audio/vad", json={"model": "silero_vad", "audio_path": back}).status_code
        == 200
    )
    assert (
        http.post(
            "/v1/tasks/run", json={"model": "silero_vad", "request": {"audio_path": str(inside)}}
        ).status_code
        == 200
    )


def test_tasks_validation_is_400(http: httpx.Client) -> None:
    assert_error(
        http.post("/v1/tasks/batch", json={"model": "silero_vad", "requests": []}),
        400,
        "invalid_request_error",
    )
    assert_error(
        http.post("/v1/tasks/batch", json={"model": "silero_vad", "requests": [1]}),
        400,
        "invalid_request_error",
    )
    many = [{"audio_base64": "AAAA"}] * 65
    assert_error(
        http.post("/v1/tasks/batch", json={"model": "silero_vad", "requests": many}),
        400,
        "invalid_request_error",
    )
    r = http.post(
        "/v1/tasks/stream",
        json={"model": "piper", "request": {"text": "Hi."}, "stream_format": "sse"},
    )
    assert_error(r, 400, "invalid_request_error", "stream_format")
    assert_error(
        http.post("/v1/tasks/run", json={"model": "piper", "request": "Hi."}),
        400,
        "invalid_request_error",
    )
    assert_error(
        http.post("/v1/tasks/run", json={"model": "piper", "request": {}}),
        400,
        "invalid_request_error",
        "'input' is required (non-empty text to speak; 'text' is accepted too)",
    )
    for route in ("/v1/tasks/run", "/v1/tasks/stream"):  # without "request", the body is it
        assert_error(
            http.post(route, json={"model": "piper"}),
            400,
            "invalid_request_error",
            "'input' is required (non-empty text to speak; 'text' is accepted too)",
        )
        said = http.post(route, json={"model": "piper", "input": "Hi."})
        assert said.status_code == 200, said.text


def test_a_request_names_one_model_and_one_audio(http: httpx.Client, hello_wav: bytes) -> None:
    """An inner ``model`` other than the one the task is sent to, and audio given two ways, are
    400s naming both (never one of them silently dropped)."""
    for route in ("/v1/tasks/run", "/v1/tasks/stream"):
        r = http.post(
            route, json={"model": "piper", "request": {"model": "whisper", "input": "Hi"}}
        )
        assert_error(r, 400, "invalid_request_error", "names model 'whisper' but is sent to")
    r = http.post(
        "/v1/tasks/batch",
        json={"model": "silero_vad", "requests": [{"model": "x", "audio_base64": b64(hello_wav)}]},
    )
    assert_error(r, 400, "invalid_request_error", "names model 'x'")
    same = {
        "model": "silero_vad",
        "request": {"model": "silero_vad", "audio_base64": b64(hello_wav)},
    }
    assert http.post("/v1/tasks/run", json=same).status_code == 200
    both = {"audio_base64": b64(hello_wav), "audio_path": "/etc/passwd"}
    for route, body in (
        ("/v1/audio/vad", {"model": "silero_vad", **both}),
        ("/v1/tasks/run", {"model": "silero_vad", "request": both}),
    ):
        error = assert_error(http.post(route, json=body), 400, "invalid_request_error")
        assert "'audio_base64' and 'audio_path'" in error["message"], error
    upload = {"file": ("hello.wav", hello_wav, "audio/wav")}
    r = http.post("/v1/audio/vad", files=upload, data={"model": "silero_vad", "audio_path": "/x"})
    assert_error(r, 400, "invalid_request_error", "an uploaded 'file' and 'audio_path'")


@pytest.fixture(scope="module")
def gated(server_logs: Path) -> Iterator[GatedServer]:
    """main.json with every model's session work held at a gate the test opens."""
    with serving(DATA / "main.json", server_logs) as server:
        yield server


def test_busy_model_answers_503_with_retry_after(gated: GatedServer) -> None:
    """tts1 has one slot: while a request is held in it, a request that may wait 100 ms gets 503,
    and so does a stream, before any header; neither ever got the slot (the server's trace)."""
    gated.wait_idle("tts1")
    trace_from = len(gated.trace())
    with gated.client() as http, gated.client() as other:
        with gated.held("tts1") as base:
            held = in_thread(
                lambda: other.post("/v1/audio/speech", json={"model": "tts1", "input": "Held."})
            )
            gated.wait_arrived("tts1", base + 1)
            r = http.post(
                "/v1/audio/speech", json={"model": "tts1", "input": "Hi.", "busy_timeout_ms": 100}
            )
            assert_error(r, 503, "server_busy")
            assert int(r.headers["retry-after"]) >= 1
            # streams are refused before any header too
            body = {"model": "tts1", "input": "Hi.", "stream": True, "busy_timeout_ms": 100}
            assert_error(http.post("/v1/audio/speech", json=body), 503, "server_busy")
            assert not held.done()
        assert held.result(timeout=120).status_code == 200
        gated.wait_idle("tts1")
        r = http.post(
            "/v1/audio/speech", json={"model": "tts1", "input": "Hi.", "busy_timeout_ms": 100}
        )
        assert r.status_code == 200
    records = [r for r in gated.trace()[trace_from:] if r.model == "tts1"]
    tickets = [int(r.args["ticket"]) for r in records if r.event == "request"]
    assert len(tickets) == 4
    refused = tickets[1:3]
    assert all(not any(t in granted_in(r) for r in records) for t in refused), records
    assert all(any(t in granted_in(r) for r in records) for t in (tickets[0], tickets[3]))


def test_restricted_server_limits(restricted_server: LiveServer, hello_wav: bytes) -> None:
    """Management disabled (403), no audio_roots (400), a 4 KiB body limit (413)."""
    with restricted_server.client() as http:
        for method, path, body in (
            ("POST", "/v1/models/load", {"id": "x", "family": "piper"}),
            ("POST", "/v1/models/unload", {"id": "piper"}),
            ("POST", "/v1/tasks/unload_models", {"model_ids": ["piper"]}),
            ("POST", "/v1/tasks/unload_all_models", {}),
        ):
            r = http.request(method, path, json=body, headers={"Authorization": "Bearer anything"})
            assert_error(r, 403, "permission_error", "disabled")
        r = http.post(
            "/v1/audio/vad",
            json={"model": "silero_vad", "audio_path": str(DATA / "audio" / "hello.wav")},
        )
        assert_error(r, 400, "invalid_request_error", "audio_roots")
        files = {"file": ("hello.wav", hello_wav, "audio/wav")}
        assert_error(
            http.post("/v1/audio/vad", files=files, data={"model": "silero_vad"}),
            413,
            "invalid_request_error",
            "4096",
        )
        assert_error(
            http.post("/v1/audio/speech", json={"model": "piper", "input": "a " * 3000}),
            413,
            "invalid_request_error",
        )

        def chunks() -> Iterator[
            bytes
        ]:  # no content-length: the limit applies to the bytes actually sent
            for _ in range(10):
                yield b"x" * 1000

        r = http.post(
            "/v1/audio/speech", content=chunks(), headers={"content-type": "application/json"}
        )
        assert_error(r, 413, "invalid_request_error")

        def multipart() -> Iterator[
            bytes
        ]:  # a chunked upload is cut off at the limit too, not misread as malformed
            yield b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nsilero_vad\r\n'
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
            yield hello_wav
            yield b"\r\n--b--\r\n"

        r = http.post(
            "/v1/audio/vad",
            content=multipart(),
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert_error(r, 413, "invalid_request_error", "max_request_body_bytes")
        assert http.get("/health").json()["management"] is False
        assert http.get("/v1/audio/voices").status_code == 200


def test_memory_budget_evicts_the_idle_model(restricted_server: LiveServer) -> None:
    """memory_budget_mb=100 with piper (80 MB) and silero_vad (30 MB): one at a time."""
    with restricted_server.client() as http:

        def loaded() -> dict[str, bool]:
            return {r["id"]: r["loaded"] for r in http.get("/v1/models").json()["data"]}

        assert (
            http.post("/v1/audio/speech", json={"model": "piper", "input": "Hi."}).status_code
            == 200
        )
        assert loaded() == {"piper": True, "silero_vad": False}
        silence = {"model": "silero_vad", "request": {"audio_base64": b64(silence_wav(0.05))}}
        r = http.post("/v1/tasks/run", json=silence)
        assert r.status_code == 200 and r.json()["segments"] == []
        assert loaded() == {"piper": False, "silero_vad": True}
        assert (
            http.post("/v1/audio/speech", json={"model": "piper", "input": "Hi."}).status_code
            == 200
        )
        assert loaded() == {"piper": True, "silero_vad": False}
