"""The numba kernels of the numpy backend (backends/kernels.py) against numpy's formulas."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from backends import erf, kernels
from backends.numpy_backend import NumpyBackend, _exp_rows


def _numpy_exp_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact exp (float64) of the same float32 differences as the kernel's, and sums."""
    e = np.exp((x - x.max(axis=-1, keepdims=True)).astype(np.float64))
    return e, e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("width", [1, 7, 8, 9, 64, 1500])
def test_softmax_rows_matches_exp_to_float32_rounding(width: int) -> None:
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((37, width)) * rng.uniform(0.1, 40, (37, 1))).astype(np.float32)
    want, want_sums = _numpy_exp_rows(x)
    got, sums = x.copy(), np.empty((37, 1), np.float32)
    kernels.softmax_rows(got, sums)
    assert np.all(got.max(axis=-1) == 1.0)  # the row's maximum maps to exp(0) exactly
    assert np.allclose(got, want, rtol=4e-7, atol=1e-37)
    assert np.allclose(sums, want_sums, rtol=2e-6)


def test_softmax_rows_masked_scores_are_zero_and_tiny_ones_vanish() -> None:
    x = np.zeros((3, 20), np.float32)
    x[0, 5:] = -np.inf  # a causal mask's row
    x[1, ::2] = -100.0  # exp(-100) is below float32's normal range
    x[2, 3] = np.float32(-86.5)  # just inside it
    got, sums = x.copy(), np.empty((3, 1), np.float32)
    kernels.softmax_rows(got, sums)
    assert np.array_equal(got[0], np.r_[np.ones(5), np.zeros(15)].astype(np.float32))
    assert np.all(got[1, ::2] == 0.0) and np.all(got[1, 1::2] == 1.0)
    assert got[2, 3] == pytest.approx(np.exp(np.float64(-86.5)), rel=1e-6)
    assert sums[:, 0].tolist() == [5.0, 10.0, pytest.approx(19.0)]


def test_softmax_row_sums_do_not_depend_on_the_block_a_row_is_in() -> None:
    """A row alone, or among others at any offset, gives the same bits (fixed lane order)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 1500)).astype(np.float32)
    block, block_sums = x.copy(), np.empty((16, 1), np.float32)
    kernels.softmax_rows(block, block_sums)
    for i in (0, 5, 15):
        row, row_sum = x[i : i + 1].copy(), np.empty((1, 1), np.float32)
        kernels.softmax_rows(row, row_sum)
        assert np.array_equal(row, block[i : i + 1]) and row_sum[0, 0] == block_sums[i, 0]


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.integers(1, 70)),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_exp_rows_is_numpys_softmax(x: np.ndarray) -> None:
    """What the backend's softmax and attention use: the kernel's rows, divided, are numpy's
    softmax within float32 rounding; non-contiguous or float64 input takes numpy's passes."""
    want, want_sums = _numpy_exp_rows(x)
    got = x.copy()
    sums = _exp_rows(got)
    assert np.allclose(got / sums, want / want_sums, rtol=2e-6, atol=1e-30)
    wide = np.repeat(x, 2, axis=-1)[:, ::2]  # the same values (not contiguous from 2 columns)
    strided_sums = _exp_rows(wide)
    assert np.allclose(wide / strided_sums, want / want_sums, rtol=2e-6, atol=1e-30)


def test_exp_rows_takes_numpys_passes_where_the_kernel_cannot() -> None:
    x = np.random.default_rng(5).standard_normal((4, 30)).astype(np.float32)
    want = np.exp(x - x.max(axis=-1, keepdims=True))
    strided, wide = x.copy(), np.repeat(x, 2, axis=-1)[:, ::2]
    assert not wide.flags.c_contiguous
    assert np.array_equal(_exp_rows(wide), want.sum(axis=-1, keepdims=True))  # numpy's own
    assert np.array_equal(wide, want)
    x64 = x.astype(np.float64)
    assert _exp_rows(x64).dtype == np.float64 and np.allclose(x64, want, rtol=1e-6)
    kernel_sums = _exp_rows(strided)
    assert np.allclose(strided, want, rtol=3e-7) and np.allclose(
        kernel_sums, want.sum(-1, keepdims=True), rtol=1e-6
    )


def test_backend_softmax_leaves_its_input_and_keeps_other_dtypes_on_numpy() -> None:
    be = NumpyBackend()
    x = np.random.default_rng(4).standard_normal((2, 6, 1, 1500)).astype(np.float32)
    before = x.copy()
    out = be.softmax(x)
    assert np.array_equal(x, before)
    assert out.dtype == np.float32 and np.allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
    x64 = x.astype(np.float64)
    want = np.exp(x64 - x64.max(-1, keepdims=True))
    assert be.softmax(x64).dtype == np.float64
    assert np.allclose(be.softmax(x64), want / want.sum(-1, keepdims=True), rtol=1e-12)
    assert np.allclose(be.softmax(x, axis=1), be.softmax(x64, axis=1), rtol=2e-6)


@pytest.mark.parametrize("size", [1, 9, 4096, (1 << 18) + 3])
def test_gelu_is_the_numpy_formula_bit_for_bit(size: int) -> None:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 4).astype(np.float32)
    x[: min(size, 6)] = np.float32([0.0, -0.0, 6.0, -6.0, 5.65, -5.66])[: min(size, 6)]
    out = np.empty_like(x)
    kernels.gelu(x, out)
    assert np.array_equal(out, erf.gelu(np, x))
    assert np.array_equal(NumpyBackend().gelu(x.reshape(1, -1)), erf.gelu(np, x).reshape(1, -1))


def test_kernels_release_the_gil() -> None:
    """The pieces of a split run them on several cores at once (backends.parallel)."""
    for kernel in (kernels.softmax_rows, kernels.gelu):
        assert kernel.targetoptions["nogil"] is True


def test_kernels_refuse_outputs_of_the_wrong_size() -> None:
    """Their loops run unchecked (no bounds checks): a wrong size is refused before any write."""
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="sums"):
        kernels.softmax_rows(x, np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="length"):
        kernels.gelu(x[0], np.zeros(7, np.float32))
    for gamma, out in ((x[0, :7], x), (x[0], np.zeros((2, 9), np.float32))):
        with pytest.raises(ValueError, match="gamma"):
            kernels.layer_norm(x, gamma, x[0], np.float32(1e-5), out)


def test_layer_norm_matches_numpys_formula() -> None:
    rng = np.random.default_rng(6)
    be = NumpyBackend()
    for shape in ((1, 384), (1500, 384), (2, 3, 7)):
        x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
        gamma, beta = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
        gamma.setflags(write=False)  # weights are read-only
        x64 = x.astype(np.float64)
        centered = x64 - x64.mean(axis=-1, keepdims=True)
        want = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + 1e-5)
        got = be.layer_norm(x, gamma, beta)
        assert got.shape == x.shape and got.dtype == np.float32
        assert np.allclose(got, want * gamma + beta, rtol=1e-5, atol=2e-6)
    assert be.layer_norm(x, None, beta).shape == x.shape  # no gamma: XpBackend's formula


def test_query_attention_is_softmax_attention_of_one_query_a_head() -> None:
    rng = np.random.default_rng(7)
    heads, dim, keys = 3, 16, 37
    q = rng.standard_normal((heads, dim)).astype(np.float32)
    kt = rng.standard_normal((heads, dim, keys)).astype(np.float32)
    v = rng.standard_normal((heads, keys, dim)).astype(np.float32)
    for a in (q, kt, v):
        a.setflags(write=False)  # a window's keys and values are read, never written
    scores, out = np.empty((heads, keys), np.float32), np.empty((heads, dim), np.float32)
    kernels.query_attention(q, kt, v, np.float32(0.25), scores, out)
    want_scores = np.einsum("hd,hdt->ht", q.astype(np.float64), kt) * 0.25
    e = np.exp(want_scores - want_scores.max(axis=-1, keepdims=True))
    want = np.einsum("ht,htd->hd", e / e.sum(axis=-1, keepdims=True), v)
    assert np.allclose(scores, want_scores, rtol=1e-5, atol=1e-5)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="query_attention"):
        kernels.query_attention(q, kt, v[:, :-1].copy(), np.float32(0.25), scores, out)


def test_a_nan_score_makes_its_row_nan_wherever_it_sits() -> None:
    """As numpy's softmax: a NaN (an upstream fault) shows in the output, never dropped."""
    be = NumpyBackend()
    for row in ([1.0, np.nan, 2.0], [np.nan, 1.0, 2.0], [1.0, 2.0, np.nan]):
        out = be.softmax(np.asarray([row, [1.0, 2.0, 3.0]], np.float32))
        assert np.isnan(out[0]).all() and not np.isnan(out[1]).any()
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((1, 2, 40, 8)).astype(np.float32) for _ in range(3))
    k[0, 0, 3, 2] = np.nan
    out = be.attention(q, k, v)
    assert np.isnan(out[0, 0]).all() and not np.isnan(out[0, 1]).any()


def test_empty_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        kernels.softmax_rows(np.zeros((3, 0), np.float32), np.zeros((3, 1), np.float32))
    q, out = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="no keys"):
        kernels.query_attention(
            q,
            np.zeros((2, 4, 0), np.float32),
            np.zeros((2, 0, 4), np.float32),
            np.float32(1),
            np.zeros((2, 0), np.float32),
            out,
        )


def test_a_gelu_that_differs_from_the_formula_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-time check (kernels._first_calls): a compiled GELU whose frozen coefficients
    no longer match backends.erf (a stale cache) is recompiled, and refused if it still differs."""
    kernels._first_calls()  # the real formula: passes
    monkeypatch.setattr(erf, "gelu", lambda xp, x: x)
    with pytest.raises(RuntimeError, match="differs"):
        kernels._first_calls()


@settings(max_examples=50, deadline=None)
@given(
    channels=st.integers(1, 4),
    u=st.integers(1, 9),
    n=st.integers(0, 12),
    shift=st.integers(-20, 10),
    lo=st.integers(0, 30),
    width=st.integers(0, 30),
)
def test_interleave_phases_writes_each_phase_row_as_samples_in_its_window(
    channels: int, u: int, n: int, shift: int, lo: int, width: int
) -> None:
    """out[c, shift + f u + s] = phases[c u + s, f] for f < n, only at columns in [lo, hi)."""
    rng = np.random.default_rng(channels * 100 + u)
    phases = rng.standard_normal((channels * u, n + 3), dtype=np.float32)
    hi = min(lo + width, 40)
    lo = min(lo, hi)
    out = np.full((channels, 40), np.nan, np.float32)
    kernels.interleave_phases(phases, n, out, shift, lo, hi)
    want = np.full_like(out, np.nan)
    for c in range(channels):
        for f in range(n):
            for s in range(u):
                col = shift + f * u + s
                if lo <= col < hi:
                    want[c, col] = phases[c * u + s, f]
    np.testing.assert_array_equal(out, want)


def test_interleave_phases_refuses_what_it_would_read_or_write_out_of_bounds() -> None:
    out = np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="interleave_phases"):
        kernels.interleave_phases(np.zeros((5, 4), np.float32), 4, out, 0, 0, 10)  # 5 rows, 2 ch
    with pytest.raises(ValueError, match="interleave_phases"):
        kernels.interleave_phases(np.zeros((4, 4), np.float32), 5, out, 0, 0, 10)  # n > columns
    with pytest.raises(ValueError, match="interleave_phases"):
        kernels.interleave_phases(np.zeros((4, 4), np.float32), 4, out, 0, 0, 11)  # hi > width
    with pytest.raises(ValueError, match="interleave_phases"):
        kernels.interleave_phases(np.zeros((4, 4), np.float32), 4, out, 0, -1, 5)


_SPECIALS = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-40, -1e-40, 3.0, -3.0, 88.0, -88.0, 1e30,
                      -1e30, np.inf, -np.inf, np.nan], np.float32)  # fmt: skip
"""Values a leaky ReLU or a gate must keep exactly where numpy does (signed zeros,
subnormals, infinities, NaN)."""


def _strided(rows: int, n: int, seed: int, specials: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A [rows, n] float32 view with a row stride wider than its rows, inside its buffer."""
    rng = np.random.default_rng(seed)
    buf = (rng.standard_normal((rows + 1, n + 7)) * 4).astype(np.float32)
    if specials:
        flat = buf.reshape(-1)
        flat[rng.integers(0, flat.size, min(flat.size, 3 * _SPECIALS.size))] = np.resize(
            _SPECIALS, min(flat.size, 3 * _SPECIALS.size)
        )
    return buf, buf[1:, 3 : 3 + n]


@given(rows=st.integers(1, 9), n=st.integers(1, 70), slope=st.sampled_from([0.0, 0.01, 0.1, 1.0]))
@settings(max_examples=60, deadline=None)
def test_leaky_rows_is_numpys_maximum_bit_for_bit(rows: int, n: int, slope: float) -> None:
    """leaky_rows over strided views, and in place, gives ``x if x > 0 else slope x`` bit for
    bit (signed zeros, subnormals, infinities, NaN): numpy's ``maximum(x, slope x)`` but
    for +inf at slope 0 (inf here, NaN there: 0 x inf), and writes nothing outside the view."""
    from backends.piper import host

    buf, x = _strided(rows, n, rows * 100 + n)
    with np.errstate(invalid="ignore"):
        scaled = np.float32(slope) * x
        want = np.where(x > 0, x, scaled)
        numpys = np.maximum(x, scaled)
    same = ~((x == np.inf) & (slope == 0.0))
    assert np.array_equal(want[same].view(np.int32), numpys[same].view(np.int32))
    out_buf = np.full((rows + 2, n + 5), 7.0, np.float32)
    out = out_buf[1:-1, 2 : 2 + n]
    host.leaky_into(x, slope, out)
    assert np.array_equal(out.view(np.int32), want.view(np.int32))
    outside = np.ones(out_buf.shape, bool)
    outside[1:-1, 2 : 2 + n] = False
    assert np.all(out_buf[outside] == 7.0)
    before = buf.copy()
    host.leaky_into(x, slope, x)  # in place
    assert np.array_equal(x.view(np.int32), want.view(np.int32))
    untouched = np.ones(buf.shape, bool)
    untouched[1:, 3 : 3 + n] = False
    assert np.array_equal(buf[untouched].view(np.int32), before[untouched].view(np.int32))


def test_leaky_into_refuses_overlaps_and_shapes() -> None:
    from backends.piper import host

    x = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        host.leaky_into(x[:, :8], 0.1, x[:, 2:])
    with pytest.raises(ValueError, match="one shape"):
        host.leaky_into(x, 0.1, np.zeros((4, 9), np.float32))
    with pytest.raises(ValueError, match="unit column stride"):
        host.leaky_into(x[:, ::2], 0.1, np.zeros((4, 5), np.float32))
    host.leaky_into(x[:0], 0.1, x[:0])  # empty: nothing to do


@given(rows=st.integers(1, 6), n=st.integers(1, 70))
@settings(max_examples=40, deadline=None)
def test_gate_rows_is_tanh_times_sigmoid(rows: int, n: int) -> None:
    """gate_rows: ``a = tanh(a) * sigmoid(b)`` within 3e-7 (absolute; the values are at most 1)
    of float64's, NaN where either input is NaN, ``b`` unchanged, nothing written outside."""
    from backends.piper import flow

    buf, both = _strided(2 * rows, n, rows * 1000 + n)
    a, b = both[:rows], both[rows:]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.tanh(a64) / (1.0 + np.exp(-b64))
    before = buf.copy()
    flow._gate(a, b)
    nan = np.isnan(a64) | np.isnan(b64)
    assert np.array_equal(np.isnan(a), nan)
    assert np.abs(a[~nan] - want[~nan]).max(initial=0.0) <= 3e-7
    assert np.array_equal(b.view(np.int32), before[1 + rows :, 3 : 3 + n].view(np.int32))
    untouched = np.ones(buf.shape, bool)
    untouched[1 : 1 + rows, 3 : 3 + n] = False
    assert np.array_equal(buf[untouched].view(np.int32), before[untouched].view(np.int32))


def test_flat_rows_views_the_same_memory_row_by_row() -> None:
    """flat_rows: a strided matrix as one flat view and its row stride (a one-row view: its
    width), writes through it land in the matrix; refused: another dtype, a column stride,
    overlapping rows."""
    buf = np.zeros((5, 12), np.float32)
    view = buf[1:4, 2:9]
    flat, ld = kernels.flat_rows(view, writeable=True)
    assert ld == 12 and flat.size == 2 * 12 + 7
    flat[ld + 3] = 1.0
    assert view[1, 3] == 1.0 and buf.sum() == 1.0
    ro, _ = kernels.flat_rows(view, writeable=False)
    assert not ro.flags.writeable
    assert kernels.flat_rows(buf[2:3, 1:5], writeable=False)[1] == 4
    for bad in (
        buf.astype(np.float64),
        buf[:, ::2],
        np.lib.stride_tricks.as_strided(buf, (3, 12), (16, 4)),
    ):
        with pytest.raises(ValueError, match="flat_rows"):
            kernels.flat_rows(bad, writeable=False)


def test_row_kernels_refuse_rows_that_do_not_fit_their_arrays() -> None:
    """The row kernels run without bounds checks: rows, columns and row strides that would
    reach past a flat view (or rows that overlap) are refused before the loop."""
    a, b = np.zeros(16, np.float32), np.zeros(8, np.float32)
    slope = np.float32(0.5)
    with pytest.raises(ValueError, match="leaky_rows"):
        kernels.leaky_rows(b, 8, slope, a, 8, 2, 8)  # src holds one row of 8
    with pytest.raises(ValueError, match="leaky_rows"):
        kernels.leaky_rows(a, 4, slope, a.copy(), 8, 2, 8)  # rows of src overlap
    with pytest.raises(ValueError, match="leaky_rows_in_place"):
        kernels.leaky_rows_in_place(b, 8, slope, 1, 9)
    with pytest.raises(ValueError, match="gate_rows"):
        kernels.gate_rows(a, 8, b[:2], 2, 1, 4)
    with pytest.raises(ValueError, match="gate_rows"):
        kernels.gate_rows(a, 8, a.copy(), 8, -1, 4)
    kernels.leaky_rows(b, 8, slope, a, 8, 1, 8)  # exactly fits
    kernels.gate_rows(a, 8, a.copy(), 8, 0, 8)  # no rows: nothing to do


def test_flat_rows_takes_a_one_column_matrix_of_any_column_stride() -> None:
    """A [T, 1] matrix (the text encoder's activations at T = 1, transposed back) has no
    column stride that matters."""
    x = np.ascontiguousarray(np.arange(6, dtype=np.float32).reshape(1, 6).T)  # strides (4, 24)
    flat, ld = kernels.flat_rows(x, writeable=False)
    assert ld == 1 and np.array_equal(flat, x[:, 0])
    from backends.piper import host

    out = np.empty_like(x)
    host.leaky_into(x - 3, 0.5, out)
    assert np.array_equal(out[:, 0], np.maximum(x[:, 0] - 3, 0.5 * (x[:, 0] - 3)))


def test_gate_refuses_halves_that_overlap() -> None:
    from backends.piper import flow

    x = np.zeros((4, 10), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        flow._gate(x[:3], x[1:])
    with pytest.raises(ValueError, match="one shape"):
        flow._gate(x[:2], x[2:, :5])


@pytest.mark.parametrize(("c_in", "k", "d", "n"), [(32, 7, 1, 7296), (3, 5, 4, 130), (1, 1, 1, 1)])
def test_one_row_conv_adds_the_conv_of_every_row_and_tap(c_in: int, k: int, d: int, n: int) -> None:
    """``out += sum_c sum_j taps[j, c] * src[c, start + j d + i]`` over rows a stride apart,
    full and partial blocks of outputs, within float32 rounding of the float64 sum."""
    rng = np.random.default_rng(c_in * 100 + n)
    taps = rng.standard_normal((k, c_in)).astype(np.float32)
    start = 3
    buffer = rng.standard_normal((c_in, start + (k - 1) * d + n + 5)).astype(np.float32)
    src = buffer[:, : start + (k - 1) * d + n]  # rows wider than the view: a row stride
    base = rng.standard_normal(n).astype(np.float32)
    out = base.copy()
    flat, ld = kernels.flat_rows(src, writeable=False)
    kernels.one_row_conv(taps, flat, ld, start, d, out)
    want = base.astype(np.float64)
    for c in range(c_in):
        for j in range(k):
            want += float(taps[j, c]) * src[c, start + j * d : start + j * d + n]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(c_in * k))
    with pytest.raises(ValueError, match="one_row_conv"):
        kernels.one_row_conv(taps, flat, ld, start + 6, d, out)  # past the rows' end
    with pytest.raises(ValueError, match="one_row_conv"):
        kernels.one_row_conv(taps, flat, ld, -1, d, out)
