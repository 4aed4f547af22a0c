"""Audio routes: speech (TTS), transcriptions (ASR), voices, voice activity (VAD)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from server.audio import AudioError, b64decode, b64encode, load_for_model, wav_bytes
from server.audio_errors import PER_REQUEST, AudioLimitError
from server.codecs import SPEECH_AUDIO, StreamEncoder, encode_speech, output_rate
from server.families.http import (
    SPEECH_FORMATS,
    TRANSCRIPT_FORMATS,
    no_speech_error,
    server_timing,
    speech_limit_error,
    timing,
)
from server.families.registry import limit_errors
from server.http.body import (
    boolean,
    busy_timeout,
    check_json_or_multipart,
    choice,
    form_fields,
    is_multipart,
    json_object,
)
from server.http.errors import bad
from server.http.state import ServerState
from server.http.streaming import LeasedResponse, sse_response
from server.runtime.phases import Phases


def state_of(request: Request) -> ServerState:
    state: ServerState = request.app.state.vox
    return state


async def open_leased_stream(
    st: ServerState, model: str, req: Any, timeout: int | None
) -> tuple[AsyncExitStack, AsyncIterator[Any]]:
    """Acquire the lease (503 before any header) and start the stream."""
    stack = AsyncExitStack()
    try:
        chunks = await stack.enter_async_context(st.runtime.open_stream(model, req, timeout))
    except BaseException:
        await stack.aclose()
        raise
    return stack, chunks


async def speech(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"), "tts")
    request.state.model = spec.id  # the latency metric's label
    adapter = st.adapter(spec)
    defaults = spec.extra.get("default_request_options", {})
    req = adapter.request(body, defaults, st.config, adapter.aliases(spec.extra))
    timeout = busy_timeout(body)
    # WAV unless the model's default_request_options say otherwise (docs/server.md: the
    # openai client sends no response_format unless asked, and OpenAI's default is mp3)
    fmt = choice(body, "response_format", SPEECH_FORMATS, defaults.get("response_format", "wav"))
    assert fmt is not None
    stream = boolean(body, "stream")
    if body.get("stream_format") is not None or stream:
        stream_format = choice(body, "stream_format", ("sse", "audio"), "sse")
        assert stream_format is not None
        adapter.check(spec.id, spec.mode, "stream")
        return await speech_stream(st, spec.id, req, timeout, stream_format, fmt)
    t0 = time.perf_counter()
    phases = Phases()
    try:
        result = await st.runtime.run(spec.id, req, timeout, phases=phases)
    except limit_errors() as exc:
        raise speech_limit_error(exc, st.config) from None
    wall = time.perf_counter() - t0
    audio, rate = adapter.audio(result)
    if audio.size == 0:
        raise no_speech_error()
    info = timing(wall, audio.size / rate, phases)
    # encoding (up to max_speech_seconds of audio) happens off the event loop
    if fmt in ("json", "b64_json"):
        payload = await anyio.to_thread.run_sync(_speech_json, audio, rate, info)
        return Response(payload, media_type="application/json", headers=server_timing(phases))
    headers = {
        **server_timing(phases),
        "X-Voxpool-Wall-Ms": str(info["wall_ms"]),
        "X-Voxpool-Audio-Duration-Ms": str(info["audio_duration_ms"]),
        "X-Voxpool-Sample-Rate": str(output_rate(fmt, rate)),
    }
    return Response(
        await anyio.to_thread.run_sync(encode_speech, audio, rate, fmt),
        media_type=SPEECH_AUDIO[fmt].content_type,
        headers=headers,
    )


def _speech_json(audio: Any, rate: int, info: dict[str, Any]) -> bytes:
    payload = {
        "audio": b64encode(wav_bytes(audio, rate)),
        "format": "wav",
        "sample_rate": rate,
        "timing": info,
    }
    return json.dumps(payload, separators=(",", ":")).encode()


async def speech_stream(
    st: ServerState, model: str, req: Any, timeout: int | None, stream_format: str, fmt: str
) -> Response:
    stack, chunks = await open_leased_stream(st, model, req, timeout)
    t0 = time.perf_counter()
    try:  # the first sentence before any header: a limit it breaks is still a plain 400
        head = [await anext(chunks)]
    except StopAsyncIteration:
        head = []
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await stack.aclose()
        if isinstance(exc, limit_errors()):
            raise speech_limit_error(exc, st.config) from None
        raise
    ttft = time.perf_counter() - t0
    if not head:
        await stack.aclose()
        raise no_speech_error()

    async def limited() -> AsyncIterator[Any]:
        for chunk in head:
            yield chunk
        try:
            async for chunk in chunks:
                yield chunk
        except limit_errors() as exc:  # a later sentence: the error event (or cut) says which
            raise speech_limit_error(exc, st.config) from None

    rate = int(head[0].sample_rate)
    if stream_format == "sse":
        # deltas: bare PCM for wav and pcm (as before), else pieces of the format's stream
        delta_fmt = fmt if fmt in SPEECH_AUDIO and fmt not in ("wav", "pcm") else "pcm"

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for data in encoded(limited(), delta_fmt, rate):
                yield {"type": "speech.audio.delta", "audio": b64encode(data)}
            yield {"type": "speech.audio.done", "timing": {"ttft_ms": round(ttft * 1000.0, 3)}}

        return sse_response(events(), stack)
    raw_fmt = fmt if fmt in SPEECH_AUDIO else "pcm"  # json/b64_json have no raw stream: PCM
    return LeasedResponse(
        encoded(limited(), raw_fmt, rate),
        stack,
        SPEECH_AUDIO[raw_fmt].content_type,
        {"X-Voxpool-Sample-Rate": str(output_rate(raw_fmt, rate))},
    )


async def encoded(chunks: AsyncIterator[Any], fmt: str, rate: int) -> AsyncIterator[bytes]:
    """The speech chunks as one stream in ``fmt`` (:class:`~server.codecs.StreamEncoder`),
    each piece as soon as the encoder gives it; encoding runs in a worker thread."""
    encoder = StreamEncoder(fmt, rate)
    try:
        async for chunk in chunks:
            data = await anyio.to_thread.run_sync(encoder.encode, chunk.audio)
            if data:
                yield data
        tail = await anyio.to_thread.run_sync(encoder.finish)
        if tail:
            yield tail
    finally:
        encoder.close()


AUDIO_SOURCES = ("audio_base64", "audio_path", "file", "audio")
"""A request's audio fields: base64, or a server-local path under one of three names."""


async def audio_input(
    st: ServerState,
    body: Mapping[str, Any],
    data: bytes | None,
    filename: str | None,
    rate: int,
    max_seconds: float,
    bound: str = PER_REQUEST,
) -> np.ndarray:
    """The request's audio at ``rate``: an uploaded file, base64, or a server-local path.

    Any format of :data:`server.codecs.INPUT_FORMATS`, recognised from its
    content (``filename`` is not consulted). Reading, base64, decoding and
    resampling run in a worker thread; audio longer than ``max_seconds`` is
    refused from its header (a WAV) or stated duration (other containers) before
    decoding, and a decode stops as soon as it passes ``max_seconds``; the 400 says
    ``bound`` set it.
    """
    encoded: str | None = None
    path: Any = None
    given = [k for k in AUDIO_SOURCES if body.get(k) is not None]
    if len(given) + (data is not None) > 1:
        named = ["an uploaded 'file'"] * (data is not None) + [f"'{k}'" for k in given]
        raise bad(f"give the audio one way only, not {' and '.join(named)}")
    if data is None:
        if body.get("audio_base64") is not None:
            encoded = body["audio_base64"]
            if not isinstance(encoded, str):
                raise bad("'audio_base64' must be a base64 string")
        else:
            path = next((body[k] for k in AUDIO_SOURCES[1:] if body.get(k) is not None), None)
            if path is None:
                raise bad("audio is required: upload a 'file', or give 'audio_base64'")

    def work() -> np.ndarray:
        try:
            raw = (
                data
                if data is not None
                else b64decode(encoded)
                if encoded is not None
                else st.local_audio(path)
            )
            if not raw:
                raise bad("the uploaded file is empty")
            return load_for_model(raw, rate, max_seconds)
        except AudioLimitError as exc:  # ``bound`` says what set ``max_seconds``
            raise bad(exc.message(bound)) from None
        except AudioError as exc:
            raise bad(str(exc)) from None

    return await anyio.to_thread.run_sync(work)


async def audio_request(
    request: Request,
) -> tuple[ServerState, dict[str, Any], bytes | None, str | None]:
    st = state_of(request)
    check_json_or_multipart(request)
    if is_multipart(request):
        fields, data, filename = await form_fields(request)
        if data is None:
            raise bad("multipart body needs a 'file' part")
        return st, fields, data, filename
    return st, await json_object(request), None, None


def srt_time(t: float, sep: str) -> str:
    ms = round(t * 1000)
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(result: Any, kind: str) -> str:
    lines = ["WEBVTT", ""] if kind == "vtt" else []
    sep = "." if kind == "vtt" else ","
    for i, seg in enumerate(result.segments, start=1):
        if kind == "srt":
            lines.append(str(i))
        lines.append(f"{srt_time(seg.start, sep)} --> {srt_time(seg.end, sep)}")
        lines.append(seg.text.strip())
        lines.append("")
    return "\n".join(lines)


async def transcriptions(request: Request) -> Response:
    st, body, data, filename = await audio_request(request)
    spec = st.spec(body.get("model"), "asr")
    request.state.model = spec.id  # the latency metric's label
    adapter = st.adapter(spec)
    timeout = busy_timeout(body)
    fmt = choice(body, "response_format", TRANSCRIPT_FORMATS, "json")
    stream = boolean(body, "stream")
    adapter.check_fields(body)
    audio = await audio_input(
        st, body, data, filename, adapter.sample_rate, st.config.max_audio_seconds
    )
    req = adapter.request(body, audio)
    if stream:
        stack, chunks = await open_leased_stream(st, spec.id, req, timeout)
        t0 = time.perf_counter()

        async def events() -> AsyncIterator[dict[str, Any]]:
            texts: list[str] = []
            first: float | None = None
            async for seg in chunks:
                if first is None:
                    first = time.perf_counter() - t0
                texts.append(seg.text)
                yield {
                    "type": "transcript.text.delta",
                    "delta": seg.text,
                    "segment": adapter.chunk_json(seg),
                }
            ttft = None if first is None else round(first * 1000.0, 3)
            yield {
                "type": "transcript.text.done",
                "text": "".join(texts).strip(),
                "timing": {"ttft_ms": ttft},
            }

        return sse_response(events(), stack)
    t0 = time.perf_counter()
    phases = Phases()
    result = await st.runtime.run(spec.id, req, timeout, phases=phases)
    info = timing(time.perf_counter() - t0, adapter.duration(result), phases)
    headers = server_timing(phases)
    if fmt == "text":
        return PlainTextResponse(result.text.strip() + "\n", headers=headers)
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(
            subtitles(result, fmt),
            media_type="text/vtt" if fmt == "vtt" else "application/x-subrip",
            headers=headers,
        )
    payload = {"text": result.text.strip(), "timing": info}
    if fmt == "verbose_json":
        payload.update(adapter.json(result))
        payload["task"] = "transcribe"
        payload["language"] = "english"
        payload["text"] = result.text.strip()
    return JSONResponse(payload, headers=headers)


async def vad(request: Request) -> Response:
    st, body, data, filename = await audio_request(request)
    spec = st.spec(body.get("model"), "vad")
    request.state.model = spec.id  # the latency metric's label
    adapter = st.adapter(spec)
    timeout = busy_timeout(body)
    stream = boolean(body, "stream")
    probabilities = boolean(body, "include_probabilities")
    adapter.check_fields(body)
    audio = await audio_input(
        st, body, data, filename, adapter.sample_rate, st.config.max_audio_seconds
    )
    req = adapter.request(body, audio)
    if stream:
        stack, chunks = await open_leased_stream(st, spec.id, req, timeout)

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for chunk in chunks:
                for event in chunk.events:
                    yield {
                        "type": f"vad.speech.{event.kind}",
                        "sample": int(event.sample),
                        "time": round(event.seconds, 4),
                    }
            yield {"type": "vad.done"}

        return sse_response(events(), stack)
    t0 = time.perf_counter()
    phases = Phases()
    result = await st.runtime.run(spec.id, req, timeout, phases=phases)
    payload = adapter.json(result, probabilities=probabilities)
    payload["timing"] = timing(time.perf_counter() - t0, adapter.duration(result), phases)
    return JSONResponse(payload, headers=server_timing(phases))


async def voices(request: Request) -> Response:
    st = state_of(request)
    model = request.query_params.get("model")
    if model is None:
        tts = [s for s in st.runtime.specs.values() if s.task == "tts"]
        names = sorted({v for s in tts for v in st.adapter(s).voices()})
        models = {
            s.id: {"voices": st.adapter(s).voices(), "aliases": st.adapter(s).aliases(s.extra)}
            for s in tts
        }
        return JSONResponse({"voices": names, "models": models})
    spec = st.spec(model, "tts")  # a model of another task is a 400, as on /v1/audio/speech
    adapter = st.adapter(spec)
    return JSONResponse({"voices": adapter.voices(), "aliases": adapter.aliases(spec.extra)})
