"""The stochastic duration predictor's inverse rational-quadratic spline
(backends.piper.duration.spline_inverse): one compiled pass a row around numpy's
exponentials, the same bits as numpy's op-by-op version (kept here as the reference) on the
rows the duration predictor passes: columns of a transposed array, whose sums numpy adds
one term after another (a C-ordered row of eight terms or more it adds pairwise)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.piper.duration import spline_inverse

_MIN_BIN = np.float32(1e-3)
_MIN_DERIVATIVE = np.float32(1e-3)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _knots(unnormalized: np.ndarray, bound: np.float32) -> np.ndarray:
    bins = unnormalized.shape[-1]
    sizes = _MIN_BIN + (1 - _MIN_BIN * bins) * _softmax(unnormalized)
    edges = np.pad(np.cumsum(sizes, axis=-1), ((0, 0), (1, 0)))
    edges = 2 * bound * edges - bound
    edges[:, 0] = -bound
    edges[:, -1] = bound
    return edges.astype(np.float32, copy=False)


def reference(
    x: np.ndarray,
    widths_u: np.ndarray,
    heights_u: np.ndarray,
    derivs_u: np.ndarray,
    bound: np.float32,
) -> np.ndarray:
    """The spline op by op (what the duration predictor ran until session 24)."""
    constant = np.float32(np.log(np.exp(1 - 1e-3) - 1))
    derivs_u = np.pad(derivs_u, ((0, 0), (1, 1)), constant_values=constant)
    cw, ch = _knots(widths_u, bound), _knots(heights_u, bound)
    widths, heights = cw[:, 1:] - cw[:, :-1], ch[:, 1:] - ch[:, :-1]
    derivs = _MIN_DERIVATIVE + np.logaddexp(np.float32(0), derivs_u)
    search = ch.copy()
    search[:, -1] += np.float32(1e-6)
    idx = np.sum(x[:, None] >= search, axis=-1) - 1
    idx = np.clip(idx, 0, widths.shape[1] - 1)[:, None]

    def pick(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, idx, axis=1)[:, 0]

    in_cw, in_w, in_ch, in_h = pick(cw), pick(widths), pick(ch), pick(heights)
    delta = pick(heights / widths)
    d0, d1 = pick(derivs), pick(derivs[:, 1:])
    dy = x - in_ch
    s = d0 + d1 - 2 * delta
    a = dy * s + in_h * (delta - d0)
    b = in_h * d0 - dy * s
    c = -delta * dy
    disc = np.maximum(b * b - 4 * a * c, np.float32(0))
    root = (2 * c) / (-b - np.sqrt(disc))
    inside = (x >= -bound) & (x <= bound)
    out: np.ndarray = np.where(inside, root * in_w + in_cw, x).astype(np.float32, copy=False)
    return out


def _inputs(seed: int, t: int, bins: int, scale: float, spread: float) -> tuple[np.ndarray, ...]:
    """x and the spline's parameters as ``duration._conv_flow`` slices them: columns of the
    transposed projection ``[3 bins - 1, T]``, the widths and heights divided by a scale."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(t) * spread).astype(np.float32)  # some beyond the bound: tails
    params = (rng.standard_normal((3 * bins - 1, t)) * scale).astype(np.float32).T
    root = np.float32(np.sqrt(192))
    w, h, d = params[:, :bins] / root, params[:, bins : 2 * bins] / root, params[:, 2 * bins :]
    return x, w, h, d


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    t=st.integers(2, 80),
    bins=st.integers(1, 20),
    scale=st.sampled_from([0.01, 1.0, 4.0, 30.0]),
    spread=st.sampled_from([0.5, 3.0, 8.0]),
    bound=st.sampled_from([1.0, 5.0]),
)
def test_the_spline_has_the_op_by_op_bits(
    seed: int, t: int, bins: int, scale: float, spread: float, bound: float
) -> None:
    """Any length of two rows or more (a single row is C-ordered too, and numpy sums ten terms
    of it pairwise), any bin count, bins of very different sizes, inputs inside and outside
    the tails."""
    x, w, h, d = _inputs(seed, t, bins, scale, spread)
    with np.errstate(all="ignore"):
        want = reference(x, w, h, d, np.float32(bound))
    got = spline_inverse(x, w, h, d, np.float32(bound))
    assert got.dtype == np.float32 and got.shape == (t,)
    np.testing.assert_array_equal(got, want)


def test_many_rows_of_the_voices_shape_have_the_op_by_op_bits() -> None:
    """The bundled voice's shape (10 bins, tail bound 5) over 20,000 rows."""
    x, w, h, d = _inputs(7, 20_000, 10, 2.0, 3.0)
    with np.errstate(all="ignore"):
        want = reference(x, w, h, d, np.float32(5.0))
    np.testing.assert_array_equal(spline_inverse(x, w, h, d, np.float32(5.0)), want)


def test_a_nan_stays_in_its_row() -> None:
    x, w, h, d = (np.array(a, order="F") for a in _inputs(3, 6, 10, 1.0, 1.0))
    x[1], w[3, 2], d[4, 0] = np.nan, np.nan, np.nan
    with np.errstate(all="ignore"):
        want = reference(x, w, h, d, np.float32(5.0))
        got = spline_inverse(x, w, h, d, np.float32(5.0))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep], want[keep])
    assert np.isfinite(got[[0, 2, 5]]).all()


def test_the_voices_durations_keep_their_bits() -> None:
    """The bundled voice: every spline a sentence's durations run, the op-by-op version given
    the same arrays (as the predictor slices them) gives the same bits."""
    from backends.piper import PiperRequest, duration, load_factory

    calls: list[tuple[np.ndarray, ...]] = []
    real = duration.spline_inverse

    def spy(*args: np.ndarray) -> np.ndarray:
        calls.append(args)
        return real(*args)

    session = load_factory().create()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(duration, "spline_inverse", spy)
        session.run(PiperRequest("Bits of a duration, a spline at a time.", seed=3))
    assert len(calls) == 3 and not calls[0][1].flags.c_contiguous  # as _conv_flow slices
    for args in calls:
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(real(*args), reference(*args))


@pytest.mark.parametrize(
    ("w", "h", "d"),
    [
        ((5, 9), (5, 10), (5, 9)),
        ((5, 10), (4, 10), (5, 9)),
        ((5, 10), (5, 10), (5, 10)),
        ((), (5, 10), (5, 9)),
    ],
)
def test_inconsistent_shapes_are_refused(
    w: tuple[int, ...], h: tuple[int, int], d: tuple[int, int]
) -> None:
    x = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match="spline_inverse"):
        spline_inverse(
            x,
            np.zeros(w, np.float32),
            np.zeros(h, np.float32),
            np.zeros(d, np.float32),
            np.float32(5),
        )
