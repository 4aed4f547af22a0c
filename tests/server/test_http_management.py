"""Model management on a live server: bearer token, register, reconfigure, unload, bulk unload."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.live import AUTH, LiveServer, assert_error, b64

SLOTS_MESSAGE = "model slots must be an integer between 1 and 16"


def rows(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in http.get("/v1/models").json()["data"]}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "test-token"},
        {"Authorization": "Basic test-token"},
    ],
)
def test_management_needs_the_bearer_token(http: httpx.Client, headers: dict[str, str]) -> None:
    for path, body in (
        ("/v1/models/load", {"id": "x", "family": "silero_vad"}),
        ("/v1/models/unload", {"id": "piper"}),
        ("/v1/tasks/unload_models", {"model_ids": ["piper"]}),
        ("/v1/tasks/unload_all_models", {}),
    ):
        assert_error(
            http.post(path, json=body, headers=headers), 403, "permission_error", "bearer token"
        )
    assert "x" not in rows(http)


@pytest.mark.parametrize("slots", [None, True, "2", 1.5, 17, 0, -1])
def test_invalid_slots_are_400(http: httpx.Client, slots: Any) -> None:
    r = http.post(
        "/v1/models/load",
        json={"id": "vad_bad", "family": "silero_vad", "slots": slots},
        headers=AUTH,
    )
    assert_error(r, 400, "invalid_request_error", SLOTS_MESSAGE)
    assert "vad_bad" not in rows(http)


def test_load_validation_is_400(http: httpx.Client) -> None:
    assert_error(
        http.post("/v1/models/load", json={"family": "silero_vad"}, headers=AUTH),
        400,
        "invalid_request_error",
        "'id'",
    )
    assert_error(
        http.post("/v1/models/load", json={"id": "n"}, headers=AUTH),
        400,
        "invalid_request_error",
        "family",
    )
    r = http.post("/v1/models/load", json={"id": "n", "family": "bark"}, headers=AUTH)
    assert_error(r, 400, "invalid_request_error", "family")
    r = http.post(
        "/v1/models/load", json={"id": "n", "family": "silero_vad", "mode": "live"}, headers=AUTH
    )
    assert_error(r, 400, "invalid_request_error", "mode")
    assert_error(
        http.post("/v1/models/unload", json={"id": "nope"}, headers=AUTH),
        404,
        "not_found_error",
        "nope",
    )
    assert_error(
        http.post("/v1/tasks/unload_models", json={"model_ids": "piper"}, headers=AUTH),
        400,
        "invalid_request_error",
    )


def test_register_reconfigure_unload(
    http: httpx.Client, main_server: LiveServer, hello_wav: bytes
) -> None:
    r = http.post(
        "/v1/models/load",
        json={"id": "vad_extra", "family": "silero_vad", "slots": 1},
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "vad_extra", "loaded": True, "reconfigured": False}
    row = rows(http)["vad_extra"]
    assert (
        row["loaded"] is True
        and row["slots"] == 1
        and row["task"] == "vad"
        and row["state"] == "ready"
    )
    vad = {"model": "vad_extra", "audio_base64": b64(hello_wav)}
    first = http.post("/v1/audio/vad", json=vad)
    assert first.status_code == 200

    r = http.post("/v1/models/load", json={"id": "vad_extra", "slots": 3}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["reconfigured"] is True
    row = rows(http)["vad_extra"]
    assert row["slots"] == 3 and row["loaded"] is True
    again = http.post("/v1/audio/vad", json=vad)
    assert again.json()["segments"] == first.json()["segments"]

    r = http.post("/v1/models/unload", json={"id": "vad_extra"}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"id": "vad_extra", "loaded": False}
    assert rows(http)["vad_extra"]["loaded"] is False
    r = http.post("/v1/models/unload", json={"id": "vad_extra"}, headers=AUTH)  # idempotent
    assert r.status_code == 200 and r.json()["loaded"] is False
    # lazily loaded again by the next request, with the reconfigured slot count
    assert http.post("/v1/audio/vad", json=vad).json()["segments"] == first.json()["segments"]
    assert rows(http)["vad_extra"]["slots"] == 3

    r = http.post(
        "/v1/tasks/unload_models", json={"model_ids": ["vad_extra", "ghost"]}, headers=AUTH
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"unloaded": ["vad_extra"], "not_found": ["ghost"]}
    assert rows(http)["vad_extra"]["loaded"] is False
    main_server.wait_idle("vad_extra")


def test_unload_all_models(http: httpx.Client, hello_wav: bytes) -> None:
    assert (
        http.post(
            "/v1/audio/vad", json={"model": "silero_vad", "audio_base64": b64(hello_wav)}
        ).status_code
        == 200
    )
    r = http.post("/v1/tasks/unload_all_models", json={}, headers=AUTH)
    assert r.status_code == 200, r.text
    unloaded = r.json()["unloaded"]
    assert "silero_vad" in unloaded
    assert all(not row["loaded"] for row in rows(http).values())
    # every model stays registered and loads again on demand
    assert (
        http.post(
            "/v1/audio/vad", json={"model": "silero_vad", "audio_base64": b64(hello_wav)}
        ).status_code
        == 200
    )
    assert rows(http)["silero_vad"]["loaded"] is True


def test_early_refusals_reach_the_client_with_a_large_body(http: httpx.Client) -> None:
    """A 403/404 sent before the body is read must not be lost to a connection reset."""
    body = {"id": "x", "family": "silero_vad", "padding": "p" * 400_000}
    for _ in range(10):
        assert_error(http.post("/v1/models/load", json=body), 403, "permission_error")
        assert_error(http.post("/v1/not/a/route", json=body), 404, "not_found_error")


def test_reregistering_with_only_operational_fields_keeps_the_pool(
    http: httpx.Client, hello_wav: bytes
) -> None:
    """Race report 3: lazy, busy_timeout_ms and memory_mb update in place; no reconfiguration."""
    spec = {"id": "vad_same", "family": "silero_vad", "slots": 2}
    r = http.post("/v1/models/load", json=spec, headers=AUTH)
    assert r.status_code == 200 and r.json()["reconfigured"] is False, r.text
    before = http.post("/v1/audio/vad", json={"model": "vad_same", "audio_base64": b64(hello_wav)})
    assert before.status_code == 200
    for extra in ({"lazy": True}, {"busy_timeout_ms": 5000}, {"memory_mb": 64}):
        r = http.post("/v1/models/load", json={**spec, **extra}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json() == {"id": "vad_same", "loaded": True, "reconfigured": False}, extra
        row = rows(http)["vad_same"]
        assert row["loaded"] is True and row["state"] == "ready" and row["slots"] == 2
    r = http.post(
        "/v1/models/load", json={**spec, "slots": 1}, headers=AUTH
    )  # a real change still reconfigures
    assert r.status_code == 200 and r.json()["reconfigured"] is True, r.text
    after = http.post("/v1/audio/vad", json={"model": "vad_same", "audio_base64": b64(hello_wav)})
    assert after.json()["segments"] == before.json()["segments"]
    http.post("/v1/models/unload", json={"id": "vad_same"}, headers=AUTH).raise_for_status()


def test_reconfiguring_an_id_keeps_what_the_load_does_not_give(http: httpx.Client) -> None:
    """A load naming an existing id changes only the keys it gives: a new slot count leaves
    the mode (streamed speech still served), the voice aliases (an added one still
    answers, a removed default still refused) and the default format where they were."""
    first = {
        "id": "tts_keep",
        "family": "piper",
        "mode": "streaming",
        "slots": 1,
        "voice_aliases": {"narrator": "joe", "alloy": None},
        "default_request_options": {"response_format": "mp3"},
    }
    r = http.post("/v1/models/load", json=first, headers=AUTH)
    assert r.status_code == 200, r.text
    r = http.post("/v1/models/load", json={"id": "tts_keep", "slots": 2}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["reconfigured"] is True
    row = rows(http)["tts_keep"]
    assert (row["slots"], row["mode"], row["family"]) == (2, "streaming", "piper")
    speech = {"model": "tts_keep", "input": "Hello there.", "voice": "narrator"}
    said = http.post("/v1/audio/speech", json=speech)
    assert said.status_code == 200, said.text
    assert said.headers["content-type"].startswith("audio/mpeg")  # the default kept
    streamed = http.post("/v1/audio/speech", json={**speech, "stream_format": "sse"})
    assert streamed.status_code == 200, streamed.text
    assert_error(
        http.post("/v1/audio/speech", json={**speech, "voice": "alloy"}),
        400,
        "invalid_request_error",
        "alloy",
    )
    # given again, voice_aliases applies over the model's current table
    r = http.post(
        "/v1/models/load",
        json={"id": "tts_keep", "voice_aliases": {"alloy": "joe"}},
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    for voice in ("alloy", "narrator"):
        said = http.post("/v1/audio/speech", json={**speech, "voice": voice})
        assert said.status_code == 200, (voice, said.text)
    assert rows(http)["tts_keep"]["slots"] == 2
    http.post("/v1/models/unload", json={"id": "tts_keep"}, headers=AUTH)


def test_a_batching_model_loads_and_keeps_batching_past_16_slots(http: httpx.Client) -> None:
    r = http.post(
        "/v1/models/load",
        json={"id": "vad_rows", "family": "silero_vad", "batching": True, "slots": 4},
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    assert rows(http)["vad_rows"]["batching"] is True
    r = http.post("/v1/models/load", json={"id": "vad_rows", "slots": 64}, headers=AUTH)
    assert r.status_code == 200, r.text
    row = rows(http)["vad_rows"]
    assert (row["slots"], row["batching"]) == (64, True)
    r = http.post("/v1/models/load", json={"id": "vad_rows", "slots": 5000}, headers=AUTH)
    assert_error(r, 400, "invalid_request_error", "slots")
    http.post("/v1/models/unload", json={"id": "vad_rows"}, headers=AUTH)


def test_an_id_keeps_its_family(http: httpx.Client) -> None:
    r = http.post("/v1/models/load", json={"id": "vad_fam", "family": "silero_vad"}, headers=AUTH)
    assert r.status_code == 200, r.text
    r = http.post("/v1/models/load", json={"id": "vad_fam", "family": "whisper"}, headers=AUTH)
    assert_error(r, 409, "invalid_request_error", "keeps its family")
    assert rows(http)["vad_fam"]["family"] == "silero_vad"
    http.post("/v1/models/unload", json={"id": "vad_fam"}, headers=AUTH)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"id": "k1", "family": "silero_vad", "unknown_key": 1}, "unknown_key"),
        ({"id": "k2", "family": "piper", "path": "/etc/passwd"}, "takes no path"),
        ({"id": "k3", "family": "silero_vad", "path": "x"}, "takes no path"),
        ({"id": "k4", "family": "piper", "batching": "yes"}, "batching"),
    ],
)
def test_load_bodies_it_cannot_honour_are_400(
    http: httpx.Client, body: dict[str, Any], words: str
) -> None:
    """Keys a load does not know, and a path for a family that runs only its bundled
    weights, are refused, not ignored; nothing is registered."""
    assert_error(
        http.post("/v1/models/load", json=body, headers=AUTH), 400, "invalid_request_error", words
    )
    assert body["id"] not in rows(http)


def test_voice_aliases_for_a_model_without_voices_is_400(http: httpx.Client) -> None:
    r = http.post(
        "/v1/models/load", json={"id": "silero_vad", "voice_aliases": {"x": "joe"}}, headers=AUTH
    )
    assert_error(r, 400, "invalid_request_error", "voice_aliases is only for TTS models")


def test_a_registered_model_reloads_on_the_original_runtime() -> None:
    """Without ``--parallel-jobs`` a slot count is not a setting (naming one is refused): a
    load naming a registered id carries every other setting over, not its slots."""
    from core.policy import RuntimeKind
    from server.config import ConfigError, parse_model
    from server.http.routes_models import merged_entry

    raw = {"id": "tts", "family": "piper", "mode": "streaming", "voice_aliases": {"alloy": None}}
    spec = parse_model(raw, {}, RuntimeKind.ORIGINAL, None).spec()
    for body in ({"id": "tts"}, {"id": "tts", "lazy": False}, {"id": "tts", "busy_timeout_ms": 9}):
        again = parse_model(
            merged_entry(spec, body, RuntimeKind.ORIGINAL), {}, RuntimeKind.ORIGINAL, None
        )
        assert (again.mode, again.slots, again.voice_aliases) == (
            "streaming",
            1,
            spec.extra["voice_aliases"],
        )
    with pytest.raises(ConfigError, match="parallel-jobs"):
        parse_model(
            merged_entry(spec, {"id": "tts", "slots": 2}, RuntimeKind.ORIGINAL),
            {},
            RuntimeKind.ORIGINAL,
            None,
        )
    parallel = parse_model(raw, {}, RuntimeKind.PARALLEL, None).spec()
    assert (
        parse_model(
            merged_entry(parallel, {"id": "tts"}, RuntimeKind.PARALLEL),
            {},
            RuntimeKind.PARALLEL,
            None,
        ).spec()
        == parallel
    )
