"""Every whole response says where its time went: the ``Server-Timing`` header and the JSON
``timing`` fields (queue, load, run), on a live server with the real models."""

from __future__ import annotations

import re

import httpx

TIMING = re.compile(r"^queue;dur=([0-9.e+-]+), load;dur=([0-9.e+-]+), run;dur=([0-9.e+-]+)$")


def phases(response: httpx.Response) -> tuple[float, float, float]:
    """(queue, load, run) in ms from the response's Server-Timing header."""
    assert response.status_code == 200, response.text
    match = TIMING.match(response.headers["server-timing"])
    assert match, response.headers["server-timing"]
    queue, load, run = (float(g) for g in match.groups())
    assert queue >= 0 and load >= 0 and run > 0
    return queue, load, run


def test_json_answers_carry_the_same_phases_as_their_header(
    http: httpx.Client, hello_wav: bytes
) -> None:
    files = {"file": ("hello.wav", hello_wav, "audio/wav")}
    answers = [
        http.post("/v1/audio/vad", files=files, data={"model": "silero_vad"}),
        http.post("/v1/audio/transcriptions", files=files, data={"model": "whisper"}),
        http.post(
            "/v1/audio/speech", json={"model": "piper", "input": "Hi.", "response_format": "json"}
        ),
        http.post("/v1/tasks/run", json={"model": "piper", "request": {"text": "Hi."}}),
    ]
    for r in answers:
        queue, load, run = phases(r)
        timing = r.json()["timing"]
        assert (timing["queue_ms"], timing["load_ms"], timing["run_ms"]) == (queue, load, run)
        assert queue + load + run <= timing["wall_ms"] + 1e-3


def test_audio_and_text_answers_carry_the_header(http: httpx.Client, hello_wav: bytes) -> None:
    wav = http.post("/v1/audio/speech", json={"model": "piper", "input": "Hi."})
    _, _, run = phases(wav)
    assert run <= float(wav.headers["x-voxpool-wall-ms"]) + 1e-3
    text = http.post(
        "/v1/audio/transcriptions",
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={"model": "whisper", "response_format": "text"},
    )
    phases(text)
    assert text.text == "Hello world.\n"
