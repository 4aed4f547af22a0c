"""The unmodified ``openai`` package against a live server."""

from __future__ import annotations

import io
import time
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


def test_models_retrieve_is_the_list_row(client: openai.OpenAI, http: httpx.Client) -> None:
    """``GET /v1/models/{id}``: the model's ``/v1/models`` row (whisper is idle: the counters
    hold still), and a 404 naming an unknown id."""
    model = client.models.retrieve("whisper")
    assert (model.id, model.object, model.owned_by) == ("whisper", "model", "voxpool")
    rows = {r["id"]: r for r in http.get("/v1/models").json()["data"]}
    assert http.get("/v1/models/whisper").json() == rows["whisper"]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert "unknown model id: 'no-such-model'" in str(missing.value)


def test_model_rows_carry_created(client: openai.OpenAI, http: httpx.Client) -> None:
    """OpenAI's Model has ``created``: the Unix time the model's configuration was
    registered (the server's start for configured models)."""
    started = time.time() - 3600.0  # the session's server started within the hour
    for row in http.get("/v1/models").json()["data"]:
        assert isinstance(row["created"], int) and started <= row["created"] <= time.time(), row
    assert client.models.retrieve("piper").created == http.get("/v1/models/piper").json()["created"]


def test_transcription_verbose_json_segments(client: openai.OpenAI) -> None:
    """OpenAI's TranscriptionSegment fields, with the transcriber's own values."""
    with open(HELLO_WAV, "rb") as f:
        result = client.audio.transcriptions.create(
            model="whisper", file=f, response_format="verbose_json"
        )
    assert result.text == "Hello world." and result.segments
    for index, seg in enumerate(result.segments):
        assert seg.id == index and seg.seek == 0  # one 30 s window, starting at frame 0
        assert seg.tokens and all(isinstance(t, int) for t in seg.tokens)
        assert seg.start < seg.end and seg.text.strip()
        assert seg.temperature == 0.0 and seg.compression_ratio > 0
        assert seg.avg_logprob < 0 and 0 <= seg.no_speech_prob <= 1
