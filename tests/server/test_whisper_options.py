"""Whisper's OpenAI transcription options through a live server and the unmodified
``openai`` client: ``timestamp_granularities[]`` (word timestamps in verbose_json),
``temperature``, ``seed``, ``prompt``; and voxpool's ``vad_chunking`` (issue #14).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.models.whisper_audio import DATA as WHISPER_DATA
from tests.models.whisper_audio import FIXTURES, word_error_rate
from tests.server.live import HELLO_WAV, LiveServer, parse_sse, silence_wav

ROUTE = "/v1/audio/transcriptions"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _check_words(body: dict[str, Any]) -> list[dict[str, Any]]:
    words = body["words"]
    assert [w["word"] for w in words] == ["Hello", "world."]
    assert all(set(w) == {"word", "start", "end"} for w in words)
    assert all(0.0 <= w["start"] <= w["end"] <= body["duration"] + 0.5 for w in words)
    assert words[0]["end"] <= words[1]["start"] + 1e-9
    assert len(body["segments"]) == 1  # segments as before, next to the words
    return list(words)


def test_word_timestamps_multipart_and_json_agree(http: httpx.Client, hello_wav: bytes) -> None:
    form = http.post(
        ROUTE,
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={
            "model": "whisper",
            "response_format": "verbose_json",
            "timestamp_granularities[]": ["word", "segment"],  # the field repeated
        },
    )
    assert form.status_code == 200, form.text
    words = _check_words(form.json())
    as_json = http.post(
        ROUTE,
        json={
            "model": "whisper",
            "audio_base64": _b64(hello_wav),
            "response_format": "verbose_json",
            "timestamp_granularities": ["word"],
        },
    )
    assert as_json.status_code == 200, as_json.text
    assert _check_words(as_json.json()) == words
    assert as_json.json()["segments"] == form.json()["segments"]


def test_no_words_unless_asked(http: httpx.Client, hello_wav: bytes) -> None:
    body = {"model": "whisper", "audio_base64": _b64(hello_wav), "response_format": "verbose_json"}
    plain = http.post(ROUTE, json=body)
    assert plain.status_code == 200, plain.text
    assert "words" not in plain.json()
    segments = http.post(ROUTE, json={**body, "timestamp_granularities": ["segment"]})
    assert segments.status_code == 200 and "words" not in segments.json()
    assert segments.json()["segments"] == plain.json()["segments"]
    assert plain.json()["segments"][0]["temperature"] == 0.0


def test_sampling_temperature_is_seeded(http: httpx.Client, hello_wav: bytes) -> None:
    body = {
        "model": "whisper",
        "audio_base64": _b64(hello_wav),
        "response_format": "verbose_json",
        "temperature": 1.0,
        "seed": 5,
    }
    first = http.post(ROUTE, json=body)
    again = http.post(ROUTE, json=body)
    assert first.status_code == again.status_code == 200, first.text
    assert first.json()["segments"] == again.json()["segments"]
    assert first.json()["text"] == again.json()["text"]
    assert [s["temperature"] for s in first.json()["segments"]] == [1.0]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"temperature": 1.5}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"seed": -1}, "seed"),
        ({"timestamp_granularities": ["char"]}, "timestamp_granularities"),
        ({"timestamp_granularities": {"word": True}}, "timestamp_granularities"),
        ({"timestamp_granularities": ["word"] * 9}, "timestamp_granularities"),
        ({"timestamp_granularities[]": [1]}, "timestamp_granularities"),
        ({"vad_chunking": "maybe"}, "vad_chunking"),
        ({"vad_chunking": 2}, "vad_chunking"),
        ({"vad_chunking": [True]}, "vad_chunking"),
    ],
)
def test_invalid_options_are_400(
    http: httpx.Client, hello_wav: bytes, fields: dict[str, Any], named: str
) -> None:
    r = http.post(ROUTE, json={"model": "whisper", "audio_base64": _b64(hello_wav), **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and named in error["message"]


def test_invalid_multipart_granularity_is_400(http: httpx.Client, hello_wav: bytes) -> None:
    r = http.post(
        ROUTE,
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={"model": "whisper", "timestamp_granularities[]": ["word", "sentence"]},
    )
    assert r.status_code == 400, r.text
    assert "timestamp_granularities" in r.json()["error"]["message"]


def test_invalid_multipart_vad_chunking_is_400(http: httpx.Client, hello_wav: bytes) -> None:
    r = http.post(
        ROUTE,
        files={"file": ("hello.wav", hello_wav, "audio/wav")},
        data={"model": "whisper", "vad_chunking": "yes"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "'vad_chunking'" in error["message"]


def _verbose(http: httpx.Client, audio: bytes, **fields: str) -> dict[str, Any]:
    r = http.post(
        ROUTE,
        files={"file": ("a.wav", audio, "audio/wav")},
        data={"model": "whisper", "response_format": "verbose_json", **fields},
    )
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k != "timing"}


STORY_CUT_S = 29.06
"""Where the VAD cuts story.wav into its two pieces (docs/performance.md)."""


@pytest.fixture(scope="module")
def story() -> bytes:
    return (WHISPER_DATA / "story.wav").read_bytes()


@pytest.fixture(scope="module")
def story_plain(main_server: LiveServer, story: bytes) -> dict[str, Any]:
    """story.wav decoded in sequential 30 s windows (no vad_chunking)."""
    with main_server.client() as client:
        return _verbose(client, story)


def test_vad_chunking_off_is_the_default(
    http: httpx.Client, story: bytes, story_plain: dict[str, Any]
) -> None:
    assert _verbose(http, story, vad_chunking="false") == story_plain


def test_vad_chunking_transcribes_a_long_file_in_pieces(
    http: httpx.Client, story: bytes, story_plain: dict[str, Any]
) -> None:
    """story.wav (54.7 s) in two pieces: no segment crosses the cut (sequential decoding's
    do), times inside the file and in order; multipart, JSON and the SSE stream agree."""
    form = _verbose(http, story, vad_chunking="true")
    segments = form["segments"]
    assert all(s["end"] <= STORY_CUT_S or s["start"] >= STORY_CUT_S for s in segments)
    assert any(s["start"] < STORY_CUT_S < s["end"] for s in story_plain["segments"])
    assert any(s["start"] == STORY_CUT_S for s in segments)  # the second piece's first
    assert all(0 <= s["start"] <= s["end"] <= form["duration"] for s in segments)
    assert [s["start"] for s in segments] == sorted(s["start"] for s in segments)
    reference = next(str(f["text"]) for f in FIXTURES if f["name"] == "story")
    assert word_error_rate(reference, form["text"]) < 0.1
    as_json = http.post(
        ROUTE,
        json={
            "model": "whisper",
            "audio_base64": _b64(story),
            "response_format": "verbose_json",
            "vad_chunking": True,
        },
    )
    assert as_json.status_code == 200, as_json.text
    assert as_json.json()["segments"] == segments
    streamed = http.post(
        ROUTE,
        files={"file": ("story.wav", story, "audio/wav")},
        data={"model": "whisper", "stream": "true", "vad_chunking": "1"},
    )
    assert streamed.status_code == 200, streamed.text
    events = [e for e in parse_sse(streamed.text) if isinstance(e, dict)]
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert [(d["segment"]["start"], d["segment"]["end"]) for d in deltas] == [
        (s["start"], s["end"]) for s in segments
    ]
    (done,) = [e for e in events if e["type"] == "transcript.text.done"]
    assert done["text"] == form["text"]


def test_vad_chunking_of_silence_is_empty(http: httpx.Client) -> None:
    body = _verbose(http, silence_wav(5.0), vad_chunking="true")
    assert (body["text"], body["segments"], body["duration"]) == ("", [], 5.0)


@pytest.fixture()
def client(main_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=main_server.url + "/v1", api_key="x", max_retries=0, timeout=180.0
    ) as c:
        yield c


def test_openai_client_word_timestamps(client: openai.OpenAI) -> None:
    with open(HELLO_WAV, "rb") as f:
        result = client.audio.transcriptions.create(
            model="whisper",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["word"],
            temperature=0.0,
            prompt="A greeting.",
        )
    assert result.text == "Hello world."
    assert result.words is not None
    assert [w.word for w in result.words] == ["Hello", "world."]
    assert all(0.0 <= w.start <= w.end for w in result.words)
    assert result.segments is not None and len(result.segments) == 1
