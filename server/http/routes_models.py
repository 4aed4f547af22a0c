"""Model routes: health, the model list, management (load, unload, bulk), metrics, OpenAPI."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from core.policy import MISSING, Invalid, validate_slots_for_runtime
from server.config import MODES, ConfigError, parse_model
from server.families import registry
from server.http.body import json_object
from server.http.errors import bad, show
from server.http.openapi import MAX_BULK_IDS, MAX_ID_CHARS, MODEL_ID, build_spec
from server.http.routes_audio import state_of
from server.http.state import ServerState


async def health(request: Request) -> Response:
    st = state_of(request)
    return JSONResponse(
        {
            "status": "ok",
            "backend": st.backend,
            "models": len(st.runtime.specs),
            "runtime": st.config.runtime.value,
            "management": st.config.ui_management,
        }
    )


async def models(request: Request) -> Response:
    """Every model and its counters.

    Filesystem paths only for an authenticated management client.
    """
    st = state_of(request)
    return JSONResponse({"object": "list", "data": model_rows(st, st.is_manager(request))})


def model_rows(st: ServerState, manager: bool) -> list[dict[str, Any]]:
    """``/v1/models``'s rows: every model's spec and counters (paths for a manager only)."""
    data = []
    for row in st.runtime.status():
        spec = st.runtime.specs[row.id]
        data.append(
            {
                "id": row.id,
                "object": "model",
                "owned_by": "voxpool",
                "family": spec.family,
                "task": spec.task,
                "mode": spec.mode,
                "backend": spec.backend,
                "slots": row.slots,
                "active_slots": row.active_slots,
                "queued_requests": row.queued_requests,
                "queued_management": row.queued_management,
                "max_parallel_slots": row.max_parallel_slots,
                "batching": spec.batching,
                "loaded": row.loaded,
                "state": row.state,
                **({"path": spec.path} if manager else {}),
            }
        )
    return data


async def load(request: Request) -> Response:
    st = state_of(request)
    st.check_management(request)
    body = await json_object(request)
    model_id = body.get("id")
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id):
        raise bad(f"'id' is required: 1 to {MAX_ID_CHARS} letters, digits and . _ : -")
    family = body.get("family")
    existing = st.runtime.specs.get(model_id)
    if family is None and existing is not None:
        family = existing.family
    if not registry.is_family(family):
        raise bad(f"unknown family {show(family)} ({registry.listing()})")
    if body.get("mode", "offline") not in MODES:
        raise bad("mode must be 'offline' or 'streaming'")
    slots = body.get("slots", MISSING)
    if (
        isinstance(slots, float) and slots.is_integer()
    ):  # JSON has one number type: 2.0 is the integer 2
        slots = body["slots"] = int(slots)
    checked = validate_slots_for_runtime(st.config.runtime, slots)
    if isinstance(checked, Invalid):
        raise bad(checked.message)
    raw: dict[str, Any] = {
        k: v
        for k, v in body.items()
        if k in ("id", "family", "task", "mode", "path", "load_options", "session_options", "slots")
    }
    raw["family"] = family
    server_defaults = {"backend": st.config.backend, "device": st.config.device, "lazy_load": True}
    try:
        model = parse_model(raw, server_defaults, st.config.runtime, None)
    except ConfigError as exc:
        raise bad(str(exc)) from exc
    reconfigured = await st.runtime.register(model.spec())
    return JSONResponse({"id": model_id, "loaded": True, "reconfigured": reconfigured})


async def unload(request: Request) -> Response:
    st = state_of(request)
    st.check_management(request)
    body = await json_object(request)
    spec = st.spec(body.get("id"), field="id")
    await st.runtime.unload(spec.id)
    return JSONResponse({"id": spec.id, "loaded": False})


async def unload_models(request: Request) -> Response:
    st = state_of(request)
    st.check_management(request)
    body = await json_object(request)
    ids = body.get("model_ids")
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_BULK_IDS
        or not all(isinstance(i, str) for i in ids)
    ):
        raise bad(f"request requires a 'model_ids' string array (at most {MAX_BULK_IDS} ids)")
    result = await st.runtime.bulk_unload(ids)
    return JSONResponse({"unloaded": list(result.unloaded), "not_found": list(result.not_found)})


async def unload_all(request: Request) -> Response:
    st = state_of(request)
    st.check_management(request)
    result = await st.runtime.bulk_unload(None)
    return JSONResponse({"unloaded": list(result.unloaded)})


async def metrics(request: Request) -> Response:
    st = state_of(request)
    return Response(st.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(request: Request) -> Response:
    """The OpenAPI document of this server as it is now (its models, limits and management)."""
    st = state_of(request)
    return JSONResponse(build_spec(st.config, list(st.runtime.specs.values())))
