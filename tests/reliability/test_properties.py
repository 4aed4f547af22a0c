"""Requests generated from the served ``/openapi.json``: what the document allows, the
server accepts.

schemathesis draws requests from each operation of the document as the live
server serves it (its model ids, ranges and limits). A request the document
allows must never get a 5xx, nor a 400 about a field: the only 400s allowed
are those no schema can predict, each recognisable by its message
(undecodable or over-long audio, speech over its seconds limit). Audio sources
are drawn from the schema too, then half of them are replaced by a real WAV,
so the models run. Bounded (``max_examples`` per operation, ``derandomize``)
to keep the suite under its two-minute budget.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.cases import HELLO_PATH, error_of, noise_wav
from tests.server.live import AUTH, HELLO_WAV, LiveServer, b64, parse_sse

SPEECH_LIMITS = (
    "max_speech_seconds",
    "speech_seconds_per_char",
    "max_sentence_seconds",
    "produced no speech",
)
AUDIO_CONTENT = ("base64", "WAV", "audio", "the uploaded file is empty", "max_audio_seconds")
HELLO = HELLO_WAV.read_bytes()
SHORT = noise_wav(0.2)
"""Whisper runs a 30 s window whatever the length: short audio keeps each example near one
second."""
TASKS = {"piper": "tts", "piper_batch": "tts", "whisper": "asr", "silero_vad": "vad"}
OUTCOMES: collections.Counter[str] = collections.Counter()
"""Examples run, by route and status: printed at the end (docs/reliability.md has a run's
figures)."""


@pytest.fixture(scope="module")
def document(rel: httpx.Client) -> Iterator[dict[str, Any]]:
    doc = rel.get("/openapi.json").json()
    assert isinstance(doc, dict)
    yield doc
    print("\nschema-generated requests by route and status:")
    print("\n".join(f"  {key}: {count}" for key, count in sorted(OUTCOMES.items())))


@pytest.fixture(scope="module")
def api(document: dict[str, Any]) -> Any:
    return schemathesis.openapi.from_dict(document)


def body_schema(doc: dict[str, Any], path: str, media: str = "application/json") -> dict[str, Any]:
    schema = doc["paths"][path]["post"]["requestBody"]["content"][media]["schema"]
    assert jsonschema_rs.meta.is_valid(schema), path
    return dict(schema)


def bodies(
    api: Any, path: str, media: str = "application/json", method: str = "POST"
) -> st.SearchStrategy[Any]:
    """Request bodies (or, for a GET, query dicts) drawn from the document's schema of ``path``."""
    operation = api[path][method]
    if method != "POST":
        queries: st.SearchStrategy[Any] = operation.as_strategy().map(lambda case: case.query)
        return queries
    cases = operation.as_strategy(media_type=media).filter(lambda case: case.media_type == media)
    drawn: st.SearchStrategy[Any] = cases.map(lambda case: case.body)
    return drawn


def run(draw_test: Callable[..., None], examples: int) -> Callable[..., None]:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )(draw_test)


def form_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def with_audio(body: dict[str, Any], use_real: bool, model: str) -> dict[str, Any]:
    """``body`` with its audio source replaced by a real WAV (Whisper: a short one) when
    ``use_real``."""
    if not use_real:
        return body
    out = {k: v for k, v in body.items() if k not in ("audio_base64", "audio_path")}
    if model == "whisper":
        out["audio_base64"] = b64(SHORT)
    elif "audio_path" in body:
        out["audio_path"] = HELLO_PATH
    else:
        out["audio_base64"] = b64(HELLO)
    return out


def allowed_400(message: str, task: str) -> bool:
    """A 400 the schema cannot predict: audio content (ASR/VAD) or a speech seconds limit (TTS)."""
    return any(k in message for k in (SPEECH_LIMITS if task == "tts" else AUDIO_CONTENT))


def check(resp: httpx.Response, task: str, real_audio: bool) -> None:
    """The verdict for a schema-valid request (and its tally in :data:`OUTCOMES`)."""
    path = resp.request.url.path
    OUTCOMES[f"{path} {resp.status_code}"] += 1
    assert resp.status_code < 500, (resp.status_code, resp.text[:400])
    if resp.status_code == 503:
        error_of(resp)
        return
    if resp.status_code != 200:
        error = error_of(resp)
        assert resp.status_code == 400, (resp.status_code, error)
        assert allowed_400(error["message"], task) and not real_audio, error
        return
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        for event in parse_sse(resp.text):
            if isinstance(event, dict) and event.get("type") == "error":
                assert allowed_400(event["error"]["message"], task) and not real_audio, event


def test_the_document_is_valid_and_every_post_body_has_a_schema(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    for path, item in document["paths"].items():
        for operation in item.values():
            assert "405" in operation["responses"] and "500" in operation["responses"], path
            for media in operation.get("requestBody", {}).get("content", {}).values():
                assert jsonschema_rs.meta.is_valid(media["schema"]), path
    speech = body_schema(document, "/v1/audio/speech")
    validator = jsonschema_rs.Draft202012Validator(speech)
    assert not any(
        validator.is_valid(b)
        for b in (
            {"model": "", "input": "Hi."},
            {"model": "piper", "input": ""},
            {"model": "nope", "input": "x"},
            {"model": "piper", "input": "Hi.", "length_scale": 1000},
            {"model": "piper", "input": "Hi.", "seed": -1},
            {"model": "piper_batch", "input": "Hi.", "stream": True},
        )
    )
    assert validator.is_valid({"model": "piper", "input": "Hi.", "stream": True, "speed": 2})


def test_speech(rel: httpx.Client, api: Any) -> None:
    @given(bodies(api, "/v1/audio/speech"))
    def prop(body: dict[str, Any]) -> None:
        check(rel.post("/v1/audio/speech", json=body), "tts", False)

    run(prop, 10)()


@pytest.mark.parametrize(
    ("path", "model", "examples"),
    [("/v1/audio/vad", "silero_vad", 12), ("/v1/audio/transcriptions", "whisper", 3)],
)
def test_audio_routes_json(
    rel: httpx.Client, api: Any, path: str, model: str, examples: int
) -> None:
    @given(bodies(api, path), st.booleans())
    def prop(body: dict[str, Any], real: bool) -> None:
        sent = with_audio(body, real, model)
        check(rel.post(path, json=sent), TASKS[model], real)

    run(prop, examples)()


@pytest.mark.parametrize(
    ("path", "model", "examples"),
    [("/v1/audio/vad", "silero_vad", 8), ("/v1/audio/transcriptions", "whisper", 2)],
)
def test_audio_routes_multipart(
    rel: httpx.Client, api: Any, path: str, model: str, examples: int
) -> None:
    @given(bodies(api, path, "multipart/form-data"), st.booleans())
    def prop(body: dict[str, Any], real: bool) -> None:
        fields = {k: form_value(v) for k, v in body.items() if k != "file"}
        drawn = getattr(body["file"], "data", body["file"])  # schemathesis wraps bytes in Binary
        if real:
            data = SHORT if model == "whisper" else HELLO
        else:
            data = drawn if isinstance(drawn, bytes) else str(drawn).encode()
        resp = rel.post(path, data=fields, files={"file": ("audio.wav", data, "audio/wav")})
        check(resp, TASKS[model], real)

    run(prop, examples)()


@pytest.mark.parametrize(
    ("path", "examples"), [("/v1/tasks/run", 12), ("/v1/tasks/stream", 8), ("/v1/tasks/batch", 8)]
)
def test_task_routes(rel: httpx.Client, api: Any, path: str, examples: int) -> None:
    @given(bodies(api, path), st.booleans())
    def prop(body: dict[str, Any], real: bool) -> None:
        model = body["model"]
        task = TASKS[model]
        sent = dict(body)
        if path == "/v1/tasks/batch":  # elsewhere a "requests" is an extra property, any value
            entries = body["requests"][:3]  # up to 64 are allowed; 3 keep an example near a second
            sent["requests"] = [with_audio(e, real, model) if task != "tts" else e for e in entries]
        elif task != "tts":
            sent["request"] = with_audio(body["request"], real, model)
        check(rel.post(path, json=sent), task, real and task != "tts")

    run(prop, examples)()


def test_management(reliability_server: LiveServer, rel: httpx.Client, api: Any) -> None:
    """Registration (under a small pool of new ids a family, unloaded again: an id keeps its
    family), unload and bulk unload: 200 or 404."""

    @given(bodies(api, "/v1/models/load").filter(lambda b: "family" in b), st.integers(0, 2))
    def prop_load(body: dict[str, Any], slot: int) -> None:
        body = {**body, "id": f"prop-{body['family']}-{slot}"}
        resp = rel.post("/v1/models/load", json=body, headers=AUTH)
        OUTCOMES[f"/v1/models/load {resp.status_code}"] += 1
        assert resp.status_code == 200, (body, resp.text[:400])
        unloaded = rel.post("/v1/models/unload", json={"id": body["id"]}, headers=AUTH)
        assert unloaded.status_code == 200, unloaded.text[:400]

    @given(bodies(api, "/v1/models/unload"))
    def prop_unload(body: dict[str, Any]) -> None:
        resp = rel.post("/v1/models/unload", json=body, headers=AUTH)
        OUTCOMES[f"/v1/models/unload {resp.status_code}"] += 1
        assert resp.status_code in (200, 404), resp.text[:400]
        if resp.status_code == 404:
            error_of(resp)

    @given(bodies(api, "/v1/tasks/unload_models"))
    def prop_bulk(body: dict[str, Any]) -> None:
        resp = rel.post("/v1/tasks/unload_models", json=body, headers=AUTH)
        OUTCOMES[f"/v1/tasks/unload_models {resp.status_code}"] += 1
        assert resp.status_code == 200, resp.text[:400]
        assert set(resp.json()) == {"unloaded", "not_found"}

    run(prop_load, 5)()
    run(prop_unload, 8)()
    run(prop_bulk, 8)()
    for row in rel.get("/v1/models", headers=AUTH).json()["data"]:
        reliability_server.wait_idle(row["id"])


def test_voices(rel: httpx.Client, api: Any) -> None:
    @given(bodies(api, "/v1/audio/voices", method="GET"))
    def prop(query: dict[str, Any] | None) -> None:
        resp = rel.get("/v1/audio/voices", params=query or {})
        OUTCOMES[f"/v1/audio/voices {resp.status_code}"] += 1
        assert resp.status_code == 200 and json.loads(resp.text)["voices"], resp.text[:200]

    run(prop, 5)()
