"""Regression: an enqueue at the instant a queued waiter's deadline comes must not drop it.

An enqueue returns one decision (for the new ticket) and cannot hand back other
waiters' wakeups. It used to dispatch with expiry, silently removing a due head:
the runtime never heard of that expiry, its waiter woke, called ``expire``, got
nothing and slept until its (past) deadline again, for ever (a livelock found by
the simulator's benchmark workload). Now the due waiter stays queued until the
caller's ``expire`` reports it.
"""

from __future__ import annotations

from core.admission import Admission, Granted, Queued
from core.guard import GuardAdmission


def test_request_at_a_due_deadline_leaves_the_expiry_to_expire() -> None:
    adm = Admission("m", 1)
    assert isinstance(adm.request(1, 8.0, None), Granted)
    due = adm.request(2, 8.0, 2.0)
    assert isinstance(due, Queued) and due.deadline == 10.0
    late = adm.request(3, 10.0, None)
    assert isinstance(late, Queued) and late.position == 1
    wakeups = adm.expire(10.0)
    assert [e.ticket for e in wakeups.expired] == [2]
    assert adm.state().queued_requests == 1


def test_manage_at_a_due_deadline_leaves_the_expiry_to_expire() -> None:
    adm = Admission("m", 1)
    adm.request(1, 0.0, None)
    adm.request(2, 0.0, 1.0)
    assert isinstance(adm.manage(3, 1.0, None), Queued)
    assert [e.ticket for e in adm.expire(1.0).expired] == [2]


def test_guard_enqueue_at_a_due_deadline_leaves_the_expiry_to_expire() -> None:
    g = GuardAdmission("m")
    assert isinstance(g.request(1, 0.0, None), Granted)
    assert isinstance(g.request(2, 0.0, 1.0), Queued)
    assert isinstance(g.request(3, 1.0, None), Queued)
    wakeups = g.expire(1.0)
    assert [e.ticket for e in wakeups.expired] == [2]
    assert [lease.ticket for lease in g.release(1, 1.0).wakeups.granted] == [3]
