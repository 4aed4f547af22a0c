"""Keep Ray Serve's list of a replica's multiplexed models equal to what its runtime keeps.

Ray Serve routes a request with a multiplexed model id to a replica that lists
that id, and a replica lists every id its loader returned until Ray's own LRU
drops it. voxpool's runtime decides residency itself (its limits may evict a
model, idle retirement may unload one), so after each request and on every
report the replica trims the ids its runtime no longer holds. Ray keeps the
list in the replica's multiplex wrapper (``ray.serve.multiplex``'s
``_ModelMultiplexWrapper``, stored on the instance as
:data:`WRAPPER_ATTRIBUTE`); ``tests/rayserve/test_ray_serve.py`` checks that the
installed Ray still has the attributes used here, so an upgrade that renames
them fails a test instead of silently losing the affinity.
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

WRAPPER_ATTRIBUTE = "__serve_multiplex_wrapper"
"""Where ``@serve.multiplexed`` keeps its wrapper on the instance."""


def listed(owner: Any) -> list[str]:
    """The model ids Ray lists for ``owner``'s replica, oldest use first."""
    wrapper = getattr(owner, WRAPPER_ATTRIBUTE, None)
    return [] if wrapper is None else list(wrapper.models)


def trim(owner: Any, loaded: Set[str]) -> list[str]:
    """Drop from Ray's list every id that is not in ``loaded``; the ids dropped.

    Ray pushes the new list to its routers at its next metrics push.
    """
    wrapper = getattr(owner, WRAPPER_ATTRIBUTE, None)
    if wrapper is None:
        return []
    gone = [model for model in wrapper.models if model not in loaded]
    for model in gone:
        del wrapper.models[model]
    if gone:
        wrapper._push_multiplexed_replica_info = True
    return gone
