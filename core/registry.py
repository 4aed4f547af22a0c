"""The model registry: stable entries, registration, and the cold-load decision.

Entries are never erased while the process runs (a reference to one stays
valid), and they are kept in registration order, which is also the order of
``/v1/models`` and of the tie-breaks below. Reads never wait: status is a set of
synchronous reads of each entry's counters, so no global lock is ever held
across an admission or metadata wait.

Tickets identify every lease holder; the registry hands them out so that one
counter orders the whole process (and the trace).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from core.admission import Admission, Granted
from core.entry import ModelEntry
from core.guard import GuardAdmission
from core.lease import Lease
from core.lifecycle import Lifecycle, Proceed, StartLoad, WaitLoad
from core.policy import RuntimeKind, exceeds
from core.residency import ResidencyLimits, RoomDecision, make_room


@attrs.frozen
class ModelStatus:
    """One row of ``/v1/models`` as core sees it."""

    id: str
    state: str
    loaded: bool
    slots: int
    active_slots: int
    queued_requests: int
    queued_management: int
    max_parallel_slots: int | None
    generation: int


@attrs.frozen
class Registered:
    """A new entry, published with its exclusive lease already held by ``lease.ticket``."""

    entry: ModelEntry
    lease: Lease


@attrs.frozen
class Existing:
    """The id is registered already: queue as a manager on this entry instead."""

    entry: ModelEntry


class Registry:
    """All registered models, the ticket counter and the residency limits."""

    def __init__(
        self,
        limits: ResidencyLimits | None = None,
        *,
        max_queue: int | None = None,
        kind: RuntimeKind = RuntimeKind.PARALLEL,
        choose: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        self.limits = limits or ResidencyLimits()
        self.max_queue = max_queue
        self.kind = kind
        self.choose = choose
        self._entries: dict[str, ModelEntry] = {}
        self._next_ticket = 1

    # ---------------------------------------------------------------- reads
    def new_ticket(self) -> int:
        """A fresh ticket; tickets increase in the order they are handed out."""
        ticket = self._next_ticket
        self._next_ticket += 1
        return ticket

    def get(self, model_id: str) -> ModelEntry | None:
        """The entry of ``model_id``, if registered."""
        return self._entries.get(model_id)

    def entries(self) -> tuple[ModelEntry, ...]:
        """Every entry in registration order."""
        return tuple(self._entries.values())

    def snapshot(
        self, ids: Iterable[str] | None = None
    ) -> tuple[tuple[ModelEntry, ...], tuple[str, ...]]:
        """The selected entries (deduplicated, selection order) and the unknown ids.

        ``None`` selects every entry registered now; later registrations are not
        included (a snapshot, not a fence).
        """
        if ids is None:
            return self.entries(), ()
        found: list[ModelEntry] = []
        missing: list[str] = []
        for model_id in ids:
            entry = self._entries.get(model_id)
            if entry is None:
                if model_id not in missing:
                    missing.append(model_id)
            elif entry not in found:
                found.append(entry)
        return tuple(found), tuple(missing)

    def status(self, entry: ModelEntry) -> ModelStatus:
        """The observable row of one model (not an atomic snapshot of the whole registry)."""
        s = entry.admission.state()
        return ModelStatus(
            id=entry.id,
            state=entry.lifecycle.state.value,
            loaded=entry.lifecycle.loaded,
            slots=s.slots,
            active_slots=s.active,
            queued_requests=s.queued_requests,
            queued_management=s.queued_management,
            max_parallel_slots=entry.capacity if entry.lifecycle.loaded else None,
            generation=s.generation,
        )

    def resident_count(self) -> int:
        """How many models count as logically resident now."""
        return sum(1 for e in self._entries.values() if e.resident)

    # -------------------------------------------------------------- changes
    def register(
        self,
        model_id: str,
        *,
        slots: int,
        now: float,
        memory_bytes: int = 0,
        config: Any = None,
    ) -> Registered | Existing:
        """Publish a new entry with an exclusive lease already held, or name the existing one.

        The lease is taken on the fresh entry *before* it becomes visible, so a
        concurrent registration of the same id queues behind this one.
        """
        existing = self._entries.get(model_id)
        if existing is not None:
            return Existing(existing)
        admission: Admission
        if self.kind is RuntimeKind.ORIGINAL:
            admission = GuardAdmission(model_id, choose=self.choose)
        else:
            admission = Admission(model_id, slots, max_queue=self.max_queue)
        entry = ModelEntry(
            id=model_id,
            order=len(self._entries),
            admission=admission,
            lifecycle=Lifecycle(model_id),
            memory_bytes=memory_bytes,
            last_used=now,
            config=config,
        )
        granted = admission.try_acquire(self.new_ticket(), now)
        assert isinstance(granted, Granted)
        self._entries[model_id] = entry
        return Registered(entry, granted.lease)

    def ensure_loaded(
        self, entry: ModelEntry, ticket: int, now: float
    ) -> Proceed | WaitLoad | RoomDecision:
        """A lease holder needs ``entry``'s pool: proceed, wait, or load (making room first)."""
        self.touch(entry, now)
        decision = entry.lifecycle.ensure_loaded(ticket)
        if not isinstance(decision, StartLoad):
            return decision
        return self.begin_load(entry, decision, now)

    def begin_load(self, entry: ModelEntry, start: StartLoad, now: float) -> RoomDecision:
        """Apply the residency limits before ``start`` loads: evict idle LRU victims, or refuse.

        Victims are taken by try-acquire (never waiting) and returned for the
        caller to tear down. On refusal the lifecycle returns to unloaded, and a
        waiting holder, if any, is named in ``retry`` to attempt the load next
        (the caller passes it back here).
        """
        room = make_room(self, entry, now)
        if room.refused is not None:
            outcome = entry.lifecycle.load_failed(start.ticket)
            return attrs.evolve(room, retry=outcome.retry)
        return attrs.evolve(room, load=start)

    def set_memory(self, entry: ModelEntry, memory_bytes: int) -> bool:
        """Change ``entry``'s memory estimate in place (an operational field, no reload).

        A model that is not resident takes any estimate; a resident one takes it
        only if every resident model still fits the memory budget (True), else
        nothing changes (False): the estimate never pushes residency past the
        budget behind the limits' back.
        """
        if entry.resident:
            others = sum(
                e.memory_bytes for e in self._entries.values() if e.resident and e is not entry
            )
            if exceeds(others + memory_bytes, self.limits.memory_budget):
                return False
        entry.memory_bytes = memory_bytes
        return True

    def touch(self, entry: ModelEntry, now: float) -> None:
        """Record use (LRU order and idle retirement): when a holder starts on the pool
        (:meth:`ensure_loaded`) and when a request lease ends (``Core.release``), so a
        model is idle from the end of its last use, not its start (reference §4.8)."""
        entry.last_used = now
