"""Hypothesis state machine over one model's admission (docs/reference.md invariants 1-3, 8).

Rules enqueue requests and managers with random timeouts, release and cancel
holders and waiters, expire deadlines, try-acquire and resize under management,
with ``now`` advancing randomly. After every step the invariant checker runs,
and a model of the expected FIFO order checks who may be granted.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from core.admission import Admission, Granted, Queued, Rejected, Wakeups
from core.invariants import check_admission
from core.lease import LeaseKind

TIMEOUTS = st.sampled_from([None, 0.01, 0.05, 0.2, 1.0])


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.adm = Admission("m", 2, max_queue=None)
        self.now = 0.0
        self.next_ticket = 1
        self.holders: dict[int, LeaseKind] = {}
        self.queued: list[int] = []
        self.resolved: set[int] = set()
        self.enqueued_order: list[int] = []

    def _ticket(self) -> int:
        t = self.next_ticket
        self.next_ticket += 1
        return t

    def _absorb(self, wake: Wakeups) -> None:
        granted = [lease.ticket for lease in wake.granted]
        # grants come out in queue order: each granted ticket was the oldest still queued
        gone = {e.ticket for e in wake.expired}
        for t in granted:
            assert t in self.queued
            older = [q for q in self.queued[: self.queued.index(t)] if q not in gone]
            assert not older, f"ticket {t} barged past {older}"
            gone.add(t)
        for e in wake.expired:
            assert e.ticket in self.queued
            self.queued.remove(e.ticket)
            self.resolved.add(e.ticket)
        for lease in wake.granted:
            self.queued.remove(lease.ticket)
            self.holders[lease.ticket] = lease.kind

    def _decide(self, t: int, d: Granted | Queued | Rejected) -> None:
        if isinstance(d, Granted):
            self.holders[t] = d.lease.kind
        elif isinstance(d, Queued):
            self.queued.append(t)
        else:
            self.resolved.add(t)

    @rule(dt=st.floats(0, 0.1))
    def advance(self, dt: float) -> None:
        self.now += dt
        deadline = self.adm.next_deadline()
        if deadline is not None and deadline <= self.now:
            self._absorb(self.adm.expire(self.now))

    @rule(timeout=TIMEOUTS)
    def request(self, timeout: float | None) -> None:
        t = self._ticket()
        was_idle_queue = not self.queued
        d = self.adm.request(t, self.now, timeout)
        if isinstance(d, Granted):
            assert d.fast and was_idle_queue, "a request may only skip the queue when it is empty"
        self._decide(t, d)

    @rule(timeout=TIMEOUTS)
    def manage(self, timeout: float | None) -> None:
        t = self._ticket()
        self._decide(t, self.adm.manage(t, self.now, timeout))

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(sorted(self.holders)))
        del self.holders[t]
        released = self.adm.release(t, self.now)
        assert released.lease is not None and not released.double
        self._absorb(released.wakeups)

    @precondition(lambda self: bool(self.resolved))
    @rule(data=st.data())
    def double_release_is_harmless(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(sorted(self.resolved)))
        before = self.adm.state()
        released = self.adm.release(t, self.now)
        assert released.double and self.adm.state() == before
        self.adm.ledger.double_releases.clear()

    @precondition(lambda self: bool(self.queued))
    @rule(data=st.data())
    def cancel_waiter(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.queued))
        c = self.adm.cancel(t, self.now)
        assert c.was == "queued"
        self.queued.remove(t)
        self.resolved.add(t)
        self._absorb(c.wakeups)

    @rule()
    def try_acquire(self) -> None:
        t = self._ticket()
        idle = not self.holders and not self.queued
        d = self.adm.try_acquire(t, self.now)
        assert isinstance(d, Granted) == idle
        self._decide(t, d)

    @precondition(lambda self: any(k is LeaseKind.MANAGEMENT for k in self.holders.values()))
    @rule(slots=st.integers(1, 4))
    def resize_under_management(self, slots: int) -> None:
        self.adm.configure(slots)
        assert self.adm.state().slots == slots

    @invariant()
    def core_invariants_hold(self) -> None:
        violations = check_admission(self.adm, self.now)
        assert not violations, violations

    @invariant()
    def counters_match_model(self) -> None:
        s = self.adm.state()
        kinds = list(self.holders.values())
        assert s.active == kinds.count(LeaseKind.REQUEST)
        assert s.exclusive == (LeaseKind.MANAGEMENT in kinds)
        assert s.queued_requests + s.queued_management == len(self.queued)

    def teardown(self) -> None:
        # drain: cancel every waiter, release every holder; the model must end idle (invariant 1)
        while self.queued or self.holders:
            if self.queued:
                t = self.queued[0]
                c = self.adm.cancel(t, self.now)
                assert c.was == "queued"
                self.queued.remove(t)
                self._absorb(c.wakeups)
            else:
                t = min(self.holders)
                del self.holders[t]
                self._absorb(self.adm.release(t, self.now).wakeups)
        assert self.adm.is_idle()


AdmissionMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestAdmissionProperties = AdmissionMachine.TestCase
