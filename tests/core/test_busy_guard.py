"""The original runtime's guard (reference §3.9, §7.7 test_server_busy_guard)."""

from __future__ import annotations

from core.admission import Granted, Queued, Rejected
from core.guard import GuardAdmission
from core.invariants import check_admission
from core.lease import LeaseKind


def drain(g: GuardAdmission, holder: int, now: float) -> list[int]:
    """Release ``holder`` and every holder after it; the order the lock was handed over."""
    served = []
    while True:
        wake = g.release(holder, now)
        if not wake.wakeups.granted:
            return served
        holder = wake.wakeups.granted[0].ticket
        served.append(holder)


def test_timeout_zero_waits_forever_behind_wedged_holder() -> None:
    g = GuardAdmission("m")
    assert isinstance(g.request(1, 0.0, None), Granted)
    dec = g.request(2, 1000.0, None)
    assert isinstance(dec, Queued) and dec.deadline is None
    assert not g.expire(10_000.0)
    assert g.state().queued_requests == 1


def test_eight_workers_all_park_with_timeout_zero() -> None:
    g = GuardAdmission("m")
    g.request(0, 0.0, None)
    for t in range(1, 9):
        assert isinstance(g.request(t, 0.0, None), Queued)
    assert g.state().queued_requests == 8
    assert sorted(drain(g, 0, 1.0)) == list(range(1, 9))
    assert g.is_idle()


def test_every_worker_busy_with_fifty_ms() -> None:
    g = GuardAdmission("m")
    g.request(0, 0.0, None)
    for t in range(1, 9):
        assert isinstance(g.request(t, 0.0, 0.050), Queued)
    wake = g.expire(0.050)
    assert sorted(e.ticket for e in wake.expired) == list(range(1, 9))
    assert all(
        "timed out after 50 ms waiting for the inference lock" in e.message for e in wake.expired
    )


def test_overrun_holder_rejects_at_once() -> None:
    g = GuardAdmission("m")
    g.request(1, 0.0, None)
    dec = g.request(2, 0.2, 0.050)
    assert isinstance(dec, Rejected)
    assert "current inference has run 200 ms (busy_timeout_ms=50)" in dec.message
    assert "likely wedged" in dec.message


def test_guard_reusable_after_long_run_and_after_error() -> None:
    g = GuardAdmission("m")
    g.request(1, 0.0, None)
    g.release(1, 100.0)
    assert isinstance(g.request(2, 100.0, 0.05), Granted)
    g.release(2, 100.1)  # error path releases too
    assert isinstance(g.request(3, 100.2, 0.05), Granted)


def test_idle_guard_acquires_immediately() -> None:
    g = GuardAdmission("m")
    dec = g.request(1, 5.0, 0.001)
    assert isinstance(dec, Granted) and dec.fast and dec.lease.slot == 0


def test_no_fifo_the_chooser_decides() -> None:
    g = GuardAdmission("m", choose=lambda c: c[-1])
    g.request(0, 0.0, None)
    for t in (1, 2, 3):
        g.request(t, 0.0, None)
    assert drain(g, 0, 1.0) == [3, 2, 1]


def test_management_has_no_priority_and_shares_the_lock() -> None:
    g = GuardAdmission("m")
    g.request(1, 0.0, None)
    assert isinstance(g.request(2, 0.0, None), Queued)
    assert isinstance(g.manage(3, 0.0, None), Queued)
    wake = g.release(1, 1.0).wakeups
    assert [lease.ticket for lease in wake.granted] == [2], "the older request is not overtaken"
    wake = g.release(2, 2.0).wakeups
    assert wake.granted[0].kind is LeaseKind.MANAGEMENT
    assert isinstance(g.request(4, 2.0, None), Queued), "no request while management holds the lock"
    assert not check_admission(g, 2.0)


def test_forced_choice_replays_a_recorded_order() -> None:
    g = GuardAdmission("m")
    g.request(0, 0.0, None)
    for t in (1, 2, 3):
        g.request(t, 0.0, None)
    g.forced = [2]
    assert [lease.ticket for lease in g.release(0, 1.0).wakeups.granted] == [2]


def test_original_runtime_has_one_session() -> None:
    g = GuardAdmission("m")
    import pytest

    with pytest.raises(ValueError, match="requires --parallel-jobs"):
        g.configure(2)
    assert g.configure(1) == 1
