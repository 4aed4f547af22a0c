"""The original runtime's guard (reference §3.9, §7.7 test_server_busy_guard)."""

from __future__ import annotations

from core.admission import Granted, Queued, Rejected
from core.guard import BusyGuard


def test_timeout_zero_waits_forever_behind_wedged_holder() -> None:
    g = BusyGuard("m")
    assert isinstance(g.acquire(1, 0.0, 0), Granted)
    dec = g.acquire(2, 1000.0, 0)
    assert isinstance(dec, Queued) and dec.deadline is None
    assert not g.expire(10_000.0)
    assert g.waiting == 1


def test_eight_workers_all_park_with_timeout_zero() -> None:
    g = BusyGuard("m")
    g.acquire(0, 0.0, 0)
    for t in range(1, 9):
        assert isinstance(g.acquire(t, 0.0, 0), Queued)
    assert g.waiting == 8
    served = []
    holder = 0
    while True:
        wake = g.release(holder, 1.0)
        if not wake.granted:
            break
        holder = wake.granted[0].ticket
        served.append(holder)
    assert sorted(served) == list(range(1, 9))


def test_every_worker_busy_with_fifty_ms() -> None:
    g = BusyGuard("m")
    g.acquire(0, 0.0, 0)
    for t in range(1, 9):
        assert isinstance(g.acquire(t, 0.0, 0.050), Queued)
    wake = g.expire(0.050)
    assert sorted(e.ticket for e in wake.expired) == list(range(1, 9))
    assert all("timed out after 50 ms waiting for the inference lock" in e.message for e in wake.expired)


def test_overrun_holder_rejects_at_once() -> None:
    g = BusyGuard("m")
    g.acquire(1, 0.0, 0)
    dec = g.acquire(2, 0.2, 0.050)
    assert isinstance(dec, Rejected)
    assert "current inference has run 200 ms (busy_timeout_ms=50)" in dec.message
    assert "likely wedged" in dec.message


def test_guard_reusable_after_long_run_and_after_error() -> None:
    g = BusyGuard("m")
    g.acquire(1, 0.0, 0)
    g.release(1, 100.0)
    assert isinstance(g.acquire(2, 100.0, 0.05), Granted)
    g.release(2, 100.1)  # error path releases too
    assert isinstance(g.acquire(3, 100.2, 0.05), Granted)


def test_idle_guard_acquires_immediately() -> None:
    g = BusyGuard("m")
    dec = g.acquire(1, 5.0, 0.001)
    assert isinstance(dec, Granted) and dec.fast


def test_no_fifo_the_chooser_decides() -> None:
    g = BusyGuard("m")
    g.acquire(0, 0.0, 0)
    for t in (1, 2, 3):
        g.acquire(t, 0.0, 0)
    wake = g.release(0, 1.0, choose=lambda c: c[-1])
    assert wake.granted[0].ticket == 3
