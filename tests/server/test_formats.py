"""Audio formats and voice names on a live server, with plain HTTP (as curl) and the openai package.

Uploads in every format OpenAI's transcription endpoint takes (made with PyAV
from tests/data's WAV) are transcribed by Whisper; speech in every
``response_format`` (whole and streamed) goes back through the server's own
transcription and VAD routes: Whisper hears the words that were spoken, VAD
finds the speech. OpenAI's voice names are aliases of piper's voice.
"""

from __future__ import annotations

import base64
import io
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import pytest

from server.codecs import SPEECH_AUDIO
from server.config import OPENAI_VOICES
from tests.audio_files import OPENAI_UPLOADS, UPLOADS, encode_as
from tests.server.live import LiveServer, assert_error, parse_sse

TEXT = "The quick brown fox jumps over the lazy dog."
TWO = "The quick brown fox jumps over the lazy dog. Please call me back tomorrow morning."
SPEECH = {"model": "piper", "input": TEXT, "voice": "alloy", "seed": 5}
MAGIC = {"mp3": b"ID3", "opus": b"OggS", "aac": b"\xff\xf1", "flac": b"fLaC", "wav": b"RIFF"}
Format = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
FORMATS: list[Format] = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
assert list(SPEECH_AUDIO) == FORMATS


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def as_file(data: bytes, fmt: str, rate: int = 22050) -> bytes:
    """A speech answer as an uploadable file: PCM has no header, so it goes into a WAV."""
    if fmt != "pcm":
        return data
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data)
    return buf.getvalue()


def transcribe(http: httpx.Client, data: bytes, name: str) -> str:
    r = http.post(
        "/v1/audio/transcriptions", files={"file": (name, data)}, data={"model": "whisper"}
    )
    assert r.status_code == 200, r.text
    text: str = r.json()["text"]
    return text


def vad_segments(http: httpx.Client, data: bytes) -> list[dict[str, Any]]:
    """VAD over JSON (base64), so both upload paths see compressed audio."""
    r = http.post(
        "/v1/audio/vad",
        json={"model": "silero_vad", "audio_base64": base64.b64encode(data).decode()},
    )
    assert r.status_code == 200, r.text
    segments: list[dict[str, Any]] = r.json()["segments"]
    return segments


def assert_one_utterance(segments: list[dict[str, Any]], seconds: float) -> None:
    """VAD finds the speech: segments from near the start to near the end of the audio."""
    assert segments, "no speech found"
    assert segments[0]["start"] < 0.3
    assert segments[-1]["end"] > seconds - 0.5
    assert sum(s["end"] - s["start"] for s in segments) > 0.7 * seconds


@pytest.fixture()
def client(main_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=main_server.url + "/v1", api_key="x", max_retries=0, timeout=180.0
    ) as c:
        yield c


# ---- uploads --------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", OPENAI_UPLOADS)
def test_curl_uploads_every_openai_format(http: httpx.Client, hello_wav: bytes, ext: str) -> None:
    """``curl -F file=@hello.<ext> -F model=whisper``: 200 and the words."""
    assert transcribe(http, encode_as(hello_wav, ext), f"hello.{ext}") == "Hello world."


@pytest.mark.parametrize("ext", OPENAI_UPLOADS)
def test_openai_client_uploads_every_openai_format(
    client: openai.OpenAI, hello_wav: bytes, ext: str
) -> None:
    result = client.audio.transcriptions.create(
        model="whisper", file=(f"hello.{ext}", encode_as(hello_wav, ext))
    )
    assert result.text == "Hello world."


@pytest.mark.parametrize("ext", [e for e in UPLOADS if e not in OPENAI_UPLOADS])
def test_more_formats_reach_vad_by_json_and_tasks(
    http: httpx.Client, hello_wav: bytes, ext: str
) -> None:
    """AAC (ADTS), Vorbis in Ogg, FLAC in Matroska, AIFF: JSON base64 on the VAD route and
    a generic task; the file name plays no part."""
    data = encode_as(hello_wav, ext)
    assert_one_utterance(vad_segments(http, data), 0.82)
    r = http.post(
        "/v1/tasks/run",
        json={"model": "silero_vad", "request": {"audio_base64": base64.b64encode(data).decode()}},
    )
    assert r.status_code == 200 and r.json()["segments"], r.text


def test_the_file_name_is_not_the_format(http: httpx.Client, hello_wav: bytes) -> None:
    """The content decides: an Ogg file named .wav is decoded as Ogg, a WAV named .mp3 as WAV."""
    assert transcribe(http, encode_as(hello_wav, "ogg"), "hello.wav") == "Hello world."
    assert vad_segments(http, hello_wav)  # and a WAV uploaded under any name
    r = http.post(
        "/v1/audio/vad", files={"file": ("a.mp3", hello_wav)}, data={"model": "silero_vad"}
    )
    assert r.status_code == 200 and r.json()["segments"]


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("a.mp3", b"ID3\x03\x00fake mp3", "could not be read as mp3"),
        ("a.m4a", b"\x00\x00\x00\x1cftypM4A " + b"\x00" * 64, "could not be read as mov"),
        ("a.webm", bytes(range(256)), "not a WAV file or any other supported format"),
        ("a.m3u8", b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n", "not a WAV file"),
    ],
)
def test_undecodable_uploads_are_400(
    http: httpx.Client, name: str, data: bytes, message: str
) -> None:
    for route, model in (("transcriptions", "whisper"), ("vad", "silero_vad")):
        r = http.post(f"/v1/audio/{route}", files={"file": (name, data)}, data={"model": model})
        assert_error(r, 400, "invalid_request_error", message)


def test_a_truncated_upload_is_400_or_its_decodable_part(
    http: httpx.Client, hello_wav: bytes
) -> None:
    data = encode_as(hello_wav, "m4a")
    r = http.post(
        "/v1/audio/vad",
        files={"file": ("a.m4a", data[: len(data) // 2])},
        data={"model": "silero_vad"},
    )
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert_error(r, 400, "invalid_request_error", "audio")


# ---- speech ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_speech_round_trip_every_format(http: httpx.Client, fmt: str) -> None:
    """piper -> ``fmt`` -> the server's own decoder: Whisper hears the words, VAD the speech."""
    r = http.post("/v1/audio/speech", json={**SPEECH, "response_format": fmt})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == SPEECH_AUDIO[fmt].content_type
    rate = int(r.headers["x-voxpool-sample-rate"])
    assert rate == (48000 if fmt == "opus" else 22050)
    seconds = float(r.headers["x-voxpool-audio-duration-ms"]) / 1000
    if fmt in MAGIC:
        assert r.content.startswith(MAGIC[fmt])
    else:
        assert len(r.content) == round(seconds * 22050) * 2  # bare 16-bit samples
    data = as_file(r.content, fmt)
    assert words(transcribe(http, data, f"speech.{fmt}")) == words(TEXT)
    assert_one_utterance(vad_segments(http, data), seconds)


@pytest.mark.parametrize("fmt", FORMATS)
def test_streamed_speech_every_format(http: httpx.Client, fmt: str) -> None:
    """``stream_format: audio``: one playable stream, a piece per sentence, the same words."""
    body = {**SPEECH, "input": TWO, "response_format": fmt, "stream_format": "audio"}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == SPEECH_AUDIO[fmt].content_type
        assert r.headers["x-voxpool-sample-rate"] == ("48000" if fmt == "opus" else "22050")
        pieces = list(r.iter_raw())
    data = b"".join(pieces)
    assert len(pieces) >= 2  # the first sentence left before the second was synthesized
    if fmt in MAGIC:
        assert data.startswith(MAGIC[fmt])
    whole = http.post("/v1/audio/speech", json={**body, "stream_format": None})
    if fmt in ("pcm", "aac"):
        assert data == whole.content  # the same samples (ADTS: the same frames)
    if fmt == "wav":
        assert data[44:] == whole.content[44:]
    heard = transcribe(http, as_file(data, fmt), f"stream.{fmt}")
    assert words(heard) == words(TWO)
    assert vad_segments(http, as_file(data, fmt))


@pytest.mark.parametrize("fmt", ["mp3", "opus"])
def test_sse_deltas_carry_the_format(http: httpx.Client, fmt: str) -> None:
    body = {**SPEECH, "input": TWO, "response_format": fmt, "stream": True}
    r = http.post("/v1/audio/speech", json=body)
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]" and events[-2]["type"] == "speech.audio.done"
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-2])
    raw = http.post("/v1/audio/speech", json={**body, "stream": False, "stream_format": "audio"})
    assert data == raw.content  # the raw stream's bytes, in events
    assert vad_segments(http, data)


@pytest.mark.parametrize("fmt", FORMATS)
def test_openai_client_speech_every_format(
    client: openai.OpenAI, http: httpx.Client, fmt: Format
) -> None:
    """The unchanged client with an OpenAI voice name gets the bytes plain HTTP gets."""
    got = client.audio.speech.create(
        model="piper", voice="alloy", input=TEXT, response_format=fmt
    ).read()
    direct = http.post(
        "/v1/audio/speech",
        json={"model": "piper", "voice": "joe", "input": TEXT, "response_format": fmt},
    )
    assert got == direct.content and got  # every encoder is deterministic
    with client.audio.speech.with_streaming_response.create(
        model="piper", voice="nova", input=TWO, response_format=fmt, stream_format="audio"
    ) as response:
        assert response.http_response.headers["content-type"] == SPEECH_AUDIO[fmt].content_type
        streamed = b"".join(response.iter_bytes())
    if fmt in MAGIC:
        assert streamed.startswith(MAGIC[fmt])
    assert vad_segments(http, as_file(streamed, fmt))


def test_the_default_format_is_wav(client: openai.OpenAI) -> None:
    """The openai package sends no response_format unless asked; voxpool answers WAV (docs)."""
    r = client.audio.speech.with_raw_response.create(model="piper", voice="alloy", input="Hi.")
    assert "response_format" not in json.loads(r.http_request.content)
    assert r.headers["content-type"] == "audio/wav"
    assert r.content.startswith(b"RIFF")


# ---- voices ---------------------------------------------------------------------------------


def test_voices_lists_voices_and_aliases(http: httpx.Client) -> None:
    one = http.get("/v1/audio/voices", params={"model": "piper"}).json()
    assert one["voices"] == ["joe", "en_US-joe-medium"]
    assert one["aliases"] == {name: "joe" for name in (*OPENAI_VOICES, "default")}
    every = http.get("/v1/audio/voices").json()
    assert "joe" in every["voices"]
    assert every["models"]["piper"] == one and every["models"]["tts1"] == one
    other_task = http.get("/v1/audio/voices", params={"model": "whisper"})
    assert_error(other_task, 400, "invalid_request_error", "serves task 'asr', not 'tts'")
    missing = http.get("/v1/audio/voices", params={"model": "nope"})
    assert missing.status_code == 404


def test_every_openai_voice_name_speaks(http: httpx.Client) -> None:
    want = http.post("/v1/audio/speech", json={**SPEECH, "input": "Hi.", "voice": "joe"}).content
    for name in (*OPENAI_VOICES, "default"):
        r = http.post("/v1/audio/speech", json={**SPEECH, "input": "Hi.", "voice": name})
        assert r.status_code == 200 and r.content == want, name
    voice_object = {**SPEECH, "input": "Hi.", "voice": {"id": "alloy"}}  # OpenAI's custom form
    assert http.post("/v1/audio/speech", json=voice_object).content == want


def test_unknown_voices_are_still_400(http: httpx.Client, client: openai.OpenAI) -> None:
    for voice in ("nobody", "Alloy", 5, {"id": "nobody"}):
        r = http.post("/v1/audio/speech", json={**SPEECH, "voice": voice})
        error = assert_error(r, 400, "invalid_request_error", "unknown voice")
        assert "alloy" in error["message"]  # the aliases are listed
    with pytest.raises(openai.BadRequestError, match="unknown voice 'nobody'"):
        client.audio.speech.create(model="piper", voice="nobody", input="Hi.")


def test_openapi_lists_formats_and_voice_names(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    op = doc["paths"]["/v1/audio/speech"]["post"]
    body = op["requestBody"]["content"]["application/json"]["schema"]
    variant = body["anyOf"][0] if "anyOf" in body else body
    props = variant["properties"]
    assert set(props["response_format"]["enum"]) >= set(FORMATS)
    assert set(props["voice"]["enum"]) == {"joe", "en_US-joe-medium", *OPENAI_VOICES, "default"}
    assert {f.content_type for f in SPEECH_AUDIO.values()} <= set(op["responses"]["200"]["content"])


# ---- a model with its own aliases, an mp3 default and a short audio limit -------------------


@pytest.fixture(scope="module")
def narrator(server_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    config = {
        "max_audio_seconds": 3,
        "models": [
            {
                "id": "narrator",
                "family": "piper",
                "mode": "streaming",
                "slots": 1,
                "voice_aliases": {"alloy": "en_US-joe-medium", "storyteller": "joe", "echo": None},
                "default_request_options": {"response_format": "mp3"},
            },
            {"id": "silero_vad", "family": "silero_vad", "slots": 1},
        ],
    }
    path = tmp_path_factory.mktemp("formats") / "narrator.json"
    path.write_text(json.dumps(config))
    server = LiveServer(path, server_logs).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()[-4000:]


def test_voice_aliases_from_server_json(narrator: LiveServer) -> None:
    with narrator.client() as http:
        listed = http.get("/v1/audio/voices", params={"model": "narrator"}).json()["aliases"]
        assert listed["alloy"] == "en_US-joe-medium" and listed["storyteller"] == "joe"
        assert "echo" not in listed and listed["nova"] == "joe"
        base = {"model": "narrator", "input": "Hi.", "seed": 1}
        for voice in ("alloy", "storyteller", "nova", "default"):
            assert http.post("/v1/audio/speech", json={**base, "voice": voice}).status_code == 200
        assert_error(
            http.post("/v1/audio/speech", json={**base, "voice": "echo"}),
            400,
            "invalid_request_error",
            "unknown voice 'echo'",
        )
        task: dict[str, Any] = {"model": "narrator", "request": {"input": "Hi.", "voice": "echo"}}
        assert_error(http.post("/v1/tasks/run", json=task), 400, "invalid_request_error", "echo")
        task["request"]["voice"] = "storyteller"
        assert http.post("/v1/tasks/run", json=task).status_code == 200
        doc = http.get("/openapi.json").json()
        schema = doc["paths"]["/v1/audio/speech"]["post"]["requestBody"]["content"]
        voices = schema["application/json"]["schema"]["anyOf"][0]["properties"]["voice"]["enum"]
        assert "storyteller" in voices and "echo" not in voices


def test_a_model_default_response_format(narrator: LiveServer) -> None:
    with narrator.client() as http:
        r = http.post("/v1/audio/speech", json={"model": "narrator", "input": "Hi."})
        assert r.headers["content-type"] == "audio/mpeg" and r.content.startswith(b"ID3")
        r = http.post(
            "/v1/audio/speech", json={"model": "narrator", "input": "Hi.", "response_format": "wav"}
        )
        assert r.headers["content-type"] == "audio/wav"


def long_wav(hello_wav: bytes, seconds: float) -> bytes:
    with wave.open(io.BytesIO(hello_wav)) as w:
        frames, rate = w.readframes(w.getnframes()), w.getframerate()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((frames * int(seconds / 0.8 + 1))[: int(seconds * rate) * 2])
    return buf.getvalue()


@pytest.mark.parametrize(
    ("ext", "message"),
    [
        ("m4a", r"the audio is 5\.\d s long"),  # the container says so: refused before decoding
        ("flac", r"the audio is 5\.\d s long"),
        ("webm", "the audio is more than 3 s long"),  # no duration: stopped while decoding
        ("wav", r"the audio is 5\.0 s long"),
    ],
)
def test_max_audio_seconds_holds_for_every_format(
    narrator: LiveServer, hello_wav: bytes, ext: str, message: str
) -> None:
    data = encode_as(long_wav(hello_wav, 5.0), ext)
    with narrator.client() as http:
        r = http.post(
            "/v1/audio/vad", files={"file": (f"a.{ext}", data)}, data={"model": "silero_vad"}
        )
        error = assert_error(r, 400, "invalid_request_error", "max_audio_seconds")
        assert re.search(message, error["message"]), error
        short = encode_as(long_wav(hello_wav, 2.0), ext)
        ok = http.post(
            "/v1/audio/vad", files={"file": (f"a.{ext}", short)}, data={"model": "silero_vad"}
        )
        assert ok.status_code == 200, ok.text
