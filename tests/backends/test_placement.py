"""A split's caller stays on its core while the lanes helping it run on the other cores.

(backends/placement.py: after idling, the kernel may put a woken lane on the caller's own
core, and the split then runs on one core.) These tests read where threads run with the
C library's ``sched_getcpu`` and their CPU masks with ``os.sched_getaffinity``; where the
process may run on one CPU only, they check that nothing moves instead.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from backends import handoff, parallel, placement

CPUS = frozenset(os.sched_getaffinity(0))
SEVERAL = len(CPUS) > 1 and placement.ENABLED


def test_the_caller_is_held_on_its_cpu_for_the_block_then_let_go() -> None:
    with placement.keep_here() as elsewhere:
        mask = frozenset(os.sched_getaffinity(0))
        now = placement.current_cpu()
        assert placement.allowed() == CPUS  # what it may run on once let go
    after = frozenset(os.sched_getaffinity(0))
    assert after == CPUS
    if SEVERAL:
        assert now is not None and mask == {now} and elsewhere == CPUS - {now}
    else:
        assert elsewhere is None and mask == CPUS


def test_a_failing_block_still_gives_the_mask_back() -> None:
    with pytest.raises(RuntimeError, match="inside"), placement.keep_here():
        raise RuntimeError("inside")
    assert frozenset(os.sched_getaffinity(0)) == CPUS
    assert placement.allowed() == CPUS


class _Calls:
    """``placement._affinity`` recorded instead of made, on a pretend machine whose calling
    thread runs on CPU 2 with the mask :attr:`mask`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, mask: set[int]) -> None:
        self.mask = frozenset(mask)
        self.calls: list[tuple[int, frozenset[int]]] = []
        monkeypatch.setattr(placement, "ENABLED", True)
        monkeypatch.setattr(placement, "_denied", False)
        monkeypatch.setattr(placement, "current_cpu", lambda: 2)
        monkeypatch.setattr(placement.os, "sched_getaffinity", lambda tid: self.mask)
        monkeypatch.setattr(placement, "_affinity", self._record)

    def _record(self, tid: int, cpus: frozenset[int]) -> bool:
        self.calls.append((tid, cpus))
        return True


def test_the_allowed_cpus_are_the_callers_mask_at_the_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a pretend 4-CPU machine: the lanes go to the caller's other CPUs and the caller gets
    back the mask it had; after an operator narrows the mask on the running process
    (``taskset -a -p``), the next split keeps to the narrower one."""
    calls = _Calls(monkeypatch, {0, 1, 2, 3})
    with placement.keep_here() as elsewhere:
        assert elsewhere == {0, 1, 3}
        assert placement.others(2) == {0, 1, 3}
    assert calls.calls == [(0, frozenset({2})), (0, frozenset({0, 1, 2, 3}))]
    calls.mask = frozenset({1, 2})
    calls.calls.clear()
    with placement.keep_here() as elsewhere:
        assert elsewhere == {1}
        placement.move_to(elsewhere)  # as a lane would (on this thread, here)
    assert calls.calls == [(0, frozenset({2})), (0, frozenset({1})), (0, frozenset({1, 2}))]
    calls.mask = frozenset({2})
    with placement.keep_here() as elsewhere:  # no other CPU allowed: nothing held
        assert elsewhere is None


def test_placement_turns_itself_off_where_the_system_refuses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seccomp filter's EPERM: the first refusal turns placement off, so later splits make
    no more calls."""
    import errno

    tried: list[int] = []

    def refuse(tid: int, cpus: frozenset[int]) -> None:
        tried.append(tid)
        raise PermissionError(errno.EPERM, "refused")

    monkeypatch.setattr(placement, "ENABLED", True)
    monkeypatch.setattr(placement, "_denied", False)
    monkeypatch.setattr(placement, "current_cpu", lambda: 0)
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda tid: frozenset({0, 1}))
    monkeypatch.setattr(placement.os, "sched_setaffinity", refuse)
    with placement.keep_here() as elsewhere:
        assert elsewhere is None
    assert tried == [0] and not placement.enabled()
    with placement.keep_here() as elsewhere:  # a CPU known, but placement off
        assert elsewhere is None
    assert placement.move(1234, frozenset({1})) is False
    assert tried == [0, 1234]  # move itself still tries; splits no longer call it
    assert placement.others(0) is None


def test_a_lane_created_while_its_caller_is_held_still_moves_to_the_other_cpus() -> None:
    """A thread inherits its creator's mask: one made inside the block has one CPU, yet
    :func:`placement.away_from` gives it the process's other CPUs."""
    seen: list[frozenset[int]] = []

    def lane(cpus: frozenset[int] | None) -> None:
        placement.move_to(cpus)
        seen.append(frozenset(os.sched_getaffinity(0)))

    with placement.keep_here() as elsewhere:
        cpu = placement.current_cpu()
        thread = threading.Thread(target=lane, args=(elsewhere,))
        thread.start()
        thread.join()
    if SEVERAL:
        assert cpu is not None and elsewhere == CPUS - {cpu} and seen == [elsewhere]
    else:
        assert elsewhere is None and seen == [CPUS]


def test_a_splits_worker_lanes_run_off_the_callers_cpu() -> None:
    """Every piece a worker lane runs runs on a CPU other than the caller's; the caller's
    pieces on its own; the result is that of the pieces run in order."""
    share = parallel.CoreShare(
        controller=None, look_up=False, pool=ThreadPoolExecutor(3, thread_name_prefix="t-split")
    )
    caller = threading.get_ident()
    where: dict[int, set[int]] = {}
    out = np.zeros(64, np.float32)
    lock = threading.Lock()

    def piece(i: int) -> None:
        out[i] = np.float32(i) * 2
        time.sleep(0.002)  # long enough for a worker lane to join in
        cpu = placement.current_cpu()
        with lock:
            where.setdefault(threading.get_ident(), set()).add(-1 if cpu is None else cpu)

    try:
        for _ in range(20):
            where.clear()  # one split's threads: the caller may be elsewhere in the next
            share.run(piece, list(range(64)), lanes=2)
            if len(where) > 1:
                break
    finally:
        share._pool.shutdown()  # type: ignore[union-attr]
    assert (out == np.arange(64, dtype=np.float32) * 2).all()
    if not SEVERAL:
        return
    assert len(where) > 1, "no worker lane joined in 20 splits"
    mine = where.pop(caller)
    assert len(mine) == 1  # held on one CPU for the split
    for cpus in where.values():
        assert not cpus & mine, (mine, where)


@pytest.mark.skipif(not handoff.ENABLED, reason="the helpers spin on x86-64 only")
def test_a_jobs_helpers_are_moved_off_the_masters_cpu() -> None:
    h = handoff.Helpers()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8), dtype=np.float32)
    from backends import panels

    p = panels.pack(rng.standard_normal((40, 8), dtype=np.float32))
    parts = np.array([(0, 4, 0, 1), (0, 4, 1, 2), (0, 4, 2, 3)], np.int64)
    try:
        with placement.keep_here() as elsewhere:
            cpu = placement.current_cpu()
            assert h.product(x, p.panels, p.zero_bias, np.empty((4, 40), np.float32), parts, 2)
        helper = frozenset(os.sched_getaffinity(h._threads[0].native_id or 0))
        if SEVERAL:
            assert cpu is not None and helper == CPUS - {cpu} == elsewhere
        else:
            assert helper == CPUS
    finally:
        h.close()
    h._place(1)  # after close() emptied its lists: nothing to move, no IndexError
