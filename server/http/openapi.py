"""The OpenAPI 3.1 description of the API, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "invalid request", 403: "management disabled or bad token", 404: "unknown model",
            413: "body too large", 503: "busy (Retry-After set)"}
    return {str(c): {"description": text[c], **_json(ERROR)} for c in codes}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


S, INT, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
ARR_S = {"type": "array", "items": S}


def _op(summary: str, body: dict[str, Any] | None, ok: dict[str, Any], *codes: int) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **_errors(*codes)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


SSE = {"description": "server-sent events", "content": {"text/event-stream": {"schema": S}}}
SPEECH = _obj(
    {"model": S, "input": S, "voice": S, "response_format": {"enum": ["wav", "pcm", "json", "b64_json"]},
     "stream": B, "stream_format": {"enum": ["sse", "audio"]}, "speed": N, "seed": INT, "noise_scale": N,
     "noise_w": N, "length_scale": N, "busy_timeout_ms": INT},
    ["model", "input"],
)
AUDIO_JSON = _obj({"model": S, "audio_base64": S, "audio_path": S, "language": S, "prompt": S, "stream": B,
                   "response_format": S, "busy_timeout_ms": INT}, ["model"])
AUDIO_FORM = _obj({"file": {"type": "string", "format": "binary"}, "model": S, "language": S, "prompt": S,
                   "stream": S, "response_format": S, "busy_timeout_ms": S}, ["file", "model"])
AUDIO_BODY = {"application/json": {"schema": AUDIO_JSON}, "multipart/form-data": {"schema": AUDIO_FORM}}
MODEL_ROW = _obj({"id": S, "object": S, "family": S, "task": S, "mode": S, "slots": INT, "active_slots": INT,
                  "queued_requests": INT, "max_parallel_slots": {"type": ["integer", "null"]}, "loaded": B, "state": S})

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "voxpool", "version": "0.1.0",
             "description": "Audio models (TTS, ASR, VAD) with parallel per-model session slots; audio.cpp-compatible."},
    "paths": {
        "/health": {"get": _op("Liveness and backend", None, {"description": "ok", **_json(_obj({"status": S}))})},
        "/v1/models": {"get": _op("Registered models and their slots", None,
                                  {"description": "list", **_json(_obj({"object": S, "data": {"type": "array", "items": MODEL_ROW}}))})},
        "/v1/audio/speech": {"post": _op("Text to speech (WAV, PCM, JSON; SSE or raw streaming)",
                                         {"application/json": {"schema": SPEECH}},
                                         {"description": "audio", "content": {"audio/wav": {}, "audio/pcm": {}, "text/event-stream": {}}},
                                         400, 404, 413, 503)},
        "/v1/audio/transcriptions": {"post": _op("Speech recognition (JSON or multipart; SSE with stream)", AUDIO_BODY,
                                                 {"description": "transcript", **_json(_obj({"text": S}))}, 400, 404, 413, 503)},
        "/v1/audio/vad": {"post": _op("Voice activity: speech segments (SSE events with stream)", AUDIO_BODY,
                                      {"description": "segments", **_json(_obj({"segments": {"type": "array"}}))}, 400, 404, 413, 503)},
        "/v1/audio/voices": {"get": _op("Voices of a TTS model", None, {"description": "voices", **_json(_obj({"voices": ARR_S}))}, 404)},
        "/v1/tasks/run": {"post": _op("Run one task request", {"application/json": {"schema": _obj({"model": S, "request": {"type": "object"}}, ["model"])}},
                                      {"description": "result", **_json({"type": "object"})}, 400, 404, 503)},
        "/v1/tasks/batch": {"post": _op("Native batch; SSE results by index",
                                        {"application/json": {"schema": _obj({"model": S, "requests": {"type": "array"}}, ["model", "requests"])}},
                                        SSE, 400, 404, 503)},
        "/v1/tasks/stream": {"post": _op("Streamed run collected as JSON events",
                                         {"application/json": {"schema": _obj({"model": S, "request": {"type": "object"}}, ["model"])}},
                                         {"description": "events", **_json(_obj({"events": {"type": "array"}}))}, 400, 404, 503)},
        "/v1/models/load": {"post": _op("Register, reconfigure or load a model (management)",
                                        {"application/json": {"schema": _obj({"id": S, "family": S, "path": S, "mode": S, "slots": INT}, ["id"])}},
                                        {"description": "loaded", **_json(_obj({"id": S, "loaded": B, "reconfigured": B}))}, 400, 403, 503)},
        "/v1/models/unload": {"post": _op("Unload a model (management)", {"application/json": {"schema": _obj({"id": S}, ["id"])}},
                                          {"description": "unloaded", **_json(_obj({"id": S, "loaded": B}))}, 403, 404, 503)},
        "/v1/tasks/unload_models": {"post": _op("Bulk unload of listed models (management)",
                                                {"application/json": {"schema": _obj({"model_ids": ARR_S}, ["model_ids"])}},
                                                {"description": "unloaded", **_json(_obj({"unloaded": ARR_S, "not_found": ARR_S}))}, 400, 403)},
        "/v1/tasks/unload_all_models": {"post": _op("Bulk unload of every model (management)", None,
                                                    {"description": "unloaded", **_json(_obj({"unloaded": ARR_S}))}, 403)},
        "/metrics": {"get": _op("Prometheus metrics", None, {"description": "text exposition format", "content": {"text/plain": {}}})},
    },
    "components": {"schemas": {"Error": _obj({"error": _obj({"message": S, "type": {"enum": [
        "invalid_request_error", "not_found_error", "server_busy", "permission_error", "server_error"]}})})}},
}
