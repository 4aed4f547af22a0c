"""Management requests for the whole fleet: posted once, run by every replica, answers merged.

``POST /v1/models/load``, ``/v1/models/unload``, ``/v1/tasks/unload_models``
and ``/v1/tasks/unload_all_models`` change what a replica has, so the ingress
does not send them to one replica: it posts them to the directory's command
log (:mod:`server.ray.directory`), waits until every live replica has run
the request through its own app, and answers with :func:`merge` of their
answers. Each replica checks the bearer token and the body itself, exactly as
``voxpool serve`` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from starlette.responses import Response

from server.http.errors import error_response
from server.ray.directory import Ack
from server.ray.exchange import Forwarded, Start, answer

MANAGEMENT = frozenset(
    {
        ("POST", "/v1/models/load"),
        ("POST", "/v1/models/unload"),
        ("POST", "/v1/tasks/unload_models"),
        ("POST", "/v1/tasks/unload_all_models"),
    }
)
"""The routes that go to every replica."""

POLL_S = 0.05
"""How often the ingress asks the directory whether every replica has answered."""


def is_management(request: Forwarded) -> bool:
    return (request.method, request.path) in MANAGEMENT


def merge(acks: Sequence[Ack]) -> tuple[Start, bytes]:
    """One answer from every replica's (in replica id order).

    The first failure, as that replica gave it; else the first answer with
    ``reconfigured`` true if any replica reconfigured, ``unloaded`` the models
    any replica unloaded, ``not_found`` the ids no replica knows, and
    ``replicas`` how many answered.
    """
    for ack in acks:
        if not 200 <= ack.status < 300:
            return _json(ack.status, ack.body)
    bodies = [json.loads(ack.body) for ack in acks]
    out: dict[str, Any] = dict(bodies[0])
    if "reconfigured" in out:
        out["reconfigured"] = any(b.get("reconfigured") for b in bodies)
    if "unloaded" in out:
        out["unloaded"] = list(dict.fromkeys(m for b in bodies for m in b["unloaded"]))
    if "not_found" in out:
        out["not_found"] = [m for m in out["not_found"] if all(m in b["not_found"] for b in bodies)]
    out["replicas"] = len(acks)
    return _json(200, json.dumps(out).encode())


def _json(status: int, body: bytes) -> tuple[Start, bytes]:
    return answer(Response(body, status, media_type="application/json"))


def _busy(message: str) -> tuple[Start, bytes]:
    return answer(error_response(503, message, "server_busy"))


async def broadcast(directory: Any, request: Forwarded, timeout_s: float) -> tuple[Start, bytes]:
    """Post ``request`` for every replica and wait (at most ``timeout_s``) for their answers."""
    command = await directory.post.remote(request)
    if isinstance(command, str):
        return _busy(command)
    deadline = time.monotonic() + timeout_s
    while True:
        outcome = await directory.outcome.remote(command.seq)
        if not outcome.waiting:
            break
        if time.monotonic() > deadline:
            waiting = ", ".join(outcome.waiting)
            return _busy(f"replicas {waiting} did not answer within {timeout_s:g} s")
        await asyncio.sleep(POLL_S)
    if not outcome.acks:
        return _busy("every model replica went away before answering")
    return merge(outcome.acks)
