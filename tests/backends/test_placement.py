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
    with placement.keep_here() as cpu:
        mask = frozenset(os.sched_getaffinity(0))
        now = placement.current_cpu()
    after = frozenset(os.sched_getaffinity(0))
    assert after == CPUS
    if SEVERAL:
        assert cpu is not None and mask == {cpu} and now == cpu
    else:
        assert cpu is None and mask == CPUS


def test_a_lane_created_while_its_caller_is_held_still_moves_to_the_other_cpus() -> None:
    """A thread inherits its creator's mask: one made inside the block has one CPU, yet
    :func:`placement.away_from` gives it the process's other CPUs."""
    seen: list[frozenset[int]] = []

    def lane(cpu: int | None) -> None:
        placement.away_from(cpu)
        seen.append(frozenset(os.sched_getaffinity(0)))

    with placement.keep_here() as cpu:
        thread = threading.Thread(target=lane, args=(cpu,))
        thread.start()
        thread.join()
    if SEVERAL:
        assert cpu is not None and seen == [CPUS - {cpu}]
    else:
        assert seen == [CPUS]


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
        with placement.keep_here() as cpu:
            assert h.product(x, p.panels, p.zero_bias, np.empty((4, 40), np.float32), parts, 2)
        helper = frozenset(os.sched_getaffinity(h._threads[0].native_id or 0))
        if SEVERAL:
            assert cpu is not None and helper == CPUS - {cpu}
        else:
            assert helper == CPUS
    finally:
        h.close()
