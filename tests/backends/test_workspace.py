"""Workspaces: buffers kept from call to call, one caller at a time, bounded."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.workspace import Workspace, Workspaces


def _base(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_a_slot_hands_out_its_buffer_again_and_grows_to_the_largest_request() -> None:
    work = Workspace(1 << 20)
    a = work.take("x", (4, 100))
    assert a.shape == (4, 100) and a.dtype == np.float32 and a.flags.c_contiguous
    b = work.take("x", (3, 50))  # smaller: the same memory
    assert _base(b) == _base(a)
    c = work.take("x", (8, 100))  # larger: a new buffer, kept from now on
    assert work.kept_bytes == 8 * 100 * 4
    assert _base(work.take("x", (4, 100))) == _base(c)
    other = work.take("y", (4, 100))  # another slot: other memory
    assert not np.may_share_memory(other, work.take("x", (8, 100)))
    assert work.kept_bytes == 12 * 100 * 4


def test_a_request_over_the_bound_gets_a_new_array_that_is_not_kept() -> None:
    work = Workspace(4000)
    kept = work.take("x", (10, 100))  # 4,000 bytes: kept
    big = work.take("x", (10, 101))
    assert big.shape == (10, 101) and not np.may_share_memory(big, kept)
    assert work.kept_bytes == 4000
    assert _base(work.take("x", (10, 100))) == _base(kept)
    assert Workspace(0).take("x", (2, 3)).shape == (2, 3)
    assert Workspace(0).kept_bytes == 0


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 300)), max_size=30))
def test_what_a_slot_keeps_is_its_largest_request_within_the_bound(
    takes: list[tuple[str, int]],
) -> None:
    work = Workspace(800)
    for slot, n in takes:
        assert work.take(slot, (n,)).shape == (n,)
    largest = [max((n for s, n in takes if s == slot and 4 * n <= 800), default=0) for slot in "ab"]
    assert work.kept_bytes == 4 * sum(largest)


def test_callers_at_the_same_time_hold_different_workspaces_then_reuse_them() -> None:
    pool = Workspaces(1 << 20)
    with pool.taken() as first, pool.taken() as second:
        assert first is not second
        assert pool.made == 2
    with pool.taken() as again:  # the one freed last
        assert again is first
    assert pool.made == 2


def test_a_workspace_is_returned_when_its_caller_fails() -> None:
    pool = Workspaces(1 << 20)
    with pytest.raises(RuntimeError), pool.taken() as held:
        raise RuntimeError("the decode failed")
    with pool.taken() as next_caller:
        assert next_caller is held
    assert pool.made == 1


def test_threads_never_share_a_workspace() -> None:
    pool = Workspaces(1 << 20)
    holders: dict[int, int] = {}
    clash = threading.Event()
    barrier = threading.Barrier(4)
    lock = threading.Lock()

    def caller(k: int) -> None:
        for turn in range(200):
            with pool.taken() as work:
                with lock:
                    if id(work) in holders.values():
                        clash.set()
                    holders[k] = id(work)
                if turn == 0:  # all four hold one at once
                    barrier.wait()
                with lock:
                    del holders[k]

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clash.is_set()
    assert pool.made == 4
