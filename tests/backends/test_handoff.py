"""backends.handoff: a step's pieces on spinning helper threads, the same bits as one core."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import handoff, kernels, panels
from backends.intrinsics import HALVES

pytestmark = pytest.mark.skipif(not handoff.ENABLED, reason="the helpers spin on x86-64 only")


@pytest.fixture
def helpers() -> Iterator[handoff.Helpers]:
    """Helpers of their own (the process's keep running for other tests), stopped after."""
    h = handoff.Helpers()
    yield h
    h.close()
    assert h.started == 0 and h.awake == 0


def _wait_until(condition: object, what: str) -> None:
    """Waits (up to 30 s) for ``condition()`` to hold: the helpers' state is observable."""
    deadline = time.monotonic() + 30
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _spinning_helper_takes_a_piece(
    h: Any, x: np.ndarray, p: Any, want: np.ndarray, parts: Any, kind: str
) -> None:
    """Wait until helper 0 spins, then until a product's piece goes to it (not the master)."""
    _wait_until(lambda: h.awake == 1, "the helper to spin")
    before = h.taken[0]
    _wait_until(
        lambda: (
            h.product(x, p.panels, p.zero_bias, np.empty_like(want), parts, 2)
            and h.taken[0] > before
        ),
        f"the {kind} helper to take a piece",
    )


def _parts(rows: int, count: int, row_cuts: int, panel_cuts: int) -> np.ndarray:
    return np.array(
        [
            (r0, r1, lo, hi)
            for r0, r1 in _row_cuts(rows, row_cuts).tolist()
            for lo, hi in _row_cuts(count, panel_cuts).tolist()
        ],
        np.int64,
    )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 9),
    out_features=st.integers(1, 90),
    depth=st.integers(1, 40),
    row_cuts=st.integers(1, 3),
    panel_cuts=st.integers(1, 6),
    lanes=st.integers(1, 4),
    halves=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_product_in_pieces_has_the_bits_of_one_call(
    rows: int, out_features: int, depth: int, row_cuts: int, panel_cuts: int, lanes: int,
    halves: bool, seed: int,
) -> None:  # fmt: skip
    """Whatever the parts and however many helpers take them, every output is the one
    :func:`kernels.panel_product` writes in one call by the float32 panels (the weight's
    values halves or not), and nothing outside ``out`` is touched."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_features, depth)).astype(np.float16 if halves else np.float32)
    p = panels.pack(w.astype(np.float32))
    assert p.halves == (halves and HALVES)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    bias = rng.standard_normal(p.zero_bias.shape[0]).astype(np.float32)
    want = np.empty((rows, out_features), np.float32)
    full = panels.pack(w.astype(np.float32), halves=False).panels
    kernels.panel_product(x, full, bias, want, 0, p.panels.shape[0])
    parts = _parts(rows, p.panels.shape[0], row_cuts, panel_cuts)
    padded = np.full((rows + 2, out_features), np.nan, np.float32)
    got = padded[1:-1]
    assert handoff.HELPERS.product(x, p.panels, bias, got, parts, lanes)
    assert got.tobytes() == want.tobytes()
    assert np.isnan(padded[0]).all() and np.isnan(padded[-1]).all()


def _windows(rng: np.random.Generator, members: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    keys = [rng.standard_normal((6, 64, 300)).astype(np.float32) for _ in range(members)]
    values = [rng.standard_normal((6, 300, 64)).astype(np.float32) for _ in range(members)]
    return keys, values


@pytest.mark.parametrize("members", [1, 3])
def test_attention_heads_in_pieces_have_the_bits_of_the_kernel(
    helpers: handoff.Helpers, members: int
) -> None:
    rng = np.random.default_rng(members)
    keys, values = _windows(rng, members)
    q = rng.standard_normal((members, 6 * 64)).astype(np.float32)
    got = np.full_like(q, np.nan)
    assert helpers.attention(q, keys, values, 0.125, got, 2)
    for m in range(members):
        want = np.empty((6, 64), np.float32)
        scores = np.empty((6, 300), np.float32)
        scale = np.float32(0.125)
        kernels.query_attention(q[m].reshape(6, 64), keys[m], values[m], scale, scores, want)
        assert got[m].tobytes() == want.tobytes()


def _job(
    rng: np.random.Generator, rows: int = 3
) -> tuple[np.ndarray, panels.PackedWeight, np.ndarray, np.ndarray]:
    p = panels.pack(rng.standard_normal((800, 64)).astype(np.float32))
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    return x, p, _parts(rows, p.panels.shape[0], 1, 8), panels.linear(x, p, None, lanes=1)


def test_a_helper_spins_between_jobs_and_stops_when_closed() -> None:
    """A job for two lanes starts one helper, which then spins (with no idle limit here)
    and takes pieces of later jobs; close() stops it."""
    h = handoff.Helpers(idle_cycles=1 << 62)
    x, p, parts, want = _job(np.random.default_rng(7))
    try:
        for _ in range(50):
            out = np.empty_like(want)
            assert h.product(x, p.panels, p.zero_bias, out, parts, 2)
            assert out.tobytes() == want.tobytes()
        assert h.started == 1
        _spinning_helper_takes_a_piece(h, x, p, want, parts, "spinning")
        assert h.wakeups == 1  # spinning all along: never woken again
    finally:
        h.close()
    assert h.awake == 0 and h.started == 0


def test_an_idle_helper_sleeps_and_the_next_job_wakes_it() -> None:
    """With a short idle limit the helper sleeps between jobs; each job that finds it asleep
    sets its event, and it begins spinning again (its wake-ups count them)."""
    h = handoff.Helpers(idle_cycles=1 << 10)
    x, p, parts, want = _job(np.random.default_rng(8))
    try:
        for n in range(1, 4):
            _wait_until(lambda: h.awake == 0, "the helper to sleep")
            out = np.empty_like(want)
            assert h.product(x, p.panels, p.zero_bias, out, parts, 2)
            assert out.tobytes() == want.tobytes()
            _wait_until(lambda n=n: h.wakeups == n, f"wake-up {n}")  # type: ignore[misc]
        assert h.started == 1
    finally:
        h.close()


def test_a_job_runs_on_its_lanes_only() -> None:
    """Helpers started by a job of four lanes stay out of a later job of two: only helper 0
    takes its pieces (the share the caller was given, not every helper there is)."""
    h = handoff.Helpers(idle_cycles=1 << 62)
    x, p, parts, want = _job(np.random.default_rng(9), rows=8)
    try:
        assert h.product(x, p.panels, p.zero_bias, np.empty_like(want), parts, 4)
        assert h.started == 3
        _wait_until(lambda: h.awake == 3, "three helpers to spin")
        before = h.taken
        for _ in range(200):
            out = np.empty_like(want)
            assert h.product(x, p.panels, p.zero_bias, out, parts, 2)
            assert out.tobytes() == want.tobytes()
        after = h.taken
        assert after[1:] == before[1:]
    finally:
        h.close()


def test_one_master_at_a_time_others_are_told_to_run_alone(helpers: handoff.Helpers) -> None:
    """While a caller holds the board another gets False (and nothing written); callers on
    several threads each get their own values, through the board or alone."""
    rng = np.random.default_rng(8)
    p = panels.pack(rng.standard_normal((500, 96)).astype(np.float32))
    x = rng.standard_normal((2, 96)).astype(np.float32)
    want = panels.linear(x, p, None, lanes=1)
    parts = _parts(2, p.panels.shape[0], 1, 5)
    out = np.full_like(want, np.nan)
    with helpers._holder:  # another caller's job
        assert not helpers.product(x, p.panels, p.zero_bias, out, parts, 2)
    assert np.isnan(out).all()
    failures: list[str] = []
    board_runs = [0, 0]

    def caller(k: int) -> None:
        for _ in range(200):
            got = np.empty_like(want)
            if helpers.product(x, p.panels, p.zero_bias, got, parts, 2):
                board_runs[k] += 1
            else:
                got = panels.linear(x, p, None, lanes=1)
            if got.tobytes() != want.tobytes():
                failures.append("wrong values")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and sum(board_runs) > 0


def test_operands_that_do_not_fit_are_refused_before_any_piece(helpers: handoff.Helpers) -> None:
    rng = np.random.default_rng(9)
    p = panels.pack(rng.standard_normal((40, 8)).astype(np.float32))
    x = rng.standard_normal((2, 8)).astype(np.float32)
    out = np.full((2, 40), np.nan, np.float32)
    for parts in ([(0, 3, 0, 3)], [(0, 2, 0, 4)], [(1, 1, 0, 3)], [(0, 2, 2, 1)], [(0, 2, -1, 3)]):
        with pytest.raises(ValueError, match="part"):
            helpers.product(x, p.panels, p.zero_bias, out, np.array(parts, np.int64), 2)
    with pytest.raises(ValueError, match="panels"):
        helpers.product(x, p.panels, p.zero_bias[:-1], out, np.array([(0, 2, 0, 3)], np.int64), 2)
    assert np.isnan(out).all()
    keys, values = _windows(rng, 2)
    q = rng.standard_normal((2, 384)).astype(np.float32)
    with pytest.raises(ValueError, match="shapes"):
        helpers.attention(q, keys, [values[0], values[1][:, :200]], 0.1, np.empty_like(q), 2)
    wide = keys[1].astype(np.float64)
    with pytest.raises(ValueError, match="C-contiguous"):
        helpers.attention(q, [keys[0], wide], values, 0.1, np.empty_like(q), 2)
    with pytest.raises(ValueError, match="members"):
        helpers.attention(q[:1], keys, values, 0.1, np.empty_like(q[:1]), 2)


def test_after_close_a_job_runs_on_its_master_alone() -> None:
    h = handoff.Helpers()
    rng = np.random.default_rng(10)
    p = panels.pack(rng.standard_normal((300, 32)).astype(np.float32))
    x = rng.standard_normal((1, 32)).astype(np.float32)
    parts = _parts(1, p.panels.shape[0], 1, 4)
    out = np.empty((1, 300), np.float32)
    assert h.product(x, p.panels, p.zero_bias, out, parts, 3)
    assert h.started == 2
    h.close()
    assert h.started == 0 and h.awake == 0
    again = np.full_like(out, np.nan)
    assert h.product(x, p.panels, p.zero_bias, again, parts, 3)
    assert h.started == 0 and again.tobytes() == out.tobytes()


def test_the_job_generation_wraps_without_losing_a_job(helpers: handoff.Helpers) -> None:
    """The claim word keeps a job's generation in 31 bits: after the last one the next job
    is generation 0, and it runs like any other (a stale claim can never match it)."""
    rng = np.random.default_rng(11)
    p = panels.pack(rng.standard_normal((200, 16)).astype(np.float32))
    x = rng.standard_normal((2, 16)).astype(np.float32)
    parts = _parts(2, p.panels.shape[0], 2, 3)
    want = panels.linear(x, p, None, lanes=1)
    helpers._board[handoff.WORD] = handoff._GENERATIONS << 32
    for generation in (0, 1):
        got = np.full_like(want, np.nan)
        assert helpers.product(x, p.panels, p.zero_bias, got, parts, 2)
        assert got.tobytes() == want.tobytes()
        assert int(helpers._board[handoff.WORD]) >> 32 == generation


def _sgemm_or_skip() -> int:
    from backends.piper import blas

    if not blas.ADDRESS:
        pytest.skip("numpy's ILP64 cblas_sgemm not found: convolutions do not go to the helpers")
    return blas.ADDRESS


def _row_cuts(rows: int, cuts: int) -> np.ndarray:
    r = sorted({0, rows, *(rows * i // cuts for i in range(cuts))})
    return np.array(list(itertools.pairwise(r)), np.int64)


@settings(max_examples=40, deadline=None)
@given(
    k=st.integers(1, 4),
    c_out=st.integers(1, 40),
    c_in=st.integers(1, 12),
    n=st.integers(1, 30),
    dilation=st.integers(1, 3),
    start=st.integers(0, 3),
    cuts=st.integers(1, 4),
    lanes=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_a_convolution_in_row_pieces_has_the_bits_of_its_pieces_run_in_order(
    k: int, c_out: int, c_in: int, n: int, dilation: int, start: int, cuts: int, lanes: int,
    seed: int,
) -> None:  # fmt: skip
    """Whatever the row pieces and however many helpers take them, every output row is what
    the same pieces' SGEMMs write run one after another (``blas.conv_rows`` on one lane), the
    convolution's value, over strided rows, and nothing outside the output is touched."""
    from backends import parallel
    from backends.piper import blas

    sgemm = _sgemm_or_skip()
    rng = np.random.default_rng(seed)
    taps = rng.standard_normal((k, c_out, c_in)).astype(np.float32)
    width = start + dilation * (k - 1) + n
    src = rng.standard_normal((c_in, width + 5)).astype(np.float32)[:, : width + 2]
    start_values = rng.standard_normal((c_out, n)).astype(np.float32)
    parts = _row_cuts(c_out, cuts)
    padded = np.full((c_out + 2, n + 7), np.nan, np.float32)
    got = padded[1:-1, 3 : 3 + n]
    got[...] = start_values
    want = start_values.copy()
    with parallel.one_thread():
        blas.conv_rows(want, taps, src, start, dilation, parts, 1)
        flat_src, lds = kernels.flat_rows(src, writeable=False)
        flat_out, ldo = kernels.flat_rows(got, writeable=True)
        ran = handoff.HELPERS.conv(
            taps, flat_src, lds, start, dilation, flat_out, ldo, n, parts, lanes, sgemm
        )
    assert ran
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    reference = start_values.astype(np.float64)
    for j in range(k):
        s0 = start + dilation * j
        reference += taps[j].astype(np.float64) @ src[:, s0 : s0 + n].astype(np.float64)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)
    assert np.isnan(padded[0]).all() and np.isnan(padded[-1]).all()
    assert np.isnan(padded[1:-1, :3]).all() and np.isnan(padded[1:-1, 3 + n :]).all()


def test_a_convolution_job_goes_to_its_helpers() -> None:
    """With two lanes one helper starts and, spinning, takes pieces of later jobs (observed
    by its count of pieces, not by time); the values are the pieces' run in order."""
    from backends import parallel
    from backends.piper import blas

    sgemm = _sgemm_or_skip()
    rng = np.random.default_rng(12)
    taps = rng.standard_normal((3, 64, 32)).astype(np.float32)
    src = rng.standard_normal((32, 402)).astype(np.float32)
    parts = _row_cuts(64, 8)
    flat_src, lds = kernels.flat_rows(src, writeable=False)
    h = handoff.Helpers(idle_cycles=1 << 62)

    def job() -> np.ndarray:
        out = np.zeros((64, 400), np.float32)
        flat_out, ldo = kernels.flat_rows(out, writeable=True)
        assert h.conv(taps, flat_src, lds, 0, 1, flat_out, ldo, 400, parts, 2, sgemm)
        return out

    try:
        with parallel.one_thread():
            want = np.zeros((64, 400), np.float32)
            blas.conv_rows(want, taps, src, 0, 1, parts, 1)
            assert job().tobytes() == want.tobytes()
            assert h.started == 1
            _wait_until(lambda: h.awake == 1, "the helper to spin")
            _wait_until(
                lambda: job().tobytes() == want.tobytes() and h.taken[0] > 0,
                "the spinning helper to take a piece",
            )
    finally:
        h.close()


def test_convolution_operands_that_do_not_fit_are_refused_before_any_piece(
    helpers: handoff.Helpers,
) -> None:
    sgemm = _sgemm_or_skip()
    taps = np.ones((3, 4, 2), np.float32)
    src = np.ones((2, 20), np.float32)
    out = np.full((4, 10), np.nan, np.float32)
    flat_src, lds = kernels.flat_rows(src, writeable=False)
    flat_out, ldo = kernels.flat_rows(out, writeable=True)
    whole = np.array([(0, 4)], np.int64)

    def conv(**change: object) -> bool:
        args: dict[str, object] = {
            "taps": taps, "src": flat_src, "lds": lds, "start": 0, "dilation": 1,
            "out": flat_out, "ldo": ldo, "n": 10, "parts": whole, "lanes": 2, "sgemm": sgemm,
        }  # fmt: skip
        args.update(change)
        return helpers.conv(**args)  # type: ignore[arg-type]

    for parts in ([(0, 5)], [(2, 2)], [(-1, 2)], [(3, 1)]):
        with pytest.raises(ValueError, match="part"):
            conv(parts=np.array(parts, np.int64))
    with pytest.raises(ValueError, match="fit"):
        conv(start=9)  # 9 + 2 + 10 > 20 columns
    with pytest.raises(ValueError, match="fit"):
        conv(n=11)  # more columns than out's rows hold
    with pytest.raises(ValueError, match="fit"):
        conv(taps=np.ones((3, 5, 2), np.float32))  # five output rows in out's four
    with pytest.raises(ValueError, match="stride"):
        conv(lds=10)  # rows of src overlap
    with pytest.raises(ValueError, match=">= 1"):
        conv(dilation=0)
    with pytest.raises(ValueError, match=">= 1"):
        conv(sgemm=0)
    assert np.isnan(out).all()


def test_spinning_threads_yield_through_the_c_librarys_sched_yield() -> None:
    """A board knows ``sched_yield`` (Linux: always found); jobs give the same bits whether
    the spinning threads call it or not (the slot at 0: they only pause), and a helper
    kept spinning far longer than :data:`handoff.YIELD_EVERY` spins still takes pieces."""
    h = handoff.Helpers(idle_cycles=1 << 62)
    x, p, parts, want = _job(np.random.default_rng(13))
    address = int(h._board[handoff.YIELD])
    assert address != 0
    try:
        for slot in (address, 0, address):
            h._board[handoff.YIELD] = slot
            for _ in range(20):
                out = np.empty_like(want)
                assert h.product(x, p.panels, p.zero_bias, out, parts, 2)
                assert out.tobytes() == want.tobytes()
        _spinning_helper_takes_a_piece(h, x, p, want, parts, "yielding")
    finally:
        h.close()
