"""The scheduler catalogue of reference §7.1 (test_server_model_slots.cpp), ported to sans-IO.

The C++ tests use threads and sleeps; here the same interleavings are driven
explicitly with ``now`` in seconds, which makes every assertion exact.
"""

from __future__ import annotations

import random
from itertools import count as counter

import pytest

from core.admission import Admission, Cancelled, Granted, Queued, Rejected, Wakeups
from core.events import Reason
from core.lease import LeaseKind


class Driver:
    """Hands out tickets and drains wakeups; optionally releases every grant at once."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.tickets = counter(1)
        self.admitted: list[int] = []
        self.slots: dict[int, int | None] = {}
        self.expired: list[int] = []

    def ticket(self) -> int:
        return next(self.tickets)

    def request(self, now: float, timeout: float | None) -> tuple[int, Granted | Queued | Rejected]:
        t = self.ticket()
        d = self.adm.request(t, now, timeout)
        if isinstance(d, Granted):
            self._record(t, d.lease.slot)
        return t, d

    def manage(self, now: float, timeout: float | None) -> tuple[int, Granted | Queued | Rejected]:
        t = self.ticket()
        d = self.adm.manage(t, now, timeout)
        if isinstance(d, Granted):
            self._record(t, None)
        return t, d

    def _record(self, ticket: int, slot: int | None) -> None:
        self.admitted.append(ticket)
        self.slots[ticket] = slot

    def absorb(self, wakeups: Wakeups) -> None:
        for lease in wakeups.granted:
            self._record(lease.ticket, lease.slot)
        self.expired.extend(e.ticket for e in wakeups.expired)

    def release(self, ticket: int, now: float, cascade: set[int] | None = None) -> None:
        """Release ``ticket``; tickets in ``cascade`` release as soon as they are granted."""
        work = [ticket]
        while work:
            released = self.adm.release(work.pop(0), now)
            assert not released.double
            self.absorb(released.wakeups)
            if cascade is not None:
                work.extend(
                    lease.ticket for lease in released.wakeups.granted if lease.ticket in cascade
                )


def zeros(adm: Admission) -> bool:
    s = adm.state()
    return (s.active, s.queued_requests, s.queued_management, s.exclusive) == (0, 0, 0, False)


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_fifo(slots: int) -> None:
    adm = Admission("m", slots)
    d = Driver(adm)
    held = [d.request(0.0, None)[0] for _ in range(slots)]
    first, q1 = d.request(0.0, None)
    assert isinstance(q1, Queued) and adm.state().queued_requests == 1
    manager, q2 = d.manage(0.0, None)
    assert isinstance(q2, Queued) and adm.state().queued_management == 1
    later = [d.request(0.0, None)[0] for _ in range(16)]
    assert adm.state().queued_requests == 17
    waiters = {first, manager, *later}
    d.admitted.clear()
    for t in held:
        d.release(t, 1.0, cascade=waiters)
    assert len(d.admitted) == 18
    assert d.admitted[0] == first
    assert d.admitted[1] == manager
    assert d.admitted[2:] == later
    assert zeros(adm)


@pytest.mark.parametrize("slots", [1, 2, 4])
def test_oldest_request(slots: int) -> None:
    adm = Admission("m", slots)
    d = Driver(adm)
    held = [d.request(0.0, None)[0] for _ in range(slots)]
    oldest, _ = d.request(0.0, 2.0)
    later = []
    for i in range(16):
        t, dec = d.request(0.01 * (i + 1), None)
        assert isinstance(dec, Queued)
        later.append(t)
        assert adm.state().queued_requests == i + 2
    released_slot = d.slots[held[0]]
    d.admitted.clear()
    d.release(held[0], 0.3)
    assert d.admitted == [oldest]
    assert d.slots[oldest] == released_slot
    d.release(oldest, 0.4)
    for t in held[1:]:
        d.release(t, 0.5)
    # everything now drains in FIFO order
    for t in later:
        if t in d.slots:
            d.release(t, 0.6)
    assert sorted(d.admitted) == sorted([oldest, *later])
    assert d.admitted[1:] == later
    assert zeros(adm)


def test_management_reservations() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    running, _ = d.request(0.0, None)
    # a) a reservation cannot be taken while inference runs; later work queues behind it
    first_reservation, dec = d.manage(0.0, None)
    assert isinstance(dec, Queued)
    later, dec = d.request(0.0, None)
    assert isinstance(dec, Queued), (
        "a request must not use the spare slot ahead of a queued manager"
    )
    second_reservation, _ = d.manage(0.0, None)
    cancelled = adm.cancel(first_reservation, 0.001)
    assert isinstance(cancelled, Cancelled) and cancelled.was == "queued"
    d.absorb(cancelled.wakeups)
    assert later in d.admitted, "cancelling a barrier must wake the work it blocked"
    assert adm.cancel(second_reservation, 0.002).was == "queued"
    d.release(running, 0.003)
    d.release(later, 0.003)
    # b) no leaked exclusive lease
    probe = d.ticket()
    assert isinstance(adm.try_acquire(probe, 0.004), Granted)
    adm.release(probe, 0.004)
    # c) on an idle model a reservation is granted at once and excludes try_acquire
    reservation, dec = d.manage(0.005, None)
    assert isinstance(dec, Granted) and dec.lease.kind is LeaseKind.MANAGEMENT
    assert isinstance(adm.try_acquire(d.ticket(), 0.005), Rejected)
    adm.release(reservation, 0.006)
    probe = d.ticket()
    assert isinstance(adm.try_acquire(probe, 0.006), Granted)
    # d) expiring and unbounded reservations behind an exclusive holder leak nothing
    expiring, _ = d.manage(0.007, 0.010)
    unbounded, _ = d.manage(0.007, None)
    wake = adm.expire(0.027)
    assert [e.ticket for e in wake.expired] == [expiring]
    assert adm.cancel(unbounded, 0.027).was == "queued"
    adm.release(probe, 0.028)
    assert zeros(adm)


@pytest.mark.parametrize(
    ("slots", "occupied", "managers"),
    [(1, 1, 1), (2, 2, 1), (4, 4, 1), (2, 1, 1), (4, 2, 1), (2, 2, 2)],
)
def test_overdue_with_waiting_management(slots: int, occupied: int, managers: int) -> None:
    adm = Admission("m", slots)
    d = Driver(adm)
    held = [d.request(0.0, None)[0] for _ in range(occupied)]
    mgrs = []
    for _ in range(managers):
        t, dec = d.manage(0.0, None)
        assert isinstance(dec, Queued)
        mgrs.append(t)
    t, dec = d.request(0.030, 0.015)
    assert isinstance(dec, Rejected)
    assert dec.reason is Reason.SLOTS_OVERDUE
    assert "slots exceeded busy_timeout_ms" in dec.message
    assert dec.message == "model 'm': all active slots exceeded busy_timeout_ms"
    s = adm.state()
    assert (s.active, s.queued_requests, s.queued_management) == (occupied, 0, managers)
    for h in held:
        d.release(h, 0.1)
    for m in mgrs:
        assert m in d.admitted
        d.release(m, 0.2)
    assert isinstance(adm.try_acquire(d.ticket(), 0.3), Granted)


@pytest.mark.parametrize("disable_timeout", [False, True])
def test_management_priority(disable_timeout: bool) -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    old, _ = d.request(0.0, None)
    held = [old]
    if not disable_timeout:
        healthy, _ = d.request(0.225, None)
        held.append(healthy)
    manager, dec = d.manage(0.225, None)
    assert isinstance(dec, Queued)
    request, dec = d.request(0.226, None if disable_timeout else 0.200)
    assert isinstance(dec, Queued), "a healthy blocker (or timeout 0) permits bounded waiting"
    for h in held:
        d.release(h, 0.227)
    assert manager in d.admitted and request not in d.admitted
    assert adm.state().active == 0
    d.release(manager, 0.247)
    assert request in d.admitted
    d.release(request, 0.25)
    assert zeros(adm)


def test_legacy_block_distinct_slots_and_no_eviction_of_running_model() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    a, da = d.request(0.0, 0.1)
    b, db = d.request(0.0, 0.1)
    assert isinstance(da, Granted) and isinstance(db, Granted)
    assert da.lease.slot != db.lease.slot
    assert isinstance(adm.try_acquire(d.ticket(), 0.0), Rejected)


def test_legacy_block_third_request_times_out() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    d.request(0.0, 0.1)
    d.request(0.0, 0.1)
    third, dec = d.request(0.001, 0.020)
    assert isinstance(dec, Queued) and dec.deadline == pytest.approx(0.021)
    assert not adm.expire(0.020)
    wake = adm.expire(0.021)
    assert [e.ticket for e in wake.expired] == [third]
    assert wake.expired[0].message == "model 'm': timed out waiting for a slot"
    assert adm.state().queued_requests == 0


def test_legacy_block_free_slot_reused() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    a, da = d.request(0.0, 0.1)
    d.request(0.0, 0.1)
    adm.release(a, 0.01)
    _, dc = d.request(0.02, 0.1)
    assert isinstance(dc, Granted) and isinstance(da, Granted)
    assert dc.lease.slot == da.lease.slot


def test_legacy_block_manager_waits_then_excludes() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    b, _ = d.request(0.0, None)
    manager, dec = d.manage(0.001, 1.0)
    assert isinstance(dec, Queued)
    assert not adm.expire(0.021)
    d.release(b, 0.03)
    assert manager in d.admitted
    assert isinstance(adm.try_acquire(d.ticket(), 0.03), Rejected), "no two management leases"
    late, dec = d.request(0.031, 0.020)
    assert isinstance(dec, Queued)
    assert [e.ticket for e in adm.expire(0.052).expired] == [late]
    # once the exclusive holder has overrun, a request fails fast
    _, dec = d.request(0.2, 0.020)
    assert isinstance(dec, Rejected) and dec.reason is Reason.EXCLUSIVE_OVERDUE
    assert dec.message == "model 'm': exclusive operation exceeded busy_timeout_ms"


def test_legacy_block_no_slot_shared_under_contention() -> None:
    rng = random.Random(1234)
    adm = Admission("m", 2)
    d = Driver(adm)
    owner: dict[int, int] = {}
    remaining = {w: 20 for w in range(12)}
    current: dict[int, int] = {}
    completions = 0
    now = 0.0
    pending_workers = list(remaining)
    holding: list[int] = []

    def on_grant(ticket: int, slot: int | None) -> None:
        assert slot is not None and slot not in owner, "a slot was used by two callers at once"
        owner[slot] = ticket
        holding.append(ticket)

    while pending_workers or holding:
        now += 0.001
        if pending_workers and (not holding or rng.random() < 0.5):
            w = pending_workers.pop(rng.randrange(len(pending_workers)))
            t = d.ticket()
            current[t] = w
            dec = adm.request(t, now, None)
            if isinstance(dec, Granted):
                on_grant(t, dec.lease.slot)
        elif holding:
            t = holding.pop(rng.randrange(len(holding)))
            slot = next(s for s, o in owner.items() if o == t)
            del owner[slot]
            released = adm.release(t, now)
            for lease in released.wakeups.granted:
                on_grant(lease.ticket, lease.slot)
            completions += 1
            w = current.pop(t)
            remaining[w] -= 1
            if remaining[w]:
                pending_workers.append(w)
    assert completions == 240
    assert zeros(adm)


def test_legacy_block_error_path_release_frees_model() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    t, _ = d.request(0.0, None)
    # the holder failed; its owner releases in its error path
    adm.release(t, 0.01)
    assert isinstance(adm.try_acquire(d.ticket(), 0.01), Granted)


def test_legacy_block_manager_timeout_wakes_stranded_request() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    held, _ = d.request(0.0, None)
    with pytest.raises(RuntimeError, match="cannot resize occupied slots"):
        adm.configure(1)
    manager, dec = d.manage(0.0, 0.150)
    assert isinstance(dec, Queued)
    request, dec = d.request(0.001, 0.500)
    assert isinstance(dec, Queued), "blocked only by the manager's priority"
    wake = adm.expire(0.150)
    assert [e.ticket for e in wake.expired] == [manager]
    assert [lease.ticket for lease in wake.granted] == [request], "dispatched in the same step"
    d.absorb(wake)
    d.release(request, 0.2)
    d.release(held, 0.2)
    assert zeros(adm)


def test_legacy_block_fast_path_ignores_stale_slot() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    stale, ds = d.request(0.0, None)
    _, dec = d.request(0.025, 0.010)
    assert isinstance(dec, Granted) and isinstance(ds, Granted)
    assert dec.lease.slot != ds.lease.slot and dec.fast


def test_legacy_block_resize_under_exclusive_lease() -> None:
    adm = Admission("m", 2)
    d = Driver(adm)
    manager, dec = d.manage(0.0, None)
    assert isinstance(dec, Granted)
    generation = adm.configure(1)
    assert generation == 1 and adm.state().slots == 1
    d.release(manager, 0.001)
    _, first = d.request(0.002, 0.020)
    assert isinstance(first, Granted) and first.lease.generation == 1
    second, dec = d.request(0.003, 0.020)
    assert isinstance(dec, Queued), "slots=1 must not allow overlap"
    assert [e.ticket for e in adm.expire(0.023).expired] == [second]
