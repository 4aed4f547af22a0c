"""Issue #11 section 2: each route driven at its limits stays within the documented memory bound.

For every case the server's peak resident memory (``VmHWM``, reset through
``/proc/<pid>/clear_refs`` just before the request) minus its resident memory
at that moment must be at most :func:`~tests.reliability.cases.memory_bound`
of the request. Each model is warmed first, so its weights are not counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from tests.ci import skip_or_fail
from tests.models.whisper_audio import load_wav
from tests.reliability.cases import (
    MIB,
    Limits,
    Load,
    fmt,
    memory_bound,
    noise_wav,
    pcm_wav,
    riff,
)
from tests.server.live import HELLO_WAV, LiveServer, b64

SENTENCE = "The quick brown fox jumps over the lazy dog near the river."
SHORTER = "The quick brown fox jumps over the lazy dog."
FIGURES: list[str] = []


def vm(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak(pid: int) -> None:
    """Set ``VmHWM`` back to the current resident size (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@attrs.frozen
class MemoryCase:
    name: str
    path: str
    request: dict[str, Any]
    load: Load
    status: int = 200


def cases(limits: Limits) -> list[MemoryCase]:
    seconds = limits.audio_seconds - 0.1
    wav48 = noise_wav(seconds, 48000)  # at the audio limit, and near the body limit once in base64
    assert len(b64(wav48)) + 200 < limits.body
    wav8bit = noise_wav(seconds, 1000, 1)  # the most upsampling: 16 output samples per input byte
    header_only = riff(
        fmt(rate=1000, bits=8), (b"data", b"\x80" * (limits.body * 3 // 4 - 4096))
    )  # ~50 min of audio
    speech = " ".join([SENTENCE, SENTENCE, "Yes."])
    entries = [
        {"audio_base64": b64(noise_wav(limits.audio_seconds / 64 - 0.01, seed=i))}
        for i in range(64)
    ]
    per_entry = limits.audio_seconds / 64 - 0.01

    def js(body: Any) -> tuple[dict[str, Any], int]:
        content = json.dumps(body).encode()
        return {"content": content, "headers": {"content-type": "application/json"}}, len(content)

    def tts(name: str, path: str, body: dict[str, Any]) -> MemoryCase:
        request, size = js(body)
        return MemoryCase(
            name,
            path,
            request,
            Load(
                size,
                speech_out=limits.speech_seconds,
                sentence=limits.sentence_seconds,
                model="tts",
            ),
        )

    def audio(
        name: str,
        path: str,
        body: dict[str, Any],
        model: str,
        audio_in: float = seconds,
        status: int = 200,
    ) -> MemoryCase:
        request, size = js(body)
        return MemoryCase(name, path, request, Load(size, audio_in=audio_in, model=model), status)

    def form(name: str, path: str, fields: dict[str, str], data: bytes, model: str) -> MemoryCase:
        request = {"data": fields, "files": {"file": ("a.wav", data, "audio/wav")}}
        return MemoryCase(
            name,
            path,
            request,
            Load(len(data) + 1024, multipart=True, audio_in=seconds, model=model),
        )

    story = pcm_wav(load_wav("story.wav")[: int(seconds * 16000)])  # speech: one 29.9 s piece
    chunked, chunked_size = js(
        {"model": "whisper", "audio_base64": b64(story), "vad_chunking": True}
    )
    containers, ucs4 = (
        (b"[" + b"{}," * 499_999 + b"{}]"),
        ('{"model": "piper", "input": "\U0001f600' + "a" * (limits.body - 100) + '"}').encode(),
    )
    return [
        tts("speech-wav", "/v1/audio/speech", {"model": "piper", "input": speech}),
        tts(
            "speech-json",
            "/v1/audio/speech",
            {"model": "piper", "input": speech, "response_format": "json"},
        ),
        tts("speech-sse", "/v1/audio/speech", {"model": "piper", "input": speech, "stream": True}),
        tts(
            "speech-audio-stream",
            "/v1/audio/speech",
            {"model": "piper", "input": speech, "stream_format": "audio"},
        ),
        tts(
            "speech-one-long-sentence",
            "/v1/audio/speech",
            {"model": "piper", "input": SENTENCE[:-1] + " bank."},
        ),
        tts(
            "task-stream-tts", "/v1/tasks/stream", {"model": "piper", "request": {"input": speech}}
        ),
        tts(
            "task-batch-tts",
            "/v1/tasks/batch",
            {"model": "piper_batch", "requests": [{"input": SHORTER}] * 2},
        ),
        audio(
            "asr-json",
            "/v1/audio/transcriptions",
            {"model": "whisper", "audio_base64": b64(wav48)},
            "asr",
        ),
        MemoryCase(
            "asr-json-vad-chunking",
            "/v1/audio/transcriptions",
            chunked,
            Load(chunked_size, audio_in=seconds, model="asr", chunked=True),
        ),
        form(
            "asr-multipart-stream",
            "/v1/audio/transcriptions",
            {"model": "whisper", "stream": "true"},
            wav48,
            "asr",
        ),
        audio(
            "vad-json-probabilities",
            "/v1/audio/vad",
            {"model": "silero_vad", "audio_base64": b64(wav48), "include_probabilities": True},
            "vad",
        ),
        form(
            "vad-multipart-stream",
            "/v1/audio/vad",
            {"model": "silero_vad", "stream": "true"},
            wav48,
            "vad",
        ),
        audio(
            "vad-8bit-1kHz",
            "/v1/audio/vad",
            {"model": "silero_vad", "audio_base64": b64(wav8bit)},
            "vad",
        ),
        audio(
            "task-run-vad",
            "/v1/tasks/run",
            {"model": "silero_vad", "request": {"audio_base64": b64(wav48)}},
            "vad",
        ),
        audio(
            "task-batch-vad-64",
            "/v1/tasks/batch",
            {"model": "silero_vad", "requests": entries},
            "vad",
            per_entry * 64,
        ),
        audio(
            "refused-from-header",
            "/v1/audio/vad",
            {"model": "silero_vad", "audio_base64": b64(header_only)},
            "vad",
            0.0,
            400,
        ),
        MemoryCase(
            "json-1M-containers",
            "/v1/audio/speech",
            {"content": containers, "headers": {"content-type": "application/json"}},
            Load(len(containers), containers=1_000_000),
            400,
        ),
        MemoryCase(
            "json-ucs4-string",
            "/v1/audio/speech",
            {"content": ucs4, "headers": {"content-type": "application/json"}},
            Load(len(ucs4)),
            400,
        ),
    ]


@pytest.fixture(scope="module")
def warm(reliability_server: LiveServer, rel: httpx.Client) -> Iterator[int]:
    """Every model loaded (weights are not per-request memory); the server's pid."""
    assert reliability_server.proc is not None
    hello = HELLO_WAV.read_bytes()
    for body in ({"model": "piper", "input": "Hi."}, {"model": "piper_batch", "input": "Hi."}):
        assert rel.post("/v1/audio/speech", json=body).status_code == 200
    for model in ("whisper", "silero_vad"):
        assert (
            rel.post(
                "/v1/tasks/run", json={"model": model, "request": {"audio_base64": b64(hello)}}
            ).status_code
            == 200
        )
    try:
        reset_peak(reliability_server.proc.pid)
    except OSError as exc:  # not Linux, or /proc without clear_refs
        skip_or_fail(f"peak memory cannot be reset here: {exc}", needs="/proc/<pid>/clear_refs")
    yield reliability_server.proc.pid
    print("\nmemory at the limits (peak over the resident size before the request, and the bound):")
    print("\n".join(FIGURES))


@pytest.mark.parametrize(
    "case", cases(Limits.from_config(Path(__file__).with_name("server.json"))), ids=lambda c: c.name
)
def test_route_at_its_limits_stays_within_the_bound(
    warm: int, rel: httpx.Client, case: MemoryCase
) -> None:
    before = vm(warm)
    reset_peak(warm)
    resp = rel.post(case.path, **case.request)
    assert resp.status_code == case.status, (case.name, resp.text[:300])
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        assert '"type":"error"' not in resp.text, resp.text[:300]
    peak = vm(warm)["VmHWM"] - before["VmRSS"]
    bound = memory_bound(case.load)
    FIGURES.append(
        f"  {case.name:26s} {case.load.body / MIB:6.2f} MiB body  "
        f"peak +{peak / MIB:6.1f} MiB  bound {bound / MIB:6.1f} MiB"
    )
    assert peak <= bound, (case.name, peak / MIB, bound / MIB)
