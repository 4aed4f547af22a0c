"""Every endpoint of a live server with the real models: status, TTS, ASR, VAD, tasks."""

from __future__ import annotations

import base64
import io
import json
import re
import wave

import httpx

from tests.server.live import LiveServer, b64, parse_sse

HELLO = {"model": "piper", "input": "Hello.", "seed": 3}


def wav_info(data: bytes) -> tuple[int, int, int, bytes]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), w.readframes(w.getnframes())


def test_health(http: httpx.Client) -> None:
    r = http.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["runtime"] == "parallel"
    assert body["backend"] == "numpy"
    assert body["management"] is True
    assert body["models"] >= 4


def test_models_lists_configured_models_with_counters(http: httpx.Client) -> None:
    http.post("/v1/audio/speech", json=HELLO).raise_for_status()  # piper is lazy: load it
    rows = {r["id"]: r for r in http.get("/v1/models").json()["data"]}
    assert {"piper", "whisper", "silero_vad", "tts1"} <= set(rows)
    piper = rows["piper"]
    assert piper["object"] == "model" and piper["task"] == "tts" and piper["family"] == "piper"
    assert piper["loaded"] is True and piper["state"] == "ready"
    assert piper["slots"] == 4
    assert piper["active_slots"] == 0 and piper["queued_requests"] == 0
    assert piper["max_parallel_slots"] == 16
    assert rows["whisper"]["slots"] == 2 and rows["tts1"]["slots"] == 1
    for row in rows.values():
        assert isinstance(row["loaded"], bool)
        assert row["state"] in ("unloaded", "loading", "ready", "reconfiguring", "unloading")
        assert row["max_parallel_slots"] is None or row["max_parallel_slots"] >= row["slots"]


def test_openapi_lists_the_paths(http: httpx.Client) -> None:
    r = http.get("/openapi.json")
    assert r.status_code == 200
    spec = json.loads(r.content)
    assert spec["openapi"].startswith("3.")
    for path in (
        "/health",
        "/v1/models",
        "/v1/models/{id}",
        "/v1/audio/speech",
        "/v1/audio/transcriptions",
        "/v1/audio/voices",
        "/v1/audio/vad",
        "/v1/tasks/run",
        "/v1/tasks/batch",
        "/v1/tasks/stream",
        "/v1/models/load",
        "/v1/models/unload",
        "/v1/tasks/unload_models",
        "/v1/tasks/unload_all_models",
        "/metrics",
    ):
        assert path in spec["paths"], path
    row = spec["paths"]["/v1/models/{id}"]["get"]["responses"]["200"]["content"]
    assert {"id", "object", "created", "owned_by"} <= set(
        row["application/json"]["schema"]["properties"]
    )


def test_metrics_prometheus_text(http: httpx.Client) -> None:
    http.post("/v1/audio/speech", json=HELLO).raise_for_status()
    r = http.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in (
        'voxpool_active_slots{model="piper"} 0.0',
        'voxpool_slots{model="piper"} 4.0',
        'voxpool_queued_requests{model="tts1"} 0.0',
        'voxpool_model_loaded{model="piper"} 1.0',
    ):
        assert line in text, line
    assert 'voxpool_admissions_total{decision="granted",kind="request",model="piper"}' in text
    assert (
        'voxpool_request_seconds_count{model="piper",route="/v1/audio/speech",status="200"}' in text
    )
    assert "# TYPE voxpool_load_seconds histogram" in text


# ---- speech ---------------------------------------------------------------------------


def test_speech_formats_agree(http: httpx.Client) -> None:
    """wav (default), pcm, json/base64, SSE and raw streams of one seeded request: same samples."""
    r = http.post("/v1/audio/speech", json=HELLO)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    channels, width, rate, pcm = wav_info(r.content)
    assert (channels, width, rate) == (1, 2, 22050)
    assert len(pcm) > 2 * 22050 * 0.2
    assert r.headers["x-voxpool-sample-rate"] == "22050"

    raw = http.post("/v1/audio/speech", json={**HELLO, "response_format": "pcm"})
    assert raw.status_code == 200 and raw.headers["content-type"] == "audio/pcm"
    assert raw.content == pcm

    js = http.post("/v1/audio/speech", json={**HELLO, "response_format": "json"})
    assert js.status_code == 200
    body = js.json()
    assert body["format"] == "wav" and body["sample_rate"] == 22050
    assert base64.b64decode(body["audio"]) == r.content
    assert body["timing"]["audio_duration_ms"] > 0

    with http.stream("POST", "/v1/audio/speech", json={**HELLO, "stream": True}) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(s.read().decode())
    assert events[-1] == "[DONE]"
    assert events[-2]["type"] == "speech.audio.done"
    deltas = [e for e in events[:-2] if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(events) - 2 >= 1
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == pcm

    sw = http.post("/v1/audio/speech", json={**HELLO, "stream_format": "audio"})
    assert sw.status_code == 200 and sw.headers["content-type"] == "audio/wav"
    assert (
        sw.content[:4] == b"RIFF" and sw.content[8:12] == b"WAVE" and sw.content[36:40] == b"data"
    )
    assert sw.content[44:] == pcm

    sp = http.post(
        "/v1/audio/speech", json={**HELLO, "stream_format": "audio", "response_format": "pcm"}
    )
    assert sp.status_code == 200 and sp.content == pcm


def test_speech_seed_changes_audio_and_speed_changes_length(http: httpx.Client) -> None:
    a = wav_info(http.post("/v1/audio/speech", json=HELLO).content)[3]
    b = wav_info(http.post("/v1/audio/speech", json={**HELLO, "seed": 4}).content)[3]
    fast = wav_info(http.post("/v1/audio/speech", json={**HELLO, "speed": 2.0}).content)[3]
    assert a != b
    assert len(fast) < 0.75 * len(a)


def test_voices(http: httpx.Client) -> None:
    r = http.get("/v1/audio/voices")
    assert r.status_code == 200 and "joe" in r.json()["voices"]
    assert http.get("/v1/audio/voices", params={"model": "piper"}).json()["voices"] == [
        "joe",
        "en_US-joe-medium",
    ]
    other_task = http.get("/v1/audio/voices", params={"model": "whisper"})
    assert other_task.status_code == 400 and "serves task 'asr'" in other_task.text
    assert http.post("/v1/audio/speech", json={**HELLO, "voice": "joe"}).status_code == 200


# ---- transcriptions (whisper is slow on numpy: each format is one real call) ------------


def test_transcription_multipart_verbose_json(http: httpx.Client, hello_wav: bytes) -> None:
    r = http.post(
        "/v1/audio/transcriptions",
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={"model": "whisper", "response_format": "verbose_json"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == "Hello world."
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert abs(body["duration"] - 0.824) < 0.01
    assert len(body["segments"]) == 1
    seg = body["segments"][0]
    assert seg["text"].strip() == "Hello world." and 0 <= seg["start"] < seg["end"]
    # OpenAI's TranscriptionSegment: its index, its window's start in 10 ms frames, its tokens
    assert seg["id"] == 0 and seg["seek"] == 0
    assert seg["tokens"] and all(isinstance(t, int) for t in seg["tokens"])


def test_transcription_json_base64_srt(http: httpx.Client, hello_wav: bytes) -> None:
    r = http.post(
        "/v1/audio/transcriptions",
        json={"model": "whisper", "audio_base64": b64(hello_wav), "response_format": "srt"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-subrip")
    lines = r.text.split("\n")
    assert lines[0] == "1"
    start, arrow, end = lines[1].split(" ")
    assert arrow == "-->" and start.startswith("00:00:0") and "," in start and "," in end
    assert lines[2] == "Hello world."


def test_transcription_text_and_vtt(http: httpx.Client, hello_wav: bytes) -> None:
    files = {"file": ("hello.wav", hello_wav, "audio/wav")}
    text = http.post(
        "/v1/audio/transcriptions",
        files=files,
        data={"model": "whisper", "response_format": "text"},
    )
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    assert text.text == "Hello world.\n"
    vtt = http.post(
        "/v1/audio/transcriptions", files=files, data={"model": "whisper", "response_format": "vtt"}
    )
    assert vtt.status_code == 200 and vtt.headers["content-type"].startswith("text/vtt")
    lines = vtt.text.split("\n")
    assert lines[:2] == ["WEBVTT", ""]
    assert re.fullmatch(r"00:00:00\.\d{3} --> 00:00:0\d\.\d{3}", lines[2]), lines[2]
    assert lines[3] == "Hello world."


def test_transcription_sse_stream(http: httpx.Client, hello_wav: bytes) -> None:
    with http.stream(
        "POST",
        "/v1/audio/transcriptions",
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={"model": "whisper", "stream": "true"},
    ) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(s.read().decode())
    assert events[-1] == "[DONE]"
    done = events[-2]
    assert done["type"] == "transcript.text.done" and done["text"] == "Hello world."
    deltas = [e for e in events[:-2] if e["type"] == "transcript.text.delta"]
    assert deltas and "".join(e["delta"] for e in deltas).strip() == "Hello world."


# ---- voice activity ---------------------------------------------------------------------


def test_vad_multipart_json_and_stream(http: httpx.Client, hello_wav: bytes) -> None:
    files = {"file": ("hello.wav", hello_wav, "audio/wav")}
    r = http.post("/v1/audio/vad", files=files, data={"model": "silero_vad"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sample_rate"] == 16000 and abs(body["duration"] - 0.8243) < 1e-3
    assert len(body["segments"]) == 1
    seg = body["segments"][0]
    assert 0 <= seg["start"] < 0.2 and 0.6 < seg["end"] <= 0.83
    assert "probabilities" not in body

    p = http.post(
        "/v1/audio/vad", files=files, data={"model": "silero_vad", "include_probabilities": "true"}
    ).json()
    probs = p["probabilities"]
    assert (
        len(probs) == -(-13188 // 512) and all(0.0 <= x <= 1.0 for x in probs) and max(probs) > 0.5
    )
    assert p["segments"] == body["segments"]

    with http.stream(
        "POST", "/v1/audio/vad", files=files, data={"model": "silero_vad", "stream": "true"}
    ) as s:
        assert s.status_code == 200
        events = parse_sse(s.read().decode())
    assert events[-2:] == [{"type": "vad.done"}, "[DONE]"]
    kinds = [e["type"] for e in events[:-2]]
    assert kinds[0] == "vad.speech.start" and kinds.count("vad.speech.start") >= 1
    assert events[0]["time"] == seg["start"] or abs(events[0]["time"] - seg["start"]) < 0.1


def test_vad_server_local_path_inside_roots(http: httpx.Client, main_server: LiveServer) -> None:
    from tests.server.live import DATA

    r = http.post(
        "/v1/audio/vad",
        json={"model": "silero_vad", "audio_path": str(DATA / "audio" / "hello.wav")},
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["segments"]) == 1


# ---- generic tasks ----------------------------------------------------------------------


def test_tasks_run_tts_matches_speech(http: httpx.Client) -> None:
    speech = http.post("/v1/audio/speech", json=HELLO).content
    r = http.post(
        "/v1/tasks/run", json={"model": "piper", "request": {"text": "Hello.", "seed": 3}}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sample_rate"] == 22050 and base64.b64decode(body["audio"]) == speech


def test_tasks_batch_results_by_index(http: httpx.Client, hello_wav: bytes) -> None:
    silence = io.BytesIO()
    with wave.open(silence, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 8000)
    reqs = [
        {"audio_base64": b64(hello_wav)},
        {"audio_base64": b64(silence.getvalue())},
        {"audio_base64": b64(hello_wav)},
    ]
    with http.stream(
        "POST", "/v1/tasks/batch", json={"model": "silero_vad", "requests": reqs}
    ) as s:
        assert s.status_code == 200
        events = parse_sse(s.read().decode())
    assert events[-1] == "[DONE]"
    assert events[-2]["type"] == "task.batch.done" and events[-2]["result_count"] == 3
    results = [e for e in events[:-2] if e["type"] == "task.batch.result"]
    assert [e["index"] for e in results] == [0, 1, 2]
    single = http.post("/v1/tasks/run", json={"model": "silero_vad", "request": reqs[0]}).json()
    assert (
        results[0]["result"]["segments"] == single["segments"] == results[2]["result"]["segments"]
    )
    assert results[1]["result"]["segments"] == []


def test_tasks_stream_collects_chunks(http: httpx.Client) -> None:
    r = http.post(
        "/v1/tasks/stream", json={"model": "piper", "request": {"text": "Hi. Yes.", "seed": 1}}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    events = body["events"]
    assert len(events) == 2  # one chunk per sentence
    assert [e["index"] for e in events] == [0, 1]
    assert [e["is_final"] for e in events] == [False, True]
    assert all(e["sample_rate"] == 22050 and base64.b64decode(e["audio"]) for e in events)
    assert body["result"]["timing"]["ttft_ms"] > 0
