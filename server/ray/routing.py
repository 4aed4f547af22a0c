"""The model deployment's request router: Ray's power of two choices, avoiding busy replicas.

A replica that answers 503 ``server_busy`` names itself in the response
(:class:`server.ray.exchange.Start`'s ``replica``); the ingress retries the
request with that replica in the request's ``avoid`` list, and this router
(:class:`AvoidingRouter`, configured on the model deployment by
:mod:`server.ray.app`) takes Ray's own choice (multiplexed-model affinity,
then two random candidates; the one with the shorter queue wins) and drops
the avoided replicas from it. When Ray's choice was only avoided replicas, it
offers two others at random (Ray then takes the shorter queue of the two);
when every replica is avoided, Ray's choice stands: a one-replica
deployment still retries.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter

from server.ray.exchange import Forwarded

ROUTER_PATH = "server.ray.routing:AvoidingRouter"
"""Where Ray finds the router (the deployment's ``request_router_class``)."""


def avoided(pending_request: Any) -> frozenset[str]:
    """The replica ids a pending request must avoid (none for any other call)."""
    args = getattr(pending_request, "args", None) or ()
    request = args[0] if args else None
    return frozenset(request.avoid) if isinstance(request, Forwarded) else frozenset()


def without(
    ranks: Sequence[Sequence[Any]], candidates: Sequence[Any], avoid: frozenset[str]
) -> list[list[Any]]:
    """Ray's ranked choice ``ranks`` without the ``avoid`` replicas (see the module)."""
    if not avoid:
        return [list(rank) for rank in ranks]
    kept = [[r for r in rank if r.replica_id.unique_id not in avoid] for rank in ranks]
    kept = [rank for rank in kept if rank]
    if kept:
        return kept
    others = [r for r in candidates if r.replica_id.unique_id not in avoid]
    if others:
        return [random.sample(others, min(2, len(others)))]
    return [list(rank) for rank in ranks]


class AvoidingRouter(PowerOfTwoChoicesRequestRouter):  # type: ignore[misc]
    """Ray's :class:`PowerOfTwoChoicesRequestRouter`; a retried request avoids the replicas
    that refused it."""

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        return without(ranks, candidate_replicas, avoided(pending_request))
