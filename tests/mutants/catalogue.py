"""Mutants: the real core/runtime with one historical bug put back, applied at run time.

Each mutant is a context manager that monkeypatches one method (or property) of
core or ``server.runtime`` for the duration of the block and restores it after.
Each reintroduces exactly one bug from the reference (docs/reference.md;
docs/reference-cases.md maps its cases to tests): §3.9 (the v1 scheduler),
§8.1-8.4 and §6.5, plus the three race reports of issue #10 (idle clock,
abandoned initializer, re-registration reload), a run that ignores its stop
flag (:mod:`core.stopping`) and a batched stream member that is never held for
a client that stops reading (:meth:`core.batching.BatchScheduler.held`). The
tests in this folder prove that the simulator (its scenario files and its fuzzer)
catches every one of them, and that the real code passes the same checks.

``SIMULATED`` mutants live in code the simulator runs: all of them, since the
runtime drives :mod:`core.batching` for models registered with ``batching``
(``batch_slot_early_free`` is also caught by the stateful Hypothesis test of
:class:`core.batching.BatchScheduler` in test_batching_mutant.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import attrs

from core.admission import Admission, Decision, Granted, Wakeups
from core.batching import BatchScheduler, Ignored, Outcome, Released, SlotState, StaleHandle, _Slot
from core.bulk import BulkDone, BulkUnload, UnloadNow, WaitForGrant
from core.events import Reason
from core.lease import Lease, LeaseKind
from core.lifecycle import (
    RESIDENT_STATES,
    Abandoned,
    Left,
    Lifecycle,
    ModelState,
    Proceed,
    WaitLoad,
)
from core.policy import overrun
from core.recorder import Core, wakeup_fields
from core.residency import RoomDecision
from server.runtime.management import Management
from server.runtime.ports import ModelSpec
from server.runtime.runtime import Held, Runtime

Mutant = Callable[[], contextlib.AbstractContextManager[None]]


@attrs.frozen
class MutantInfo:
    """A mutant: its bug, where it came from, and the patch (a context manager factory)."""

    name: str
    bug: str
    source: str
    injected: str
    patch: Mutant
    scenario: str  # the targeted scenario file (relative to the repository root)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# --------------------------------------------------------------- admission (core)
_real_request = Admission.request


def _request_overdue_suppressed(
    self: Admission, now: float, timeout: float | None
) -> Reason | None:
    """v1: ``all_overrun`` started as ``!exclusive && !waiting_exclusive`` (reference §3.9, §8.1).

    :meth:`Admission._request_overdue` with one change (marked): while a manager
    waits, the all-slots-overdue check is skipped, so the request queues and
    waits out its timeout instead of being rejected at once.
    """
    if overrun(self._exclusive_since, now, timeout):
        return Reason.EXCLUSIVE_OVERDUE
    occupied = [s for s in self._since[: self.count] if s is not None]
    if (
        occupied
        and self._exclusive is None
        and self._queued_management == 0  # the bug: a waiting manager disables the check
        and timeout is not None
        and all(overrun(s, now, timeout) for s in occupied)
    ):
        return Reason.SLOTS_OVERDUE
    return None


def _request_barging(self: Admission, ticket: int, now: float, timeout: float | None) -> Decision:
    """Priority-flag design (§8.3): a free slot is taken when no *request* waits, queued
    managers ignored."""
    if self._admitting and self._exclusive is None and self._queued_requests == 0:
        slot = self._free_slot()
        if slot is not None:
            return Granted(self._grant_slot(ticket, slot, now), fast=True)
    return _real_request(self, ticket, now, timeout)


_real_expire = Admission.expire


def _expire_strands(self: Admission, now: float) -> Wakeups:
    """§8.2 (MS v1): a timed-out manager leaves the queue without dispatching it.

    Requests that waited only because of that manager stay queued with a slot
    free (stranded) until some unrelated release dispatches the queue.
    """
    managers = [
        w
        for w in self._queue
        if w.kind is LeaseKind.MANAGEMENT and w.deadline is not None and now >= w.deadline
    ]
    if not managers:
        return _real_expire(self, now)
    expired = []
    for waiter in tuple(self._queue):
        if waiter.deadline is not None and now >= waiter.deadline:
            self._remove(waiter)
            expired.append(self._expired(waiter))
    return Wakeups((), tuple(expired))


# ---------------------------------------------------------------- runtime sessions
_real_session_for = Runtime.session_for


def _session_zero(self: Runtime, model: str, lease: Lease) -> Any:
    """Every request leased session 0: the slot index is never used to pick the session."""
    live = self.pools.get(model)
    if live is None:
        return _real_session_for(self, model, lease)
    return live.pool.at(0)


async def _run_ignores_stop(self: Runtime, held: Held, request: Any) -> Any:
    """The session call shielded without a stop flag: a cancelled run holds its slot to the
    end (the runtime before stop points; a Whisper file's every window)."""
    driver = self.pools[held.model].driver
    if driver is not None:
        return await driver.run(request)
    with anyio.CancelScope(shield=True):
        return await self.provider.run(held.session, request)


async def _ensure_loaded_no_recheck(self: Runtime, model: str, lease: Lease) -> Any:
    """§4.3 without the re-check under the init lock: a holder that waited for the
    first load (the lock) then loads again instead of using the published pool,
    so concurrent first requests each load (the earlier pool is overwritten, leaked)."""
    decision = self.core.ensure_loaded(model, lease.ticket, self.clock.now())
    if isinstance(decision, WaitLoad):
        wait = self.waits.park_load(lease.ticket)
        await wait.event.wait()
        if wait.proceed:
            spec: ModelSpec = self.specs[model]
            self.pools[model] = await self.build_pool(spec, lease.generation)
            return self.session_for(model, lease)
        assert wait.retry is not None
        decision = self.core.begin_load(model, wait.retry, self.clock.now())
    if isinstance(decision, Proceed):
        return self.session_for(model, lease)
    assert isinstance(decision, RoomDecision)
    await self.load_with_room(model, decision)
    return self.session_for(model, lease)


# --------------------------------------------------------------- residency (core)
def _resident_until_torn_down(self: Lifecycle) -> bool:
    """Residency cleared only after teardown: a retiring (unloading) model still counts (§8.4.4)."""
    return self.state in RESIDENT_STATES or self.state is ModelState.UNLOADING


# --------------------------------------------------------------------- bulk (core)
def _bulk_selection_order(self: BulkUnload) -> UnloadNow | WaitForGrant | BulkDone | None:
    """Bulk unload in selection order: wait for each barrier in turn, idle ones included
    (§8.4.3)."""
    for model in self.selected:
        if model in self.done or model in self.in_progress:
            continue
        if model in self.ready:
            self.ready.remove(model)
            self.in_progress.append(model)
            self.started.append(model)
            return UnloadNow(model, self.tickets[model])
        return WaitForGrant(tuple(self.waiting))
    if self.in_progress:
        return None
    return BulkDone(tuple(m for m in self.selected if m in self.done), self.not_found)


# ----------------------------------------------------------------- batching (core)
def _end_frees_slot(self: BatchScheduler[Any], slot: _Slot[Any], outcome: Outcome) -> None:
    """§6.5: the finish step pushes the slot back on the free list at once (if absent),
    so a new launch can take and reset a slot whose owner has not drained it yet."""
    slot.state, slot.outcome = SlotState.FINISHED, outcome
    index = next(i for i, s in enumerate(self._slots) if s is slot)
    if index not in self._free:
        self._free.append(index)


def _release_if_absent(self: BatchScheduler[Any], handle: Any) -> Any:
    """The owner's release, with the old "push only if not already present" guard."""
    slot = self._slot(handle)
    if slot is None:
        return StaleHandle(handle)
    if slot.state is not SlotState.FINISHED:
        return Ignored(
            handle, slot.state, Reason.SLOT_NOT_FINISHED, "release before the slot finished"
        )
    released = Released(handle, slot.outcome, len(slot.chunks))
    self._slots[handle.slot] = _Slot(slot.epoch + 1)
    if handle.slot not in self._free:
        self._free.append(handle.slot)
    return released


@contextlib.contextmanager
def _batch_early_free() -> Iterator[None]:
    with (
        _patched(BatchScheduler, "_end", _end_frees_slot),
        _patched(BatchScheduler, "release", _release_if_absent),
    ):
        yield


def _never_held(self: BatchScheduler[Any], slot: int) -> bool:
    """Session 17's probe: a member decodes on whatever its owner has read."""
    return False


# ------------------------------------------------------------- race reports (issue #10)
def _release_without_use(self: Core, model: str, ticket: int, now: float) -> Any:
    """Report 1: a released request lease does not count as use; the idle clock and LRU
    order keep the *start* of the last use (``Core.release`` without its touch)."""
    r = self.entry(model).admission.release(ticket, now)
    fields = {"double": r.double, "used": False, **wakeup_fields(r.wakeups)}
    self._record(now, model, "release", {"ticket": ticket}, fields)
    return r


def _abandon_wait_strands(self: Lifecycle, ticket: int) -> Abandoned:
    """Report 2: a departing waiter that a failed load already named initializer hands
    nothing on."""
    if ticket in self.load_waiters:
        self.load_waiters.remove(ticket)
        return Abandoned(Left.WAITER)
    return Abandoned(Left.NOTHING)


def _any_difference_reconfigures(old: ModelSpec, new: ModelSpec) -> bool:
    """Report 3: any field, operational ones included, counts as a change (spec equality)."""
    return old == new


def _one(owner: Any, name: str, value: Any) -> Mutant:
    return lambda: _patched(owner, name, value)


MUTANTS: dict[str, MutantInfo] = {
    m.name: m
    for m in (
        MutantInfo(
            "overdue_suppressed_by_manager",
            "a waiting manager suppresses the overdue rejection; the request waits out its timeout",
            "reference §3.9 v1, §8.1",
            "Admission._request_overdue skips the all-slots check while a manager is queued",
            _one(Admission, "_request_overdue", _request_overdue_suppressed),
            "scenarios/overdue_unload_waiting_1slot.toml",
        ),
        MutantInfo(
            "barging_past_manager",
            "a request takes a spare slot although a manager queued before it",
            "reference §8.3",
            "Admission.request fast path ignores queued managers",
            _one(Admission, "request", _request_barging),
            "tests/mutants/scenarios/barging_past_manager.toml",
        ),
        MutantInfo(
            "session_zero",
            "every request is leased session 0 whatever its slot",
            "historical runtime bug (slot index not used to pick the session)",
            "Runtime.session_for returns pool.at(0)",
            _one(Runtime, "session_for", _session_zero),
            "tests/mutants/scenarios/session_per_slot.toml",
        ),
        MutantInfo(
            "run_ignores_stop",
            "a request whose client left runs on to the end of its session call, "
            "holding its slot past the call's next stop point",
            "session 16 (an outside probe: an abandoned Whisper file held its slot for the "
            "whole file)",
            "Runtime.run_on shields the call without raising its stop flag",
            _one(Runtime, "run_on", _run_ignores_stop),
            "scenarios/disconnect_while_running_stops_at_a_step.toml",
        ),
        MutantInfo(
            "double_first_load",
            "first load without the re-check under the lock: concurrent first requests each load",
            "reference §4.3, §6.5 (missing double-check on load)",
            "Runtime.ensure_loaded loads again after waiting for the first load",
            _one(Runtime, "ensure_loaded", _ensure_loaded_no_recheck),
            "tests/mutants/scenarios/concurrent_first_load.toml",
        ),
        MutantInfo(
            "batch_slot_early_free",
            "a finished batch slot returns to the free list before its owner drained it",
            "reference §6.5",
            "BatchScheduler._end pushes the slot to the free list; release pushes only if absent",
            _batch_early_free,
            "scenarios/batched_slow_reader_keeps_its_slot.toml",
        ),
        MutantInfo(
            "member_never_held",
            "a batched stream member whose client stops reading decodes on at full speed, "
            "its chunks piling up in memory",
            "session 17 (an outside probe: two stalled Piper streams took 25 s of CPU in 20 s "
            "and 90 MB)",
            "BatchScheduler.held is always false",
            _one(BatchScheduler, "held", _never_held),
            "scenarios/batched_stalled_reader_is_held.toml",
        ),
        MutantInfo(
            "residency_after_teardown",
            "logical residency cleared only after teardown; a retiring model blocks a new load",
            "reference §4.7, §8.4 item 4",
            "Lifecycle.resident also counts the unloading state",
            _one(Lifecycle, "resident", property(_resident_until_torn_down)),
            "tests/mutants/scenarios/retiring_model_not_resident.toml",
        ),
        MutantInfo(
            "manager_timeout_strands",
            "a timed-out manager leaves without dispatching, stranding requests behind it",
            "reference §3.9 v1, §8.2",
            "Admission.expire skips the dispatch when a manager expired",
            _one(Admission, "expire", _expire_strands),
            "tests/mutants/scenarios/manager_timeout_dispatches.toml",
        ),
        MutantInfo(
            "bulk_waits_busy_first",
            "bulk unload waits on busy models (selection order) before freeing idle ones",
            "reference §4.9, §8.4 item 3",
            "BulkUnload.next_action walks the selection in order, waiting on each barrier",
            _one(BulkUnload, "next_action", _bulk_selection_order),
            "tests/mutants/scenarios/bulk_frees_idle_first.toml",
        ),
        MutantInfo(
            "idle_clock_from_use_start",
            "idle retirement counts from the start of the last use: "
            "a model is retired right after a long run",
            "reference §4.8; race report 1 (issue #10)",
            "Core.release does not touch the entry when a request lease ends",
            _one(Core, "release", _release_without_use),
            "scenarios/idle_retirement_counts_from_last_use_end.toml",
        ),
        MutantInfo(
            "abandoned_initializer_strands",
            "a waiter that leaves as the first load fails keeps the initializer role: "
            "the model stays loading",
            "reference §4.3; race report 2 (issue #10)",
            "Lifecycle.abandon_wait does not pass the initializer role on",
            _one(Lifecycle, "abandon_wait", _abandon_wait_strands),
            "scenarios/disconnect_at_first_load_failure.toml",
        ),
        MutantInfo(
            "reregister_reloads",
            "re-registering with only operational fields changed "
            "reconfigures and reloads the model",
            "reference §4.5; race report 3 (issue #10)",
            "Management.only_operational compares whole specs",
            _one(Management, "only_operational", staticmethod(_any_difference_reconfigures)),
            "scenarios/reregister_unchanged_model_keeps_pool.toml",
        ),
    )
}

SIMULATED = tuple(MUTANTS)


def activate(name: str) -> contextlib.AbstractContextManager[None]:
    """The patch of mutant ``name`` (a KeyError names the known ones)."""
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    return MUTANTS[name].patch()
