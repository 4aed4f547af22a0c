"""The reliability suite's shared pieces: its config, WAV builders, the health check,
and the per-request memory bound of docs/server.md ("Limits")."""

from __future__ import annotations

import io
import json
import struct
import wave
from pathlib import Path
from typing import Any

import attrs
import httpx
import numpy as np

from tests.server.live import DATA, LiveServer, b64

CONFIG = Path(__file__).resolve().parent / "server.json"
HELLO_PATH = str(DATA / "audio" / "hello.wav")
MIB = 1024 * 1024


@attrs.frozen
class Limits:
    """The reliability server's limits (tests/reliability/server.json)."""

    body: int
    audio_seconds: float
    speech_seconds: float
    sentence_seconds: float
    seconds_per_char: float
    input_chars: int

    @classmethod
    def from_config(cls, path: Path) -> Limits:
        raw = json.loads(path.read_text())
        return cls(
            body=raw["max_request_body_bytes"],
            audio_seconds=raw["max_audio_seconds"],
            speech_seconds=raw["max_speech_seconds"],
            sentence_seconds=raw["max_sentence_seconds"],
            seconds_per_char=raw["speech_seconds_per_char"],
            input_chars=raw["max_input_chars"],
        )


def pcm_wav(samples: np.ndarray, rate: int = 16000, width: int = 2, channels: int = 1) -> bytes:
    """A PCM WAV of ``samples`` (float in [-1, 1], interleaved when ``channels`` > 1)."""
    if width == 1:
        raw = (np.clip(samples, -1, 1) * 127 + 128).astype(np.uint8).tobytes()
    else:
        raw = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return buf.getvalue()


def noise_wav(seconds: float, rate: int = 16000, width: int = 2, seed: int = 0) -> bytes:
    """Quiet noise: the models work on it (no speech found) at a predictable cost."""
    rng = np.random.default_rng(seed)
    return pcm_wav(rng.standard_normal(int(seconds * rate)) * 0.05, rate, width)


def riff(*chunks: tuple[bytes, bytes], riff_size: int | None = None) -> bytes:
    """A RIFF/WAVE file of raw ``(id, payload)`` chunks (sizes from the payloads)."""
    body = b"WAVE" + b"".join(
        cid + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1) for cid, data in chunks
    )
    return b"RIFF" + struct.pack("<I", len(body) if riff_size is None else riff_size) + body


def fmt(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16) -> tuple[bytes, bytes]:
    block = channels * max(bits // 8, 1)
    return b"fmt ", struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)


def assert_healthy(server: LiveServer, client: httpx.Client, hello_wav: bytes) -> None:
    """The server answers /health, every model is idle, and one valid request per route
    works. (That the event loop is never blocked by a decode is tested without timing in
    tests/reliability/test_validators.py; no verdict here depends on how fast this machine is.)"""
    assert client.get("/health", timeout=60.0).json()["status"] == "ok"
    for row in client.get("/v1/models").json()["data"]:
        server.wait_idle(row["id"])
    r = client.post("/v1/audio/speech", json={"model": "piper", "input": "Still here."})
    assert r.status_code == 200 and r.content[:4] == b"RIFF", r.text[:300]
    files = {"file": ("hello.wav", hello_wav, "audio/wav")}
    r = client.post("/v1/audio/transcriptions", files=files, data={"model": "whisper"})
    assert r.status_code == 200 and "hello" in r.json()["text"].lower(), r.text[:300]
    r = client.post("/v1/audio/vad", json={"model": "silero_vad", "audio_base64": b64(hello_wav)})
    assert r.status_code == 200 and r.json()["segments"], r.text[:300]
    r = client.post(
        "/v1/tasks/run", json={"model": "silero_vad", "request": {"audio_path": HELLO_PATH}}
    )
    assert r.status_code == 200, r.text[:300]


def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of a JSON error response (AssertionError if the shape is wrong)."""
    assert resp.headers.get("content-type", "").startswith("application/json"), (
        resp.status_code,
        resp.text[:300],
    )
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"], (
        body
    )
    assert error.get("type") in {
        "invalid_request_error",
        "not_found_error",
        "permission_error",
        "server_busy",
    }, body
    return dict(error)


@attrs.frozen
class Load:
    """What a request asks of the server, for the memory bound: body bytes and how it is
    encoded, JSON containers, input audio seconds, output speech seconds, the longest sentence,
    and whether Whisper decodes it in VAD pieces (``vad_chunking``)."""

    body: int
    multipart: bool = False
    containers: int = 0
    audio_in: float = 0.0
    speech_out: float = 0.0
    sentence: float = 0.0
    model: str = ""
    chunked: bool = False


def memory_bound(load: Load) -> float:
    """Bytes a request may add to the server's resident memory (docs/server.md, "Limits").

    48 MiB fixed + body + decoded audio + the model's working set:
    JSON ``5 B + 80 * containers``, multipart ``2 B``; audio ``0.75 B`` (base64) +
    ``64 KB/s`` (float32 at 16 kHz) + 16 MiB resampling blocks; Whisper 32 MiB +
    1 MiB/s of input (with ``vad_chunking``, 64 MiB more for each of its 8 pieces in flight),
    VAD 0.3 MiB/s, Piper 24 MiB/s of its longest sentence + 0.5 MiB/s of output.
    """
    out = 48.0 * MIB
    out += 2 * load.body if load.multipart else 5 * load.body + 80 * load.containers
    if load.audio_in:
        out += 0.75 * load.body + 64_000 * load.audio_in + 16 * MIB
    if load.model == "asr":
        out += 32 * MIB + MIB * load.audio_in
        if load.chunked:
            out += 8 * 64 * MIB
    elif load.model == "vad":
        out += 0.3 * MIB * load.audio_in
    elif load.model == "tts":
        out += 24 * MIB * load.sentence + 0.5 * MIB * load.speech_out
    return out
