"""Audio routes: speech (TTS), transcriptions (ASR), voices, voice activity (VAD)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from server.audio import (
    AudioError,
    b64decode,
    b64encode,
    load_for_model,
    pcm16,
    streaming_wav_header,
    wav_bytes,
)
from server.families import bad, timing
from server.http.body import boolean, busy_timeout, form_fields, is_multipart, json_object
from server.http.state import ServerState
from server.http.streaming import LeasedResponse, sse_events

SPEECH_FORMATS = ("wav", "pcm", "json", "b64_json")
TRANSCRIPT_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")


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
    req = adapter.request(body, spec.extra.get("default_request_options", {}))
    timeout = busy_timeout(body)
    fmt = body.get("response_format") or "wav"
    if fmt not in SPEECH_FORMATS:
        raise bad(f"unsupported response_format {fmt!r}; supported: {', '.join(SPEECH_FORMATS)}")
    stream_format = body.get("stream_format")
    if stream_format is not None or boolean(body, "stream"):
        stream_format = stream_format or "sse"
        if stream_format not in ("sse", "audio"):
            raise bad("stream_format must be 'sse' or 'audio'")
        adapter.check(spec.id, spec.mode, "stream")
        return await speech_stream(st, spec.id, req, timeout, stream_format, fmt)
    t0 = time.perf_counter()
    result = await st.runtime.run(spec.id, req, timeout)
    wall = time.perf_counter() - t0
    audio, rate = adapter.audio(result)
    info = timing(wall, audio.size / rate)
    if fmt in ("json", "b64_json"):
        return JSONResponse({"audio": b64encode(wav_bytes(audio, rate)), "format": "wav", "sample_rate": rate, "timing": info})
    headers = {
        "X-Voxpool-Wall-Ms": str(info["wall_ms"]),
        "X-Voxpool-Audio-Duration-Ms": str(info["audio_duration_ms"]),
        "X-Voxpool-Sample-Rate": str(rate),
    }
    if fmt == "pcm":
        return Response(pcm16(audio), media_type="audio/pcm", headers=headers)
    return Response(wav_bytes(audio, rate), media_type="audio/wav", headers=headers)


async def speech_stream(st: ServerState, model: str, req: Any, timeout: int | None, stream_format: str, fmt: str) -> Response:
    stack, chunks = await open_leased_stream(st, model, req, timeout)
    t0 = time.perf_counter()

    if stream_format == "sse":

        async def events() -> AsyncIterator[dict[str, Any]]:
            first: float | None = None
            async for chunk in chunks:
                if first is None:
                    first = time.perf_counter() - t0
                yield {"type": "speech.audio.delta", "audio": b64encode(pcm16(chunk.audio))}
            if first is None:
                raise ValueError("the model produced no audio")
            yield {"type": "speech.audio.done", "timing": {"ttft_ms": round(first * 1000.0, 3)}}

        return LeasedResponse(sse_events(events()), stack, "text/event-stream")

    async def audio() -> AsyncIterator[bytes]:
        header_sent = False
        async for chunk in chunks:
            if fmt == "wav" and not header_sent:
                header_sent = True
                yield streaming_wav_header(int(chunk.sample_rate))
            yield pcm16(chunk.audio)

    media = "audio/wav" if fmt == "wav" else "application/octet-stream"
    return LeasedResponse(audio(), stack, media)


async def audio_input(st: ServerState, body: dict[str, Any], data: bytes | None, filename: str | None, rate: int) -> Any:
    """The request's audio at ``rate``: an uploaded file, base64, or a server-local path."""
    if data is None:
        if body.get("audio_base64") is not None:
            try:
                data = b64decode(str(body["audio_base64"]))
            except AudioError as exc:
                raise bad(str(exc)) from exc
        else:
            path = next((body[k] for k in ("audio_path", "file", "audio") if body.get(k) is not None), None)
            if path is None:
                raise bad("audio is required: upload a 'file', or give 'audio_base64'")
            data = st.local_audio(path)
    if filename and "." in filename and not filename.lower().endswith(".wav"):
        raise bad("only WAV uploads are supported")
    if not data:
        raise bad("the uploaded file is empty")
    try:
        return load_for_model(data, rate)
    except AudioError as exc:
        raise bad(str(exc)) from exc


async def audio_request(request: Request) -> tuple[ServerState, dict[str, Any], bytes | None, str | None]:
    st = state_of(request)
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
    fmt = body.get("response_format") or "json"
    if fmt not in TRANSCRIPT_FORMATS:
        raise bad(f"unsupported response_format {fmt!r}; supported: {', '.join(TRANSCRIPT_FORMATS)}")
    audio = await audio_input(st, body, data, filename, adapter.sample_rate)
    req = adapter.request(body, audio)
    if boolean(body, "stream"):
        stack, chunks = await open_leased_stream(st, spec.id, req, timeout)
        t0 = time.perf_counter()

        async def events() -> AsyncIterator[dict[str, Any]]:
            texts: list[str] = []
            first: float | None = None
            async for seg in chunks:
                if first is None:
                    first = time.perf_counter() - t0
                texts.append(seg.text)
                yield {"type": "transcript.text.delta", "delta": seg.text, "segment": adapter.chunk_json(seg)}
            ttft = None if first is None else round(first * 1000.0, 3)
            yield {"type": "transcript.text.done", "text": "".join(texts).strip(), "timing": {"ttft_ms": ttft}}

        return LeasedResponse(sse_events(events()), stack, "text/event-stream")
    t0 = time.perf_counter()
    result = await st.runtime.run(spec.id, req, timeout)
    info = timing(time.perf_counter() - t0, adapter.duration(result))
    if fmt == "text":
        return PlainTextResponse(result.text.strip() + "\n")
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(subtitles(result, fmt), media_type="text/vtt" if fmt == "vtt" else "application/x-subrip")
    payload = {"text": result.text.strip(), "timing": info}
    if fmt == "verbose_json":
        payload.update(adapter.json(result))
        payload["task"] = "transcribe"
        payload["language"] = "english"
        payload["text"] = result.text.strip()
    return JSONResponse(payload)


async def vad(request: Request) -> Response:
    st, body, data, filename = await audio_request(request)
    spec = st.spec(body.get("model"), "vad")
    request.state.model = spec.id  # the latency metric's label
    adapter = st.adapter(spec)
    timeout = busy_timeout(body)
    audio = await audio_input(st, body, data, filename, adapter.sample_rate)
    req = adapter.request(body, audio)
    if boolean(body, "stream"):
        stack, chunks = await open_leased_stream(st, spec.id, req, timeout)

        async def events() -> AsyncIterator[dict[str, Any]]:
            async for chunk in chunks:
                for event in chunk.events:
                    yield {"type": f"vad.speech.{event.kind}", "sample": int(event.sample), "time": round(event.seconds, 4)}
            yield {"type": "vad.done"}

        return LeasedResponse(sse_events(events()), stack, "text/event-stream")
    t0 = time.perf_counter()
    result = await st.runtime.run(spec.id, req, timeout)
    payload = adapter.json(result, probabilities=boolean(body, "include_probabilities"))
    payload["timing"] = timing(time.perf_counter() - t0, adapter.duration(result))
    return JSONResponse(payload)


async def voices(request: Request) -> Response:
    st = state_of(request)
    model = request.query_params.get("model")
    if model is None:
        tts = [s for s in st.runtime.specs.values() if s.task == "tts"]
        names = sorted({v for s in tts for v in st.adapter(s).voices()})
        return JSONResponse({"voices": names})
    spec = st.spec(model)
    return JSONResponse({"voices": st.adapter(spec).voices()})
