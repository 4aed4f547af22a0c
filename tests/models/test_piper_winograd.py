"""Winograd's minimal filtering for Piper's undilated convs (backends.piper.winograd): exact
transforms, the generated kernels current, values of the per-tap GEMMs within float32
rounding, nothing read outside a conv's window and nothing written outside its output."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.piper import blas, host, winograd

REL = 2e-5
"""Max |winograd - per-tap| over the largest |per-tap| output: float32 rounding of the
transforms (about 2e-6 measured at 128 to 384 channels)."""


def _reference(taps: np.ndarray, src: np.ndarray, start: int, n: int) -> np.ndarray:
    out = np.zeros((taps.shape[1], n))
    for k in range(taps.shape[0]):
        out += taps[k].astype(np.float64) @ src[:, start + k : start + k + n].astype(np.float64)
    return out


@pytest.mark.parametrize(("m", "r"), sorted(winograd.POINTS))
def test_each_transform_is_an_exact_correlation(m: int, r: int) -> None:
    """A^T [(G g) * (B^T z)] = the correlation, exactly over the rationals, and in float64."""
    t = winograd.transform(m, r)
    n = m + r - 1
    assert t.points == n
    assert [len(t.at), len(t.g), len(t.bt)] == [m, n, n]
    assert {len(row) for row in t.at} == {n} and {len(row) for row in t.g} == {r}
    assert {len(row) for row in t.bt} == {n}
    rng = np.random.default_rng(0)
    g, z = rng.standard_normal(r), rng.standard_normal(m + r - 1)
    at, gm, bt = (np.array([[float(v) for v in row] for row in x]) for x in (t.at, t.g, t.bt))
    got = at @ ((gm @ g) * (bt @ z))
    want = np.array([g @ z[q : q + r] for q in range(m)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the transforms the kernels apply are exact in float32 (powers of two, small integers)
    for row in (*t.at, *t.bt):
        for v in row:
            assert Fraction(float(np.float32(float(v)))) == v


def test_the_wrong_points_are_refused() -> None:
    """A transform whose identity does not hold is never built."""
    bad = winograd.Transform(
        2, 3, ((Fraction(1),) * 4,) * 2, ((Fraction(1),) * 3,) * 4, ((Fraction(1),) * 4,) * 4
    )
    with pytest.raises(ArithmeticError):
        winograd._check(bad)


def test_the_generated_kernels_are_current() -> None:
    """backends/piper/winograd_kernels.py is what ``python -m backends.piper.winograd`` writes."""
    assert winograd.KERNELS_PATH.read_text() == winograd.generate_kernels()
    assert winograd.main(["--check"]) == 0


@settings(max_examples=60, deadline=None)
@given(
    k=st.sampled_from(sorted(winograd.OUTPUTS)),
    c_in=st.integers(1, 9),
    c_out=st.integers(1, 9),
    n=st.integers(1, 70),
    start=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_conv_add_is_the_per_tap_conv_reading_only_its_window(
    k: int, c_in: int, c_out: int, n: int, start: int, seed: int
) -> None:
    """out += conv over exactly src[:, start : start + n + k - 1]: NaN anywhere else in the
    source changes nothing; only out's n columns are written (a view inside a bigger array)."""
    rng = np.random.default_rng(seed)
    taps = rng.standard_normal((k, c_out, c_in), dtype=np.float32)
    f = winograd.filters(taps)
    assert f is not None
    src = np.full((c_in + 2, start + n + k - 1 + 7), np.nan, np.float32)[1 : c_in + 1]
    src[:, start : start + n + k - 1] = rng.standard_normal((c_in, n + k - 1), dtype=np.float32)
    big = rng.standard_normal((c_out + 2, n + 9), dtype=np.float32)
    before = big.copy()
    out = big[1 : c_out + 1, 4 : 4 + n]
    winograd.conv_add(out, f, src, start)
    want = before[1 : c_out + 1, 4 : 4 + n] + _reference(taps, src, start, n)
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(out - want).max() <= REL * scale * c_in
    mask = np.ones(big.shape, bool)
    mask[1 : c_out + 1, 4 : 4 + n] = False
    np.testing.assert_array_equal(big[mask], before[mask])


def test_conv_add_refuses_what_it_would_read_or_write_out_of_bounds() -> None:
    f = winograd.filters(np.ones((3, 2, 4), np.float32))
    assert f is not None
    src, out = np.zeros((4, 20), np.float32), np.zeros((2, 10), np.float32)
    with pytest.raises(ValueError, match="outside"):
        winograd.conv_add(out, f, src, 9)  # needs 9 + 10 + 2 columns
    with pytest.raises(ValueError, match="channels"):
        winograd.conv_add(np.zeros((3, 10), np.float32), f, src, 0)
    with pytest.raises(ValueError, match="overlaps"):
        both = np.zeros((4, 40), np.float32)
        winograd.conv_add(both[:2, 20:30], f, both, 0)
    with pytest.raises(ValueError, match="unit column stride"):
        winograd.conv_add(out, f, np.zeros((4, 60), np.float32)[:, ::2], 0)
    winograd.conv_add(out, f, src, 8)  # exactly enough columns
    single = winograd.filters(np.ones((3, 2, 1), np.float32))
    assert single is not None
    row = np.broadcast_to(np.arange(12, dtype=np.float32), (1, 12))  # one row, row stride 0
    got = np.zeros((2, 10), np.float32)
    winograd.conv_add(got, single, row, 0)
    np.testing.assert_allclose(got, np.tile(3 * np.arange(10) + 3, (2, 1)), rtol=1e-6)


def test_the_same_inputs_give_the_same_bits_whatever_the_buffers_held() -> None:
    """Deterministic: scratch reused from call to call, columns past the window ignored."""
    rng = np.random.default_rng(3)
    taps = rng.standard_normal((7, 5, 6), dtype=np.float32)
    f = winograd.filters(taps)
    assert f is not None
    src = rng.standard_normal((6, 60), dtype=np.float32)
    first = np.zeros((5, 49), np.float32)
    winograd.conv_add(first, f, src, 3)  # reads columns 3..57
    other = src.copy()
    other[:, :3] = 1e30
    other[:, 58:] = -1e30
    winograd.conv_add(
        np.zeros((5, 90), np.float32), f, rng.standard_normal((6, 100), dtype=np.float32), 2
    )
    again = np.zeros((5, 49), np.float32)
    winograd.conv_add(again, f, other, 3)
    np.testing.assert_array_equal(first, again)


def test_which_convs_take_the_winograd_path() -> None:
    """Undilated convs of 3, 5 or 7 taps with at least 192 x 192 channels; not dilated ones,
    kernel-1 ones or narrow ones (the first HiFi-GAN stage's 128 channels)."""
    big = np.zeros((3, 192, 192), np.float32)
    assert winograd.prepare(big, 1) is not None
    assert winograd.prepare(big, 2) is None
    assert winograd.prepare(np.zeros((3, 128, 128), np.float32), 1) is None
    assert winograd.prepare(np.zeros((1, 384, 192), np.float32), 1) is None
    assert winograd.prepare(np.zeros((5, 64, 64), np.float32), 1) is None
    assert winograd.prepare(np.zeros((4, 256, 256), np.float32), 1) is None  # no F(m, 4) here
    cw = host.prepare(np.zeros((384, 192, 5), np.float32), None)
    assert cw.winograd is not None and cw.winograd.transform.m == 4  # F(4, 5)
    assert host.prepare(np.zeros((128, 128, 7), np.float32), None, 3).winograd is None


@pytest.mark.parametrize("winograd_on", [True, False])
def test_add_conv_chooses_the_path_and_keeps_the_values(
    winograd_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host.add_conv: Winograd's products where prepared and on, else the per-tap GEMMs;
    the same values either way (within REL)."""
    if not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    rng = np.random.default_rng(4)
    w = rng.standard_normal((192, 192, 3), dtype=np.float32) * 0.1
    cw = host.prepare(w, None)
    assert cw.winograd is not None
    monkeypatch.setattr(host, "USE_WINOGRAD", winograd_on)
    calls: list[str] = []
    real_conv_add, real_taps = winograd.conv_add, blas.conv_taps
    monkeypatch.setattr(winograd, "conv_add", lambda *a: (calls.append("w"), real_conv_add(*a)))
    monkeypatch.setattr(blas, "conv_taps", lambda *a: (calls.append("t"), real_taps(*a)))
    src = rng.standard_normal((192, 300), dtype=np.float32)
    out = np.zeros((192, 290), np.float32)
    host.add_conv(out, cw, src, 4)
    assert calls == (["w"] if winograd_on else ["t"])
    want = _reference(cw.taps, src, 4, 290)
    assert np.abs(out - want).max() <= REL * np.abs(want).max()
