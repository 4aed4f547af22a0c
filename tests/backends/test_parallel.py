"""backends.parallel: an op's pieces on the caller's share of the cores, the BLAS held at one
thread meanwhile, results independent of the share."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from backends import parallel
from backends.numpy_backend import NumpyBackend
from backends.parallel import CoreShare


class FakeBlas:
    """A BLAS thread count that records every setting."""

    def __init__(self, threads: int) -> None:
        self.num_threads = threads
        self.settings: list[int] = []

    def set_num_threads(self, n: int) -> None:
        self.num_threads = n
        self.settings.append(n)


def test_share_follows_the_blas_until_set() -> None:
    blas = FakeBlas(4)
    share = CoreShare(blas)
    assert share.share() == 4
    share.set_threads(2)
    assert share.share() == 2 and blas.num_threads == 2
    share.set_threads(None)
    assert share.share() == 2  # the BLAS's own count again (left at 2)


def test_no_blas_control_runs_pieces_in_order_on_the_caller() -> None:
    share = CoreShare(None, look_up=False)
    seen: list[tuple[int, str]] = []
    share.run(lambda i: seen.append((i, threading.current_thread().name)), range(5))
    me = threading.current_thread().name
    assert seen == [(i, me) for i in range(5)]


def test_split_holds_the_blas_at_one_thread_and_restores_it() -> None:
    blas = FakeBlas(2)
    share = CoreShare(blas)
    during: list[int] = []
    threads: set[str] = set()
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=30)

    def piece(i: int) -> None:
        with lock:
            during.append(blas.num_threads)
            threads.add(threading.current_thread().name)
        if i < 2:
            both.wait()  # the first two pieces run at the same time, on two threads

    share.run(piece, range(6))
    assert sorted(during) == [1] * 6
    assert len(threads) == 2
    assert blas.num_threads == 2 and blas.settings == [1, 2]


def test_a_share_set_during_a_split_applies_when_it_ends() -> None:
    blas = FakeBlas(2)
    share = CoreShare(blas)

    def piece(i: int) -> None:
        if i == 0:
            share.set_threads(1)  # another call began: its share is 1
            assert blas.num_threads == 1  # still held for the split

    share.run(piece, range(2))
    assert blas.settings == [1, 1] and share.share() == 1


def test_a_failing_piece_raises_after_every_piece_ended_and_restores() -> None:
    blas = FakeBlas(2)
    share = CoreShare(blas)
    lock = threading.Lock()
    running: list[int] = []
    started: list[int] = []

    def piece(i: int) -> None:
        with lock:
            running.append(i)
            started.append(i)
        try:
            if i == 1:
                raise ValueError("piece 1")
        finally:
            with lock:
                running.remove(i)

    with pytest.raises(ValueError, match="piece 1"):
        share.run(piece, range(6))
    assert running == [] and 1 in started  # no piece still running when it raised
    assert blas.num_threads == 2


def test_items_go_out_in_order_and_a_late_worker_is_withdrawn() -> None:
    """The caller takes every item while the only worker is busy elsewhere (a core another
    job holds): the split returns without waiting for that worker to start."""
    blas = FakeBlas(2)
    pool = ThreadPoolExecutor(1)
    share = CoreShare(blas, pool=pool)
    release = threading.Event()
    blocker = pool.submit(release.wait)  # the only worker is busy
    try:
        seen: list[tuple[int, str]] = []
        share.run(lambda i: seen.append((i, threading.current_thread().name)), range(5))
        me = threading.current_thread().name
        assert seen == [(i, me) for i in range(5)]
        assert blas.num_threads == 2
    finally:
        release.set()
        blocker.result()
        pool.shutdown()


def _attention_and_gelu() -> tuple[np.ndarray, np.ndarray]:
    be = NumpyBackend()
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 6, 1500, 64), dtype=np.float32) for _ in range(3))
    x = rng.standard_normal((1, 1500, 1536), dtype=np.float32)
    return np.asarray(be.attention(q, k, v)), np.asarray(be.gelu(x))


def test_numpy_ops_split_give_the_same_bits_as_in_order() -> None:
    """Whisper's encoder attention (6 heads over 1500 frames) and its FFN's GELU split over
    2 and 3 cores equal the in-order result bit for bit."""
    from threadpoolctl import threadpool_limits

    original = parallel.SHARE.share
    results = []
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            for n in (1, 2, 3):
                parallel.SHARE.share = lambda n=n: n  # type: ignore[method-assign]
                results.append(_attention_and_gelu())
    finally:
        parallel.SHARE.share = original  # type: ignore[method-assign]
    for attention, gelu in results[1:]:
        assert np.array_equal(attention, results[0][0])
        assert np.array_equal(gelu, results[0][1])


def test_one_thread_holds_the_blas_for_the_block_and_restores_it() -> None:
    blas = FakeBlas(2)
    share = CoreShare(blas)
    with share.one_thread():
        assert blas.num_threads == 1
        share.set_threads(2)  # a share set meanwhile applies when the block ends
        assert blas.num_threads == 1
        seen: list[int] = []
        share.run(lambda i: seen.append(blas.num_threads), range(3))
        assert seen == [1, 1, 1] and blas.num_threads == 1  # the split inside keeps it held
    assert blas.num_threads == 2 and blas.settings == [1, 2]


def test_one_thread_restores_after_an_exception_and_without_control() -> None:
    blas = FakeBlas(3)
    share = CoreShare(blas)
    with pytest.raises(RuntimeError, match="inside"), share.one_thread():
        raise RuntimeError("inside")
    assert blas.num_threads == 3 and blas.settings == [1, 3]
    with CoreShare(None, look_up=False).one_thread():
        pass  # nothing to hold


def test_wide_products_split_by_columns_give_the_whole_products_bits() -> None:
    """A few rows times a wide matrix (Whisper's vocabulary projection) in column tiles on
    2 and 3 cores equals numpy's whole product at one thread bit for bit; more rows are
    numpy's product as it is."""
    from threadpoolctl import threadpool_limits

    be = NumpyBackend()
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((384, 51864), dtype=np.float32)
    original = parallel.SHARE.share
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            for rows in (1, 2, 4, 8):
                a = rng.standard_normal((rows, 384), dtype=np.float32)
                whole = np.matmul(a, wide)
                for n in (1, 2, 3):
                    parallel.SHARE.share = lambda n=n: n  # type: ignore[method-assign]
                    assert np.array_equal(np.asarray(be.matmul(a, wide)), whole), (rows, n)
    finally:
        parallel.SHARE.share = original  # type: ignore[method-assign]


def test_a_split_in_another_thread_holds_the_real_blas_at_one_thread() -> None:
    """threadpoolctl lets only the thread that first set OpenBLAS's count set it again: the
    server's main thread sets it at start-up, its sessions run in worker threads. A split
    started in a worker thread still holds the BLAS at one thread for its pieces and gives
    the count back."""
    from threadpoolctl import ThreadpoolController, threadpool_limits

    blas = ThreadpoolController().select(user_api="blas").lib_controllers[0]
    share = CoreShare()
    seen: list[int] = []
    lock = threading.Lock()

    def piece(i: int) -> None:
        with lock:
            seen.append(int(blas.num_threads))

    with threadpool_limits(limits=2, user_api="blas"):  # the main thread takes control
        worker = threading.Thread(target=share.run, args=(piece, range(4)))
        worker.start()
        worker.join()
        after = int(blas.num_threads)
    assert seen == [1, 1, 1, 1] and after == 2


def test_a_split_inside_a_piece_runs_in_order_on_the_pieces_thread() -> None:
    """A piece is one core's work: a split it starts (a batch member's convs in tiles) takes
    no other core; outside any piece the share is whole again."""
    share = CoreShare(FakeBlas(2))
    share.set_threads(2)  # as the server's adaptive threads set it: held during splits too
    inner: dict[int, list[tuple[int, str]]] = {}
    shares: list[int] = []
    both = threading.Barrier(2, timeout=30)

    def piece(i: int) -> None:
        both.wait()  # the two pieces run at once, on two threads
        shares.append(share.share())
        me = threading.current_thread().name
        seen: list[tuple[int, str]] = []
        share.run(lambda j: seen.append((j, threading.current_thread().name)), range(4))
        inner[i] = seen
        assert seen == [(j, me) for j in range(4)]

    assert not share.in_piece()
    share.run(piece, range(2))
    assert shares == [1, 1] and sorted(inner) == [0, 1]
    assert not share.in_piece() and share.share() == 2


def test_a_failing_piece_leaves_its_thread_out_of_the_piece() -> None:
    share = CoreShare(FakeBlas(2))
    share.set_threads(2)

    def piece(i: int) -> None:
        raise ValueError(f"piece {i}")

    with pytest.raises(ValueError):
        share.run(piece, range(2))
    assert not share.in_piece() and share.share() == 2
    seen: list[str] = []
    share.run(lambda i: seen.append(threading.current_thread().name), range(1))
    assert len(seen) == 1 and not share.in_piece()


def test_sequential_runs_splits_in_order_and_leaves_the_blas_as_it_is() -> None:
    """sequential(): a split inside the block runs its items in order on the calling thread
    (the share reads 1), the BLAS count is not touched, other threads keep the share, and
    the thread is out of the block again after an exception."""
    blas = FakeBlas(2)
    share = CoreShare(blas)
    share.set_threads(2)
    me = threading.current_thread().name
    other: list[int] = []
    with share.sequential():
        assert share.in_piece() and share.share() == 1
        seen: list[tuple[int, str, int]] = []
        share.run(
            lambda i: seen.append((i, threading.current_thread().name, blas.num_threads)), range(4)
        )
        assert seen == [(i, me, 2) for i in range(4)]
        with share.sequential():  # nests
            assert share.share() == 1
        assert share.in_piece()
        elsewhere = threading.Thread(target=lambda: other.append(share.share()))
        elsewhere.start()
        elsewhere.join()
    assert other == [2]
    assert not share.in_piece() and share.share() == 2 and blas.settings == [2]
    with pytest.raises(RuntimeError, match="inside"), share.sequential():
        raise RuntimeError("inside")
    assert not share.in_piece() and share.share() == 2


def test_threads_first_using_a_share_at_once_all_get_its_blas_control(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control is looked up once: a thread that asks while another's lookup runs waits
    for it instead of running without control (a share of 1, ``one_thread`` doing nothing)."""
    started, release = threading.Event(), threading.Event()
    blas = FakeBlas(2)
    calls = []

    def slow_lookup() -> FakeBlas:
        calls.append(1)
        started.set()
        release.wait(10)
        return blas

    monkeypatch.setattr(parallel, "_blas_controller", slow_lookup)
    share = CoreShare()
    seen: list[int] = []
    first = threading.Thread(target=lambda: seen.append(share.share()))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=lambda: seen.append(share.share()))
    second.start()
    second.join(0.2)  # waits for the first lookup (or, before the fix, saw no control)
    release.set()
    first.join(10)
    second.join(10)
    assert seen == [2, 2] and calls == [1]
