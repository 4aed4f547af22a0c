"""Retry-After: every refusal and expiry says when a slot would be free, from hold times."""

from __future__ import annotations

import pytest

from core.admission import Admission, Expired, Granted, Queued, Rejected, RetryAfter, RetryBasis
from core.events import Reason
from core.guard import GuardAdmission


def hold(a: Admission, ticket: int, start: float, end: float) -> None:
    """One request that holds a slot from ``start`` to ``end`` (the queue is empty)."""
    assert isinstance(a.request(ticket, start, None), Granted)
    a.release(ticket, end)


def test_rounding_is_up_and_at_least_one_second() -> None:
    assert RetryAfter.of(0.0, RetryBasis.OBSERVED).seconds == 1
    assert RetryAfter.of(0.2, RetryBasis.OBSERVED).seconds == 1
    assert RetryAfter.of(1.01, RetryBasis.OBSERVED).seconds == 2
    assert RetryAfter.of(7.0, RetryBasis.OBSERVED).seconds == 7
    assert RetryAfter.of(float("inf"), RetryBasis.OBSERVED).seconds == 1


def test_nothing_to_go_on_gives_the_default() -> None:
    a = Admission("m", 2, max_queue=0)
    assert a.retry_after(0.0) == RetryAfter(1, RetryBasis.DEFAULT)


def test_overdue_rejection_reflects_the_observed_hold_time() -> None:
    """Holds of 8 s observed; a new holder started 1 s ago: a slot is expected in 7 s, not 1."""
    a = Admission("m", 1)
    hold(a, 1, 0.0, 8.0)
    assert isinstance(a.request(2, 10.0, None), Granted)
    # its 0.5 s timeout is overrun by the only holder: rejected at once
    dec = a.request(3, 11.0, 0.5)
    assert isinstance(dec, Rejected) and dec.reason is Reason.SLOTS_OVERDUE
    assert dec.retry_after == RetryAfter(7, RetryBasis.OBSERVED)


def test_queue_full_counts_the_requests_ahead() -> None:
    """2 slots busy (mean hold 4 s, each 1 s in), 3 queued: the client's turn comes after 3
    handovers."""
    a = Admission("m", 2, max_queue=3)
    hold(a, 1, 0.0, 4.0)
    assert isinstance(a.request(2, 10.0, None), Granted)
    assert isinstance(a.request(3, 10.0, None), Granted)
    for t in (4, 5, 6):
        assert isinstance(a.request(t, 10.0, None), Queued)
    dec = a.request(7, 11.0, None)
    assert isinstance(dec, Rejected) and dec.reason is Reason.QUEUE_FULL
    # slots free at 3, 3; ticket 4 holds 3..7, ticket 5 3..7, ticket 6 7..11; ours at 7
    assert dec.retry_after == RetryAfter(7, RetryBasis.OBSERVED)


def test_a_holder_past_the_mean_is_expected_to_need_one_more_mean() -> None:
    a = Admission("m", 1)
    hold(a, 1, 0.0, 3.0)
    assert isinstance(a.request(2, 10.0, None), Granted)
    dec = a.request(3, 20.0, 1.0)  # the holder has run 10 s, past the 3 s mean
    assert isinstance(dec, Rejected)
    assert dec.retry_after == RetryAfter(3, RetryBasis.OBSERVED)


def test_before_any_hold_finishes_the_longest_running_one_is_the_estimate() -> None:
    a = Admission("m", 1)
    assert isinstance(a.request(1, 0.0, None), Granted)
    dec = a.request(2, 5.0, 1.0)
    assert isinstance(dec, Rejected)
    assert dec.retry_after == RetryAfter(5, RetryBasis.RUNNING)


def test_the_moving_average_follows_recent_holds() -> None:
    a = Admission("m", 1)
    hold(a, 1, 0.0, 10.0)
    for i in range(2, 30):  # 28 holds of 1.5 s: the average is 1.5 + 8.5 * 0.8**28 = 1.516
        hold(a, i, 100.0 * i, 100.0 * i + 1.5)
    assert isinstance(a.request(99, 10_000.0, None), Granted)
    assert isinstance(a.request(100, 10_000.0, 0.0001), Queued)
    (expired,) = a.expire(10_000.0001).expired
    assert expired.reason is Reason.QUEUE_TIMEOUT
    assert expired.retry_after == RetryAfter(2, RetryBasis.OBSERVED)


def test_an_expired_waiter_gets_an_estimate_from_its_deadline() -> None:
    a = Admission("m", 1)
    hold(a, 1, 0.0, 6.0)
    assert isinstance(a.request(2, 10.0, None), Granted)
    assert isinstance(a.request(3, 10.0, 2.0), Queued)
    (expired,) = a.expire(12.0).expired
    assert isinstance(expired, Expired)
    # the holder is 2 s into a 6 s hold
    assert expired.retry_after == RetryAfter(4, RetryBasis.OBSERVED)


def test_idle_after_is_when_every_slot_is_free() -> None:
    a = Admission("m", 2)
    hold(a, 1, 0.0, 5.0)
    assert isinstance(a.request(2, 10.0, None), Granted)  # frees at 15
    assert isinstance(a.request(3, 13.0, None), Granted)  # frees at 18
    assert a.retry_after(14.0) == RetryAfter(1, RetryBasis.OBSERVED)
    assert a.idle_after(14.0) == RetryAfter(4, RetryBasis.OBSERVED)


@pytest.mark.parametrize(("now", "seconds"), [(0.5, 4), (3.0, 1), (6.0, 4)])
def test_the_original_runtime_guard_estimates_too(now: float, seconds: int) -> None:
    g = GuardAdmission("m")
    hold(g, 1, -10.0, -6.0)  # one 4 s hold observed
    assert isinstance(g.request(2, 0.0, None), Granted)
    dec = g.request(3, now, 0.1)
    assert isinstance(dec, Rejected) and dec.reason is Reason.SLOTS_OVERDUE
    assert dec.retry_after == RetryAfter(seconds, RetryBasis.OBSERVED)
