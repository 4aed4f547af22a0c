"""Model routes: health, the model list, management (load, unload, bulk), metrics, OpenAPI."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from core.policy import RuntimeKind
from server.config import (
    MODEL_ID_RULE,
    MODEL_KEYS,
    ConfigError,
    entry_of,
    is_model_id,
    parse_model,
    unknown_model_keys,
)
from server.families import registry
from server.http.body import json_object
from server.http.errors import ApiError, bad, show
from server.http.openapi import MAX_BULK_IDS, build_spec
from server.http.routes_audio import state_of
from server.http.state import ServerState
from server.runtime import ModelSpec


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


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}`` (OpenAI's ``models.retrieve``): the model's ``/v1/models`` row,
    or a 404 naming the id. The management routes' own paths under ``/v1/models/`` answer
    405 (they take POST), not "unknown model"."""
    st = state_of(request)
    model_id = request.path_params["id"]
    if model_id in ("load", "unload"):
        raise HTTPException(405, headers={"Allow": "POST"})
    for row in model_rows(st, st.is_manager(request)):
        if row["id"] == model_id:
            return JSONResponse(row)
    raise ApiError(404, f"unknown model id: {show(model_id)}", "not_found_error")


def model_rows(st: ServerState, manager: bool) -> list[dict[str, Any]]:
    """``/v1/models``'s rows: every model's spec and counters (paths for a manager only)."""
    data = []
    drivers = st.runtime.drivers
    for row in st.runtime.status():
        spec = st.runtime.specs[row.id]
        driver = drivers.get(row.id)
        data.append(
            {
                "id": row.id,
                "object": "model",
                "created": st.created(row.id),
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
                **({"held_members": driver.held_members} if driver is not None else {}),
                "loaded": row.loaded,
                "state": row.state,
                **({"path": spec.path} if manager else {}),
            }
        )
    return data


async def load(request: Request) -> Response:
    """Register and load a new id, or reconfigure an existing one.

    The body is a ``server.json`` ``models[]`` entry. A new id takes the server's defaults
    for what it leaves out (backend, device; it loads at once). For an existing id the
    body changes only the keys it gives: every other setting (mode, path, slots,
    batching, options, voice aliases, placement) stays what it is, and
    ``voice_aliases`` applies over the model's current table (null removes an alias). An
    id keeps its family: naming another one is refused (409). Unknown keys are refused.
    """
    st = state_of(request)
    st.check_management(request)
    body = await json_object(request)
    model_id = body.get("id")
    if not is_model_id(model_id):
        raise bad(f"'id' is required: {MODEL_ID_RULE}")
    unknown = unknown_model_keys(body)
    if unknown:
        raise bad(f"unknown keys {show(unknown)}: a load takes {', '.join(MODEL_KEYS)}")
    existing = st.runtime.specs.get(model_id)
    family = body.get("family", existing.family if existing is not None else None)
    if not registry.is_family(family):
        raise bad(f"unknown family {show(family)} ({registry.listing()})")
    if existing is not None and family != existing.family:
        raise ApiError(
            409,
            f"model {model_id!r} is a {existing.family} model: an id keeps its family "
            f"(load {family} under another id)",
        )
    if isinstance(body.get("slots"), float) and body["slots"].is_integer():
        body["slots"] = int(body["slots"])  # JSON has one number type: 2.0 is the integer 2
    if existing is None:
        raw: dict[str, Any] = dict(body)
        server_defaults: dict[str, Any] = {"backend": st.config.backend, "device": st.config.device}
    else:
        raw, server_defaults = merged_entry(existing, body, st.config.runtime), {}
    raw["family"] = family
    budget = {"memory_budget_mb": st.config.memory_budget_mb}  # a model over it never loads
    try:
        model = parse_model(
            raw, {**server_defaults, "lazy_load": True, **budget}, st.config.runtime, None
        )
    except ConfigError as exc:
        raise bad(str(exc)) from exc
    reconfigured = await st.runtime.register(model.spec())
    st.loaded_at[model_id] = int(time.time())
    return JSONResponse({"id": model_id, "loaded": True, "reconfigured": reconfigured})


def merged_entry(
    existing: ModelSpec, body: Mapping[str, Any], runtime: RuntimeKind
) -> dict[str, Any]:
    """The ``models[]`` entry a load of ``body`` makes of the registered ``existing``: its own
    settings with the body's keys over them, and a given ``voice_aliases`` object over its
    current table. On the original runtime (no ``--parallel-jobs``) a model's slot count
    is not a setting (always one; naming it is refused), so it is not carried over."""
    base = entry_of(existing)
    if runtime is not RuntimeKind.PARALLEL:
        base.pop("slots")
    raw = {**base, **body}
    given = body.get("voice_aliases")
    if isinstance(given, Mapping):
        raw["voice_aliases"] = {**base.get("voice_aliases", {}), **given}
    return raw


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
