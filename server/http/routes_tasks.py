"""Generic task routes: run one request, a native batch (SSE), a stream collected."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.families import bad, timing
from server.http.body import busy_timeout, json_object
from server.http.routes_audio import audio_input, open_leased_stream, state_of
from server.http.state import ServerState
from server.http.streaming import LeasedResponse, sse_events
from server.runtime.ports import ModelSpec

MAX_BATCH = 64


def inner(body: Mapping[str, Any]) -> dict[str, Any]:
    """The task request: ``request`` if given (an object), else the body itself."""
    req = body.get("request", body)
    if not isinstance(req, Mapping):
        raise bad("'request' must be an object")
    return dict(req)


async def build(st: ServerState, spec: ModelSpec, req: dict[str, Any]) -> Any:
    adapter = st.adapter(spec)
    if spec.task == "tts":
        if "text" in req and "input" not in req:
            req["input"] = req["text"]
        return adapter.request(req, spec.extra.get("default_request_options", {}))
    audio = await audio_input(st, req, None, None, adapter.sample_rate)
    return adapter.request(req, audio)


def result_json(st: ServerState, spec: ModelSpec, result: Any) -> dict[str, Any]:
    return dict(st.adapter(spec).json(result))


async def run(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    req = await build(st, spec, inner(body))
    t0 = time.perf_counter()
    result = await st.runtime.run(spec.id, req, busy_timeout(body))
    payload = result_json(st, spec, result)
    payload["timing"] = timing(time.perf_counter() - t0, st.adapter(spec).duration(result))
    return JSONResponse(payload)


async def batch(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    raw = body.get("requests")
    if not isinstance(raw, list) or not raw:
        raise bad("'requests' must be a non-empty array of request objects")
    if len(raw) > MAX_BATCH:
        raise bad(f"at most {MAX_BATCH} requests per batch")
    if not all(isinstance(r, Mapping) for r in raw):
        raise bad("every entry of 'requests' must be an object")
    st.adapter(spec).check(spec.id, spec.mode, "batch")
    reqs = [await build(st, spec, dict(r)) for r in raw]
    stack = AsyncExitStack()
    try:
        held = await stack.enter_async_context(st.runtime.acquire(spec.id, busy_timeout(body)))
    except BaseException:
        await stack.aclose()
        raise
    t0 = time.perf_counter()

    async def events() -> AsyncIterator[dict[str, Any]]:
        results = await st.runtime.batch_on(held, reqs)
        total = 0.0
        for i, result in enumerate(results):
            total += st.adapter(spec).duration(result)
            yield {"type": "task.batch.result", "index": i, "result": {**result_json(st, spec, result), "timing": None}}
        yield {"type": "task.batch.done", "result_count": len(results), "timing": timing(time.perf_counter() - t0, total)}

    return LeasedResponse(sse_events(events()), stack, "text/event-stream")


async def stream(request: Request) -> Response:
    st = state_of(request)
    body = await json_object(request)
    spec = st.spec(body.get("model"))
    request.state.model = spec.id  # the latency metric's label
    sf = body.get("stream_format")
    if sf is not None and sf != "json":
        raise bad("task stream returns one JSON document; stream_format must be omitted or 'json'")
    st.adapter(spec).check(spec.id, spec.mode, "stream")
    req = await build(st, spec, inner(body))
    stack, chunks = await open_leased_stream(st, spec.id, req, busy_timeout(body))
    events: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    first: float | None = None
    async with stack:
        async for chunk in chunks:
            if first is None:
                first = time.perf_counter() - t0
            events.append({**st.adapter(spec).chunk_json(chunk), "is_final": False})
    if events:
        events[-1]["is_final"] = True
    ttft = None if first is None else round(first * 1000.0, 3)
    return JSONResponse({"events": events, "result": {"timing": {"ttft_ms": ttft, "wall_ms": round((time.perf_counter() - t0) * 1000, 3)}}})


__all__ = ["batch", "run", "stream"]
