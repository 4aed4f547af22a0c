"""Cross-request batching through the real server: ``"batching": true`` models (issue #14).

A second ``voxpool serve`` runs whisper and silero_vad with batching on; every
result must equal what the unbatched main server (tests/data/server/main.json)
returns for the same input, whether the requests ran alone or together, and a
client that leaves mid-batch must give its slot back.
"""

from __future__ import annotations

import io
import json
import socket
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.server.live import DATA, LiveServer, parse_sse

WHISPER_DATA = Path(__file__).resolve().parents[1] / "data" / "whisper"
FILES = ("short", "weather", "meeting", "recipe")
VAD_TOLERANCE = 1e-5
GUARD_S = 120.0
"""A hang guard on any single wait, never a verdict."""
PIPER_TOLERANCE_LSB = 4
"""Batched Piper audio within 1e-4 of the session's (backends/piper: measured 6e-6), in 16-bit
samples: a few least significant bits."""
TEXTS = (
    "Hello there.",
    "The weather today will be mostly sunny.",
    "Please turn off the lights in the kitchen before you leave.",
    "One, two, three.",
)


@pytest.fixture(scope="module")
def batched(server_logs: Path) -> Iterator[LiveServer]:
    server = LiveServer(DATA / "batched.json", server_logs).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()[-4000:]


def transcribe(client: httpx.Client, name: str, **fields: str) -> httpx.Response:
    audio = (WHISPER_DATA / f"{name}.wav").read_bytes()
    return client.post(
        "/v1/audio/transcriptions",
        files={"file": (f"{name}.wav", audio, "audio/wav")},
        data={"model": "whisper", "response_format": "verbose_json", **fields},
    )


def vad(client: httpx.Client, name: str, model: str = "silero_vad") -> httpx.Response:
    audio = (WHISPER_DATA / f"{name}.wav").read_bytes()
    return client.post(
        "/v1/audio/vad",
        files={"file": (f"{name}.wav", audio, "audio/wav")},
        data={"model": model, "include_probabilities": "true"},
    )


def without_timing(event: Any) -> Any:
    """An SSE event without its wall-clock ``timing`` (the only field that may differ)."""
    if isinstance(event, dict):
        return {k: v for k, v in event.items() if k != "timing"}
    return event


def batch_counters(server: LiveServer, model: str) -> tuple[float, float]:
    """The model's ``voxpool_batch_steps_total`` and ``voxpool_batch_members_total``."""
    text = httpx.get(server.url + "/metrics", timeout=10.0).text
    values = {}
    for name in ("voxpool_batch_steps_total", "voxpool_batch_members_total"):
        line = next(x for x in text.splitlines() if x.startswith(f'{name}{{model="{model}"}}'))
        values[name] = float(line.split()[-1])
    return values["voxpool_batch_steps_total"], values["voxpool_batch_members_total"]


def seg_key(segment: dict[str, Any]) -> tuple[Any, ...]:
    """What a segment decides: its text and times (from its tokens and timestamp tokens)."""
    return segment["text"], segment["start"], segment["end"]


def together(server: LiveServer, call: Any, names: tuple[str, ...]) -> list[httpx.Response]:
    """Send one request per name at once (a wave), each on its own connection."""

    def one(name: str) -> httpx.Response:
        with server.client() as client:
            return call(client, name)  # type: ignore[no-any-return]

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def test_vad_chunking_on_batched_and_unbatched_models_agree(
    batched: LiveServer, http: httpx.Client
) -> None:
    """A long file cut at silences (issue #14): the batching model runs the pieces in its engine,
    the unbatched one in an engine of its own; the same batches, the same transcript."""
    with batched.client() as client:
        ours = transcribe(client, "story", vad_chunking="true")
    theirs = transcribe(http, "story", vad_chunking="true")
    assert ours.status_code == theirs.status_code == 200, (ours.text, theirs.text)
    assert ours.json()["text"] == theirs.json()["text"]
    assert ours.json()["segments"] == theirs.json()["segments"]
    assert ours.json()["segments"] != transcribe(http, "story").json()["segments"]


def test_models_list_shows_batching(batched: LiveServer) -> None:
    assert batched.model("whisper")["batching"] is True
    assert batched.model("silero_vad")["batching"] is True


def test_batched_transcriptions_equal_unbatched(batched: LiveServer, http: httpx.Client) -> None:
    got = together(batched, transcribe, FILES)
    for name, response in zip(FILES, got, strict=True):
        assert response.status_code == 200, response.text
        reference = transcribe(http, name)
        assert reference.status_code == 200, reference.text
        ours, theirs = response.json(), reference.json()
        assert ours["text"] == theirs["text"], name
        assert [seg_key(s) for s in ours["segments"]] == [seg_key(s) for s in theirs["segments"]], (
            name
        )
    row = batched.wait_for("whisper", lambda r: r["active_slots"] == 0)
    assert row["queued_requests"] == 0
    # the wave shared its decoder steps: more members were advanced than steps were run
    steps, members = batch_counters(batched, "whisper")
    assert members > steps > 0


def test_batched_vad_equals_unbatched(batched: LiveServer, http: httpx.Client) -> None:
    got = together(batched, vad, FILES)
    for name, response in zip(FILES, got, strict=True):
        assert response.status_code == 200, response.text
        reference = vad(http, name)
        ours, theirs = response.json(), reference.json()
        assert ours["segments"] == theirs["segments"], name
        assert len(ours["probabilities"]) == len(theirs["probabilities"])
        worst = max(
            abs(a - b) for a, b in zip(ours["probabilities"], theirs["probabilities"], strict=True)
        )
        assert worst <= VAD_TOLERANCE, (name, worst)


def speak(client: httpx.Client, text: str) -> np.ndarray:
    r = client.post("/v1/audio/speech", json={"model": "piper", "input": text, "seed": 7})
    assert r.status_code == 200, r.text
    with wave.open(io.BytesIO(r.content)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int32)


def test_batched_speech_equals_unbatched(batched: LiveServer, http: httpx.Client) -> None:
    got = together(batched, speak, TEXTS)
    for text, ours in zip(TEXTS, got, strict=True):
        theirs = speak(http, text)  # the main server's piper: the same voice, unbatched
        assert ours.shape == theirs.shape, text
        assert int(np.abs(ours - theirs).max()) <= PIPER_TOLERANCE_LSB, text
    steps, members = batch_counters(batched, "piper")
    assert members > steps > 0


def test_batched_streams_equal_unbatched(batched: LiveServer, http: httpx.Client) -> None:
    def events(client: httpx.Client, model: str, route: str, name: str) -> list[Any]:
        audio = (WHISPER_DATA / f"{name}.wav").read_bytes()
        with client.stream(
            "POST",
            route,
            files={"file": (f"{name}.wav", audio, "audio/wav")},
            data={"model": model, "stream": "true"},
        ) as s:
            assert s.status_code == 200
            return [without_timing(e) for e in parse_sse(s.read().decode())]

    with batched.client() as client:
        ours = events(client, "whisper", "/v1/audio/transcriptions", "weather")
        vad_ours = events(client, "vad_stream", "/v1/audio/vad", "meeting")
    theirs = events(http, "whisper", "/v1/audio/transcriptions", "weather")
    vad_theirs = events(http, "silero_vad", "/v1/audio/vad", "meeting")
    assert ours == theirs
    assert vad_ours == vad_theirs


def test_a_client_leaving_mid_batch_gives_its_slot_back(batched: LiveServer) -> None:
    audio = (WHISPER_DATA / "story.wav").read_bytes()
    with (
        batched.client() as client,
        client.stream(
            "POST",
            "/v1/audio/transcriptions",
            files={"file": ("story.wav", audio, "audio/wav")},
            data={"model": "whisper", "stream": "true"},
        ) as s,
    ):
        assert s.status_code == 200
        first = next(s.iter_lines())  # the first segment: the member decodes in the batch
        assert first.startswith("data:")
    # the connection is closed: the member leaves at a step boundary, the slot comes back
    batched.wait_for("whisper", lambda r: r["active_slots"] == 0, timeout=120.0)
    with batched.client() as client:
        again = transcribe(client, "short")
    assert again.status_code == 200, again.text


def test_a_stream_whose_client_stops_reading_is_held_until_it_reads(batched: LiveServer) -> None:
    """A batched Piper stream to a client that reads nothing decodes a few sentences past what
    the kernel's buffers took and then waits (``held_members``), while the model serves
    others; once the client reads, it goes on to its end: the audio a client that read all
    along got (within the batch's tolerance: other members may share its steps)."""
    text = " ".join(f"This is sentence number {i} of a stream nobody reads." for i in range(12))
    body = {"model": "piper_stream", "input": text, "stream_format": "audio",
            "response_format": "pcm", "seed": 3}  # fmt: skip
    with batched.client() as client:
        expected = client.post("/v1/audio/speech", json=body).content
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(GUARD_S)
    s.connect(("127.0.0.1", batched.port))
    payload = json.dumps(body).encode()
    s.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    try:
        batched.wait_for("piper_stream", lambda r: r["held_members"] == 1, timeout=GUARD_S)
        with batched.client() as client:  # the model still serves others
            other = client.post("/v1/audio/speech", json={**body, "input": "Hello there."})
        assert other.status_code == 200 and other.content
        assert batched.model("piper_stream")["held_members"] == 1
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    finally:
        s.close()
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    got = np.frombuffer(dechunk(chunked), "<i2").astype(np.int32)
    want = np.frombuffer(expected, "<i2").astype(np.int32)
    assert len(got) == len(want) and np.abs(got - want).max() <= PIPER_TOLERANCE_LSB
    row = batched.wait_for("piper_stream", lambda r: r["active_slots"] == 0)
    assert row["held_members"] == 0


def dechunk(data: bytes) -> bytes:
    """An HTTP/1.1 chunked body's bytes (to its last, empty chunk)."""
    out = b""
    while True:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, data = out + data[:n], data[n + 2 :]
