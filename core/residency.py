"""Residency limits: how many models (and how much memory) may be loaded at once.

Residency is *logical*: a model counts from the moment its load starts until
its teardown starts, so a retiring model stops counting before its memory is
actually free, and an incoming load never evicts or rejects an unrelated keeper
because of it. Eviction and idle retirement only try-acquire idle, queue-free
victims in least-recently-used order and never wait; with no victim the load is
refused (HTTP 503).

Deliberate difference from the original: room is made all-or-nothing. If the
idle victims available cannot make enough room, none is evicted (the original
keeps the evictions it made before failing).
"""

from __future__ import annotations

from typing import Protocol

import attrs

from core.admission import Granted
from core.entry import ModelEntry
from core.events import Reason
from core.lease import Lease
from core.lifecycle import ModelState, StartLoad
from core.policy import Limit, bound, exceeds, excess


@attrs.frozen
class ResidencyLimits:
    """``max_loaded_models`` and a memory budget in bytes (None: no limit, as everywhere in typed
    APIs; see :mod:`core.policy`)."""

    max_loaded_models: Limit = None
    memory_budget: Limit = None

    @classmethod
    def from_config(cls, max_loaded_models: int, memory_budget: int) -> ResidencyLimits:
        """The limits as config files and trace files write them (0: no limit)."""
        return cls(bound(max_loaded_models), bound(memory_budget))


class Models(Protocol):
    """What the residency rules read of the registry: its limits, entries and tickets."""

    @property
    def limits(self) -> ResidencyLimits: ...

    def entries(self) -> tuple[ModelEntry, ...]: ...

    def new_ticket(self) -> int: ...


@attrs.frozen
class Eviction:
    """A victim taken for eviction: tear it down under ``lease``, then release the lease."""

    model: str
    lease: Lease


@attrs.frozen
class RoomDecision:
    """The outcome of making room for a load.

    ``load`` is set when the caller must load (after evicting ``evictions``);
    ``refused`` when there is no room; ``retry`` names a waiting holder that
    becomes the next initializer after a refusal. ``never`` marks a refusal no wait
    cures: the model's own memory estimate exceeds the whole budget.
    """

    evictions: tuple[Eviction, ...] = ()
    load: StartLoad | None = None
    refused: tuple[Reason, str] | None = None
    retry: StartLoad | None = None
    never: bool = False


def make_room(registry: Models, incoming: ModelEntry, now: float) -> RoomDecision:
    """Take the idle LRU victims needed so that ``incoming`` fits the limits, or refuse: with
    "retry later" when busy models hold the room, for good (``never``, nothing evicted) when
    ``incoming`` alone exceeds the memory budget."""
    limits = registry.limits
    if exceeds(incoming.memory_bytes, limits.memory_budget):
        return RoomDecision(
            refused=(
                Reason.MEMORY_BUDGET,
                f"cannot load model '{incoming.id}': its memory estimate of "
                f"{incoming.memory_bytes} bytes exceeds the whole memory budget of "
                f"{limits.memory_budget} bytes, so it can never load "
                "(lower its memory_mb or raise memory_budget_mb)",
            ),
            never=True,
        )
    others = [e for e in registry.entries() if e is not incoming and e.resident]
    need_models = excess(len(others) + 1, limits.max_loaded_models)
    need_bytes = excess(
        sum(e.memory_bytes for e in others) + incoming.memory_bytes, limits.memory_budget
    )
    if need_models == 0 and need_bytes == 0:
        return RoomDecision()
    candidates = sorted(
        (e for e in others if e.lifecycle.state is ModelState.READY),
        key=lambda e: (e.last_used, e.order),
    )
    taken: list[tuple[ModelEntry, Lease]] = []
    freed_models = 0
    freed_bytes = 0
    for victim in candidates:
        if freed_models >= need_models and freed_bytes >= need_bytes:
            break
        granted = victim.admission.try_acquire(registry.new_ticket(), now)
        if isinstance(granted, Granted):
            taken.append((victim, granted.lease))
            freed_models += 1
            freed_bytes += victim.memory_bytes
    if freed_models < need_models or freed_bytes < need_bytes:
        for victim, lease in taken:
            victim.admission.release(lease.ticket, now)
        if need_bytes and freed_bytes < need_bytes and freed_models >= need_models:
            return RoomDecision(
                refused=(
                    Reason.MEMORY_BUDGET,
                    f"cannot load model '{incoming.id}': "
                    f"memory budget of {limits.memory_budget} bytes "
                    "is used by busy models; retry later",
                )
            )
        return RoomDecision(
            refused=(
                Reason.RESIDENCY_LIMIT,
                f"cannot load model '{incoming.id}': max_loaded_models={limits.max_loaded_models} "
                "and every loaded model is busy; retry later",
            )
        )
    evictions = []
    for victim, lease in taken:
        victim.lifecycle.begin_unload()
        evictions.append(Eviction(victim.id, lease))
    return RoomDecision(evictions=tuple(evictions))


def retire_idle(registry: Models, now: float, idle_seconds: float | None) -> tuple[Eviction, ...]:
    """Idle retirement: take every ready model unused for ``idle_seconds`` that is idle now
    (None: models are never retired)."""
    if idle_seconds is None:
        return ()
    out = []
    for entry in registry.entries():
        if entry.lifecycle.state is not ModelState.READY or now - entry.last_used < idle_seconds:
            continue
        granted = entry.admission.try_acquire(registry.new_ticket(), now)
        if isinstance(granted, Granted):
            entry.lifecycle.begin_unload()
            out.append(Eviction(entry.id, granted.lease))
    return tuple(out)
