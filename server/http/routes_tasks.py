"""Generic task routes: run one request, a native batch (SSE), a stream collected."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.to_thread
import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.audio_errors import PER_REQUEST
from server.families.http import (
    MAX_BATCH,
    no_speech_error,
    server_timing,
    speech_limit_error,
    timing,
)
from server.families.registry import limit_errors
from server.http.body import busy_timeout, json_object
from server.http.errors import bad, show
from server.http.routes_audio import audio_input, open_leased_stream, state_of
from server.http.state import ServerState
from server.http.streaming import sse_response
from server.runtime.phases import Phases
from server.runtime.ports import ModelSpec


def inner(body: Mapping[str, Any]) -> dict[str, Any]:
    """The task request: ``request`` if given (an object), else the body itself (the
    reference's rule, §1.3.4: its CLI request-sequence format puts the fields at the top)."""
    req = body.get("request", body)
    if not isinstance(req, Mapping):
        raise bad("'request' must be an object")
    return dict(req)


async def build(
    st: ServerState,
    spec: ModelSpec,
    req: dict[str, Any],
    audio_seconds: float,
    bound: str = PER_REQUEST,
) -> Any:
    """The family request of a task request; audio may be at most ``audio_seconds`` long
    (``bound`` says why, in the 400). A ``model`` inside it must be the model it runs on
    (400, not silently another)."""
    named = req.get("model")
    if named is not None and named != spec.id:
        raise bad(
            f"the request names model {show(named)} but is sent to model '{spec.id}': "
            "leave 'model' out of the request, or make it the same"
        )
    adapter = st.adapter(spec)
    if spec.task == "tts":
        if "text" in req and "input" not in req:
            req["input"] = req["text"]
        defaults = spec.extra.get("default_request_options", {})
        return adapter.request(req, defaults, st.config, adapter.aliases(spec.extra))
    adapter.check_fields(req)
    audio = await audio_input(st, req, None, None, adapter.sample_rate, audio_seconds, bound)
    return adapter.request(req, audio)


def result_json(st: ServerState, spec: ModelSpec, result: Any) -> dict[str, Any]:
    return dict(st.adapter(spec).json(result))


async def run(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    timeout = busy_timeout(body)
    req = await build(st, spec, inner(body), st.config.max_audio_seconds)
    t0 = time.perf_counter()
    phases = Phases()
    try:
        result = await st.runtime.run(spec.id, req, timeout, phases=phases)
    except limit_errors() as exc:
        raise speech_limit_error(exc, st.config) from None
    if spec.task == "tts" and st.adapter(spec).duration(result) == 0:
        raise no_speech_error()
    payload = await anyio.to_thread.run_sync(result_json, st, spec, result)
    wall = time.perf_counter() - t0
    payload["timing"] = timing(wall, st.adapter(spec).duration(result), phases)
    return JSONResponse(payload, headers=server_timing(phases))


async def batch_requests(
    st: ServerState, spec: ModelSpec, raw: list[Mapping[str, Any]]
) -> list[Any]:
    """Every entry's family request, sharing one request's limits: at most ``max_audio_seconds``
    of input audio in all, and ``max_speech_seconds`` of speech shared in proportion to each
    entry's text (each entry also keeps its own per-character bound)."""
    reqs: list[Any] = []
    most = audio_left = st.config.max_audio_seconds
    for index, entry in enumerate(raw):
        bound = PER_REQUEST
        if audio_left < most:
            bound = (
                f"for requests[{index}]: the entries of a batch share "
                f"max_audio_seconds={most:g}, and those before it took {most - audio_left:.1f} s"
            )
        req = await build(st, spec, dict(entry), audio_left, bound)
        audio = getattr(req, "audio", None)
        if audio is not None:
            audio_left -= audio.size / st.adapter(spec).sample_rate
        reqs.append(req)
    if spec.task == "tts":
        chars = sum(len(r.text) for r in reqs)
        share = st.config.max_speech_seconds / chars
        reqs = [attrs.evolve(r, max_seconds=min(r.max_seconds, share * len(r.text))) for r in reqs]
    return reqs


async def batch(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    timeout = busy_timeout(body)
    raw = body.get("requests")
    if not isinstance(raw, list) or not raw:
        raise bad("'requests' must be a non-empty array of request objects")
    if len(raw) > MAX_BATCH:
        raise bad(f"at most {MAX_BATCH} requests per batch")
    if not all(isinstance(r, Mapping) for r in raw):
        raise bad("every entry of 'requests' must be an object")
    st.adapter(spec).check(spec.id, spec.mode, "batch")
    reqs = await batch_requests(st, spec, raw)
    stack = AsyncExitStack()
    try:
        held = await stack.enter_async_context(st.runtime.acquire(spec.id, timeout))
    except BaseException:
        await stack.aclose()
        raise
    t0 = time.perf_counter()

    async def events() -> AsyncIterator[dict[str, Any]]:
        try:
            results = await st.runtime.batch_on(held, reqs)
        except limit_errors() as exc:
            raise speech_limit_error(exc, st.config) from None
        total = 0.0
        for i, result in enumerate(results):
            total += st.adapter(spec).duration(result)
            yield {
                "type": "task.batch.result",
                "index": i,
                "result": {**result_json(st, spec, result), "timing": None},
            }
        yield {
            "type": "task.batch.done",
            "result_count": len(results),
            "timing": timing(time.perf_counter() - t0, total),
        }

    return sse_response(events(), stack)


async def stream(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    timeout = busy_timeout(body)
    sf = body.get("stream_format")
    if sf is not None and sf != "json":
        raise bad("task stream returns one JSON document; stream_format must be omitted or 'json'")
    st.adapter(spec).check(spec.id, spec.mode, "stream")
    req = await build(st, spec, inner(body), st.config.max_audio_seconds)
    stack, chunks = await open_leased_stream(st, spec.id, req, timeout)
    events: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    first: float | None = None
    async with stack:
        try:
            async for chunk in chunks:
                if first is None:
                    first = time.perf_counter() - t0
                events.append({**st.adapter(spec).chunk_json(chunk), "is_final": False})
        except limit_errors() as exc:
            raise speech_limit_error(exc, st.config) from None
    if spec.task == "tts" and not events:
        raise no_speech_error()
    if events:
        events[-1]["is_final"] = True
    ttft = None if first is None else round(first * 1000.0, 3)
    return JSONResponse(
        {
            "events": events,
            "result": {
                "timing": {"ttft_ms": ttft, "wall_ms": round((time.perf_counter() - t0) * 1000, 3)}
            },
        }
    )


__all__ = ["batch", "run", "stream"]
