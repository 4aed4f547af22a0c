"""The unmodified ``openai`` package against a live server."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server.live import HELLO_WAV, LiveServer


@pytest.fixture()
def client(main_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=main_server.url + "/v1", api_key="x", max_retries=0, timeout=180.0
    ) as c:
        yield c


def test_speech_create_wav(client: openai.OpenAI, http: httpx.Client) -> None:
    audio = client.audio.speech.create(
        model="piper", voice="joe", input="Hello.", response_format="wav"
    )
    data = audio.read()
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
        assert w.getnframes() > 22050 * 0.2
    direct = http.post(
        "/v1/audio/speech",
        json={"model": "piper", "voice": "joe", "input": "Hello.", "response_format": "wav"},
    )
    assert data == direct.content  # the default seed: the same request gives the same bytes


def test_speech_streaming_response(client: openai.OpenAI, http: httpx.Client) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="piper", voice="joe", input="Hello there.", response_format="pcm"
    ) as response:
        assert response.http_response.status_code == 200
        chunks = list(response.iter_bytes())
    pcm = b"".join(chunks)
    direct = http.post(
        "/v1/audio/speech",
        json={"model": "piper", "input": "Hello there.", "response_format": "pcm"},
    )
    assert pcm == direct.content and len(pcm) > 0


def test_speech_error_maps_to_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.speech.create(model="piper", voice="nobody", input="Hi.")  # alloy: an alias
    assert "unknown voice" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="no-such-model", voice="joe", input="Hi.")


def test_transcription_file_upload(client: openai.OpenAI) -> None:
    with open(HELLO_WAV, "rb") as f:
        result = client.audio.transcriptions.create(model="whisper", file=f)
    assert result.text == "Hello world."


def test_transcription_stream(client: openai.OpenAI) -> None:
    with open(HELLO_WAV, "rb") as f:
        stream = client.audio.transcriptions.create(model="whisper", file=f, stream=True)
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.text.delta" in kinds
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert deltas.strip() == "Hello world."
    assert events[-1].text == "Hello world."
