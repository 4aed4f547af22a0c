"""Checks of the invariants (docs/reference.md, "Invariants") over any core state.

Each check returns a list of :class:`Violation` (empty when all hold), so the
simulator and the property tests can run them after every step and report every
broken rule at once. Invariants that need the driver's view (sessions in use,
deadlock) are checked by the simulator with the helpers it records; the ones
here need only core state.
"""

from __future__ import annotations

import attrs

from core.admission import Admission
from core.entry import ModelEntry
from core.lease import LeaseKind
from core.lifecycle import ModelState
from core.policy import exceeds
from core.registry import Registry


@attrs.frozen
class Violation:
    """One broken invariant: its number in docs/reference.md, the model, and what is wrong."""

    invariant: int
    model: str
    message: str

    def __str__(self) -> str:
        return f"invariant {self.invariant} ({self.model}): {self.message}"


def check_admission(adm: Admission, now: float) -> list[Violation]:
    """Invariants 2 (slots and exclusivity), 3 (FIFO fixpoint) and 8 (deadlines) on one model."""
    out: list[Violation] = []
    m = adm.model
    occupied = adm.occupied()
    request_leases = [
        lease for lease in adm.ledger.active.values() if lease.kind is LeaseKind.REQUEST
    ]
    mgmt_leases = [
        lease for lease in adm.ledger.active.values() if lease.kind is LeaseKind.MANAGEMENT
    ]
    if len(occupied) > adm.count:
        out.append(Violation(2, m, f"{len(occupied)} active leases exceed {adm.count} slots"))
    slots = [lease.slot for lease in request_leases]
    if len(slots) != len(set(slots)):
        out.append(
            Violation(2, m, f"a slot is held by two leases: {sorted(s or 0 for s in slots)}")
        )
    if {lease.slot: lease.ticket for lease in request_leases} != {
        s: t for s, (t, _) in occupied.items()
    }:
        out.append(Violation(2, m, "slot table and lease ledger disagree"))
    if len(mgmt_leases) > 1:
        out.append(Violation(2, m, "two management leases at once"))
    if mgmt_leases and request_leases:
        out.append(Violation(2, m, "a management lease coexists with request leases"))
    if adm.ledger.double_releases:
        out.append(Violation(2, m, f"double release of tickets {adm.ledger.double_releases}"))
    for lease in request_leases:
        if lease.generation != adm.generation:
            out.append(
                Violation(
                    4,
                    m,
                    f"ticket {lease.ticket} holds generation {lease.generation}, current "
                    f"{adm.generation}",
                )
            )
    waiters = list(adm.waiters())
    if waiters:
        head = waiters[0]
        if head.deadline is None or head.deadline > now:
            exclusive = adm.exclusive_ticket is not None
            if head.kind is LeaseKind.REQUEST and not exclusive and len(occupied) < adm.count:
                out.append(
                    Violation(3, m, f"ticket {head.ticket} waits at the head with a free slot")
                )
            if head.kind is LeaseKind.MANAGEMENT and not exclusive and not occupied:
                out.append(
                    Violation(3, m, f"manager {head.ticket} waits at the head of an idle model")
                )
    for w in waiters:
        if w.deadline is not None and w.deadline < now:
            out.append(
                Violation(8, m, f"ticket {w.ticket} still queued past its deadline {w.deadline}")
            )
    state = adm.state()
    kinds = [w.kind for w in waiters]
    if state.queued_requests != kinds.count(
        LeaseKind.REQUEST
    ) or state.queued_management != kinds.count(LeaseKind.MANAGEMENT):
        out.append(Violation(1, m, "queue counters disagree with the queue"))
    return out


def check_entry(entry: ModelEntry, now: float) -> list[Violation]:
    """Invariants 2, 3, 8 (admission), 4, 6 and 7 (lifecycle) on one model."""
    out: list[Violation] = []
    adm, life = entry.admission, entry.lifecycle
    out.extend(check_admission(adm, now))
    if (life.state is ModelState.LOADING) != (life.initializer is not None):
        out.append(
            Violation(7, entry.id, f"state {life.state.value} with initializer {life.initializer}")
        )
    if life.loads_published > life.loads_started:
        out.append(Violation(7, entry.id, "more pools published than loads started"))
    if life.state in (ModelState.READY, ModelState.RECONFIGURING) and life.pool_generation is None:
        out.append(Violation(7, entry.id, "ready without a published pool"))
    if (
        life.state in (ModelState.UNLOADING, ModelState.RECONFIGURING)
        and adm.exclusive_ticket is None
    ):
        out.append(Violation(6, entry.id, f"{life.state.value} without the exclusive lease"))
    if life.state is ModelState.READY and life.pool_generation != adm.generation:
        out.append(Violation(4, entry.id, "ready pool is not of the current generation"))
    return out


def check_residency(registry: Registry) -> list[Violation]:
    """Invariant 5: the resident models fit ``max_loaded_models`` and the memory budget."""
    out: list[Violation] = []
    limits = registry.limits
    resident = [e for e in registry.entries() if e.resident]
    if exceeds(len(resident), limits.max_loaded_models):
        out.append(
            Violation(
                5,
                "*",
                f"{len(resident)} resident models exceed "
                f"max_loaded_models={limits.max_loaded_models}",
            )
        )
    if exceeds(sum(e.memory_bytes for e in resident), limits.memory_budget):
        out.append(Violation(5, "*", "resident memory exceeds the budget"))
    return out


def check_registry(registry: Registry, now: float) -> list[Violation]:
    """Every core invariant over every model (:func:`check_entry`), plus residency (5,
    :func:`check_residency`)."""
    out: list[Violation] = []
    for entry in registry.entries():
        out.extend(check_entry(entry, now))
    out.extend(check_residency(registry))
    return out


def check_quiescent(registry: Registry) -> list[Violation]:
    """Invariant 1: with no work left, nothing is active, queued, exclusive or in transition."""
    out: list[Violation] = []
    for entry in registry.entries():
        s = entry.admission.state()
        if s.active or s.queued_requests or s.queued_management or s.exclusive:
            out.append(Violation(1, entry.id, f"leaked at quiescence: {s}"))
        if entry.lifecycle.state not in (ModelState.READY, ModelState.UNLOADED):
            out.append(Violation(1, entry.id, f"left in state {entry.lifecycle.state.value}"))
        if entry.lifecycle.load_waiters:
            out.append(Violation(1, entry.id, "load waiters left at quiescence"))
    return out
