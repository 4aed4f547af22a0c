"""The OpenAPI 3.1 description of the API, served at ``/openapi.json``.

The document is built for the server as it is when asked: ``model`` fields
list the registered models that can serve the route, every numeric field
carries the range the server accepts, and string fields their length and
values, so a request valid by the schema is one the server accepts. What a
schema cannot say (that base64 is a decodable WAV, that a local path exists,
that synthesized speech stays within its seconds limit) is left to the 4xx
responses described with each route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from core.policy import RuntimeKind
from server.codecs import SPEECH_AUDIO
from server.config import MAX_JSON_INT, MODEL_ID, MODES, ServerConfig
from server.families import registry
from server.families.base import SpeechAdapter
from server.families.http import (
    LANGUAGES,
    MAX_BATCH,
    MAX_GRANULARITIES,
    MAX_PROMPT_CHARS,
    SEED_MAX,
    SPEECH_FORMATS,
    SPEECH_RANGES,
    TEMPERATURE_RANGE,
    TIMESTAMP_GRANULARITIES,
    TRANSCRIPT_FORMATS,
    VAD_OPEN,
    VAD_RANGES,
)
from server.http.body import FORM_BOOLEANS
from server.runtime.ports import ModelSpec

MAX_BULK_IDS = 1024
"""Most ids in one ``/v1/tasks/unload_models`` request."""
ERROR_TYPES = (
    "invalid_request_error",
    "not_found_error",
    "server_busy",
    "permission_error",
    "server_error",
)

Schema = dict[str, Any]
ERROR: Schema = {"$ref": "#/components/schemas/Error"}
S: Schema = {"type": "string"}
B: Schema = {"type": "boolean"}
OBJ: Schema = {"type": "object"}
ARR_S: Schema = {"type": "array", "items": S}
NEVER: Schema = {"not": {}}
"""Matches nothing: a route with no model that can serve it accepts no body."""
BUSY_TIMEOUT: Schema = {"type": "integer", "minimum": 0, "maximum": MAX_JSON_INT}


def _json(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


ERROR_TEXT = {
    400: "invalid request (also: undecodable audio, audio or speech over a configured limit)",
    403: "management disabled or bad token",
    404: "unknown model",
    405: "wrong method (Allow lists the right one)",
    409: "the id is a model of another family (an id keeps its family)",
    413: "body (or a server-local audio file) over max_request_body_bytes",
    500: "internal error: only a request id, the details are in the server log",
    503: "busy (Retry-After set)",
}


def _errors(*codes: int) -> Schema:
    return {str(c): {"description": ERROR_TEXT[c], **_json(ERROR)} for c in (*codes, 405, 500)}


def _obj(props: Schema, required: Sequence[str] = (), *, closed: bool = False) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def _enum(values: Sequence[str]) -> Schema:
    return {"type": "string", "enum": list(values)} if values else NEVER


def _range(lo: float, hi: float, is_open: bool = False) -> Schema:
    if is_open:
        return {"type": "number", "exclusiveMinimum": lo, "exclusiveMaximum": hi}
    return {"type": "number", "minimum": lo, "maximum": hi}


def _op(summary: str, body: Schema | None, ok: Schema, *codes: int) -> Schema:
    op: Schema = {"summary": summary, "responses": {"200": ok, **_errors(*codes)}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _any(variants: list[Schema]) -> Schema:
    variants = [v for v in variants if v is not NEVER]
    if not variants:
        return NEVER
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def voice_names(specs: Sequence[ModelSpec]) -> list[str]:
    """The voice names every TTS model takes (voices and aliases): a name only some models
    take is left out, so a voice the document allows is one every TTS model accepts."""
    sets: list[set[str]] = []
    for spec in (s for s in specs if s.task == "tts"):
        adapter = cast(SpeechAdapter, registry.family(spec.family).adapter())
        sets.append({*adapter.voices(), *adapter.aliases(spec.extra)})
    return sorted(set.intersection(*sets)) if sets else list(registry.voices())


def speech_fields(config: ServerConfig, voices: Sequence[str]) -> Schema:
    """A TTS request's fields (without ``model``); ``voice`` one of ``voices``."""
    return {
        "input": {
            "type": "string",
            "minLength": 1,
            "maxLength": config.max_input_chars,
            "pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
        },
        "voice": _enum(voices),
        **{k: _range(lo, hi) for k, (lo, hi) in SPEECH_RANGES.items()},
        "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
    }


def speech_body(
    config: ServerConfig,
    tts: Sequence[str],
    streaming: Sequence[str],
    voices: Sequence[str],
) -> Schema:
    """``/v1/audio/speech``: any TTS model unstreamed; streaming-mode ones may stream."""
    common = {
        **speech_fields(config, voices),
        "response_format": _enum(SPEECH_FORMATS),
        "busy_timeout_ms": BUSY_TIMEOUT,
    }
    plain = (
        _obj(
            {"model": _enum(tts), **common, "stream": {"const": False}, "stream_format": False},
            ["model", "input"],
        )
        if tts
        else NEVER
    )
    streamed = (
        _obj(
            {
                "model": _enum(streaming),
                **common,
                "stream": B,
                "stream_format": _enum(("sse", "audio")),
            },
            ["model", "input"],
        )
        if streaming
        else NEVER
    )
    return _any([plain, streamed])


def audio_fields() -> Schema:
    """The audio source of an ASR/VAD request in JSON (one of them is required)."""
    return {
        "audio_base64": {
            "type": "string",
            "contentEncoding": "base64",
            "contentMediaType": "audio/*",
        },
        "audio_path": {"type": "string", "minLength": 1, "pattern": "^[^\\x00]+$"},
    }


AUDIO_SOURCE: list[Schema] = [{"required": ["audio_base64"]}, {"required": ["audio_path"]}]


def asr_fields() -> Schema:
    granularities = {
        "type": "array",
        "items": _enum(TIMESTAMP_GRANULARITIES),
        "maxItems": MAX_GRANULARITIES,
    }
    return {
        "language": _enum(("", *LANGUAGES)),
        "prompt": {"type": "string", "maxLength": MAX_PROMPT_CHARS},
        "text": {"type": "string", "maxLength": MAX_PROMPT_CHARS},
        "temperature": _range(*TEMPERATURE_RANGE),
        "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
        "timestamp_granularities": granularities,
        "timestamp_granularities[]": granularities,
        "vad_chunking": B,
    }


def vad_fields() -> Schema:
    ranges = {k: _range(lo, hi, k in VAD_OPEN) for k, (lo, hi) in VAD_RANGES.items()}
    return ranges | {"include_probabilities": B}


def task_request(task: str, config: ServerConfig, voices: Sequence[str]) -> Schema:
    """The ``request`` object of a generic task (``/v1/tasks/*``) for a model of ``task``."""
    if task == "tts":
        return _obj(speech_fields(config, voices), ["input"])
    fields = {**audio_fields(), **(asr_fields() if task == "asr" else vad_fields())}
    return {**_obj(fields), "anyOf": AUDIO_SOURCE}


def audio_route(task: str, models: Sequence[str], formats: Sequence[str] | None) -> Schema:
    """``/v1/audio/transcriptions`` or ``/v1/audio/vad``: JSON or multipart."""
    if not models:
        return {"application/json": {"schema": NEVER}}
    extra = asr_fields() if task == "asr" else vad_fields()
    fmt = {"response_format": _enum(formats)} if formats else {}
    json_body = {
        **_obj(
            {
                "model": _enum(models),
                **audio_fields(),
                **extra,
                **fmt,
                "stream": B,
                "busy_timeout_ms": BUSY_TIMEOUT,
            },
            ["model"],
        ),
        "anyOf": AUDIO_SOURCE,
    }
    form_extra: Schema = (
        {
            "language": extra["language"],
            "prompt": extra["prompt"],
            # 0 to 1 as a plain decimal; each repeat of timestamp_granularities[] is one value
            "temperature": {"type": "string", "pattern": "^(0(\\.[0-9]{1,6})?|1(\\.0{1,6})?)$"},
            "seed": {"type": "string", "pattern": "^[0-9]{1,19}$"},
            "timestamp_granularities[]": _enum(TIMESTAMP_GRANULARITIES),
            "timestamp_granularities": _enum(TIMESTAMP_GRANULARITIES),
            "vad_chunking": _enum(FORM_BOOLEANS),
        }
        if task == "asr"
        else {
            "threshold": {"type": "string", "pattern": "^0\\.[0-9]{0,5}[1-9]$"},  # (0, 1)
            **{
                k: {"type": "string", "pattern": "^[0-9]{1,6}$"}
                for k in VAD_RANGES
                if k != "threshold"
            },
            "include_probabilities": _enum(FORM_BOOLEANS),
        }
    )
    form = _obj(
        {
            "file": {"type": "string", "format": "binary", "contentMediaType": "audio/*"},
            "model": _enum(models),
            **form_extra,
            **fmt,
            "stream": _enum(FORM_BOOLEANS),
            "busy_timeout_ms": {"type": "string", "pattern": "^[0-9]{1,15}$"},
        },
        ["file", "model"],
    )
    return {"application/json": {"schema": json_body}, "multipart/form-data": {"schema": form}}


def by_task(
    specs: Sequence[ModelSpec], config: ServerConfig, *, field: str, wrap: Schema, ok: Any
) -> Schema:
    """One variant per task.

    ``model`` among that task's models passing ``ok``, ``field`` its request.
    """
    variants = []
    for task in ("tts", "asr", "vad"):
        ids = [s.id for s in specs if s.task == task and ok(s)]
        if ids:
            inner = task_request(task, config, voice_names(specs))
            value = {**wrap, "items": inner} if wrap else inner
            variants.append(
                _obj(
                    {"model": _enum(ids), field: value, "busy_timeout_ms": BUSY_TIMEOUT},
                    ["model", field],
                )
            )
    return _any(variants)


def load_body(config: ServerConfig, specs: Sequence[ModelSpec]) -> Schema:
    """``/v1/models/load``: a subset of what it takes (a ``models[]`` entry,
    :data:`server.config.MODEL_KEYS`), every body of which it accepts.

    A family with its own ``load_options``, or an existing id reconfigured (its family
    left out or the same).
    """
    slots: Schema | bool = (
        {"type": "integer", "minimum": 1, "maximum": 16}
        if config.runtime is RuntimeKind.PARALLEL
        else False
    )
    common: Schema = {"mode": _enum(MODES), "slots": slots, "session_options": OBJ}
    variants = []
    for entry in registry.entries():
        options = {
            k: _enum(v) for k, v in entry.load_options.items() if v is not None
        }  # paths must exist: left out
        props = {
            "id": {"type": "string", "pattern": f"^{MODEL_ID.pattern}$"},
            "family": {"const": entry.name},
            "task": {"const": entry.task},
            **common,
            "load_options": _obj(options, closed=True),
        }  # no path: a family with one takes an existing model directory, the others none
        if entry.batching:
            props["batching"] = {"type": "boolean"}
        variants.append(_obj(props, ["id", "family"], closed=True))
    if specs:
        variants.append(_obj({"id": _enum([s.id for s in specs]), **common}, ["id"], closed=True))
    return {"anyOf": variants}


def build_spec(config: ServerConfig, specs: Sequence[ModelSpec]) -> Schema:
    """The OpenAPI document for ``config`` with ``specs`` registered."""
    ids = {t: [s.id for s in specs if s.task == t] for t in ("tts", "asr", "vad")}
    streaming_tts = [s.id for s in specs if s.task == "tts" and s.mode == "streaming"]
    model_row = _obj(
        {
            "id": S,
            "object": S,
            "created": {
                "type": "integer",
                "description": "Unix seconds: when the model's configuration was registered",
            },
            "owned_by": S,
            "family": S,
            "task": S,
            "mode": S,
            "backend": S,
            "slots": {"type": "integer"},
            "active_slots": {"type": "integer"},
            "queued_requests": {"type": "integer"},
            "queued_management": {"type": "integer"},
            "max_parallel_slots": {"type": ["integer", "null"]},
            "batching": B,
            "held_members": {
                "type": "integer",
                "description": "a loaded batching model only: members waiting for their "
                "clients to read what they decoded (they decode no further until then)",
            },
            "loaded": B,
            "state": S,
            "path": {
                "type": "string",
                "description": "only for an authenticated management client",
            },
        }
    )
    sse = {"description": "server-sent events", "content": {"text/event-stream": {"schema": S}}}
    task_run = by_task(specs, config, field="request", wrap={}, ok=lambda s: True)
    task_batch = by_task(
        specs,
        config,
        field="requests",
        wrap={"type": "array", "minItems": 1, "maxItems": MAX_BATCH},
        ok=lambda s: s.task != "tts" or s.mode == "offline",
    )
    task_stream = by_task(
        specs,
        config,
        field="request",
        wrap={},
        ok=lambda s: s.task != "tts" or s.mode == "streaming",
    )
    if task_stream is not NEVER:
        for variant in task_stream.get("anyOf", [task_stream]):
            variant["properties"]["stream_format"] = {"const": "json"}
    paths: Schema = {
        "/health": {
            "get": _op(
                "Liveness and backend", None, {"description": "ok", **_json(_obj({"status": S}))}
            )
        },
        "/v1/models": {
            "get": _op(
                "Registered models and their slots (paths only for a management client)",
                None,
                {
                    "description": "list",
                    **_json(_obj({"object": S, "data": {"type": "array", "items": model_row}})),
                },
            )
        },
        "/v1/models/{id}": {
            "get": {
                **_op(
                    "One registered model: its /v1/models row",
                    None,
                    {"description": "the model", **_json(model_row)},
                    404,
                ),
                "parameters": [{"name": "id", "in": "path", "required": True, "schema": S}],
            }
        },
        "/v1/audio/speech": {
            "post": _op(
                "Text to speech (MP3, Opus, AAC, FLAC, WAV, PCM, JSON; SSE or raw streaming)",
                {
                    "application/json": {
                        "schema": speech_body(config, ids["tts"], streaming_tts, voice_names(specs))
                    }
                },
                {
                    "description": "audio",
                    "content": {
                        **{f.content_type: {} for f in SPEECH_AUDIO.values()},
                        "application/json": {},
                        "text/event-stream": {},
                    },
                },
                400,
                404,
                413,
                503,
            )
        },
        "/v1/audio/transcriptions": {
            "post": _op(
                "Speech recognition (JSON or multipart; SSE with stream)",
                audio_route("asr", ids["asr"], TRANSCRIPT_FORMATS),
                {"description": "transcript", **_json(_obj({"text": S}))},
                400,
                404,
                413,
                503,
            )
        },
        "/v1/audio/vad": {
            "post": _op(
                "Voice activity: speech segments (SSE events with stream)",
                audio_route("vad", ids["vad"], None),
                {"description": "segments", **_json(_obj({"segments": {"type": "array"}}))},
                400,
                404,
                413,
                503,
            )
        },
        "/v1/audio/voices": {
            "get": {
                **_op(
                    "Voices of the TTS models (or of one)",
                    None,
                    {
                        "description": "voices, and the aliases of each TTS model",
                        **_json(_obj({"voices": ARR_S, "aliases": OBJ, "models": OBJ})),
                    },
                    400,
                    404,
                ),
                "parameters": [
                    {"name": "model", "in": "query", "required": False, "schema": _enum(ids["tts"])}
                ],
            }
        },
        "/v1/tasks/run": {
            "post": _op(
                "Run one task request",
                {"application/json": {"schema": task_run}},
                {"description": "result", **_json(OBJ)},
                400,
                404,
                413,
                503,
            )
        },
        "/v1/tasks/batch": {
            "post": _op(
                "Native batch; SSE results by index",
                {"application/json": {"schema": task_batch}},
                sse,
                400,
                404,
                413,
                503,
            )
        },
        "/v1/tasks/stream": {
            "post": _op(
                "Streamed run collected as JSON events",
                {"application/json": {"schema": task_stream}},
                {"description": "events", **_json(_obj({"events": {"type": "array"}}))},
                400,
                404,
                413,
                503,
            )
        },
        "/v1/models/load": {
            "post": _op(
                "Register, reconfigure or load a model (management)",
                {"application/json": {"schema": load_body(config, specs)}},
                {"description": "loaded", **_json(_obj({"id": S, "loaded": B, "reconfigured": B}))},
                400,
                403,
                409,
                413,
                503,
            )
        },
        "/v1/models/unload": {
            "post": _op(
                "Unload a model (management)",
                {
                    "application/json": {
                        "schema": _obj({"id": {"type": "string", "minLength": 1}}, ["id"])
                    }
                },
                {"description": "unloaded", **_json(_obj({"id": S, "loaded": B}))},
                400,
                403,
                404,
                413,
                503,
            )
        },
        "/v1/tasks/unload_models": {
            "post": _op(
                "Bulk unload of listed models (management)",
                {
                    "application/json": {
                        "schema": _obj(
                            {"model_ids": {**ARR_S, "maxItems": MAX_BULK_IDS}}, ["model_ids"]
                        )
                    }
                },
                {"description": "unloaded", **_json(_obj({"unloaded": ARR_S, "not_found": ARR_S}))},
                400,
                403,
                413,
            )
        },
        "/v1/tasks/unload_all_models": {
            "post": _op(
                "Bulk unload of every model (management)",
                None,
                {"description": "unloaded", **_json(_obj({"unloaded": ARR_S}))},
                403,
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                None,
                {"description": "text exposition format", "content": {"text/plain": {}}},
            )
        },
        "/openapi.json": {
            "get": _op("This document", None, {"description": "OpenAPI 3.1", **_json(OBJ)})
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "voxpool",
            "version": "0.1.0",
            "description": (
                "Audio models (TTS, ASR, VAD) with parallel per-model session slots; "
                "audio.cpp-compatible."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": {
                "Error": _obj(
                    {
                        "error": _obj(
                            {
                                "message": S,
                                "type": _enum(ERROR_TYPES),
                                "request_id": {
                                    "type": "string",
                                    "description": "500 only: find the details in the server log",
                                },
                            },
                            ["message", "type"],
                        )
                    },
                    ["error"],
                )
            }
        },
    }
