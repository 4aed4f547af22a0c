"""The numpy backend's conv ops (tiled im2col, depthwise, polyphase transposed) against
their definitions, over the shapes Piper uses and random ones (stride, dilation, groups,
padding, output_padding, batch)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import backends.numpy_backend as nb

BE = nb.NumpyBackend()
TOL = 1e-4  # float32 sums in a different order; values are O(1) to O(10)


def _conv1d_ref(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
) -> np.ndarray:
    batch, c_in, t_in = x.shape
    c_out, c_in_g, k = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding)))
    t_out = (t_in + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    y = np.zeros((batch, c_out, t_out))
    c_out_g = c_out // groups
    for o in range(c_out):
        g = o // c_out_g
        for kk in range(k):
            seg = xp[:, g * c_in_g : (g + 1) * c_in_g, kk * dilation :: stride][:, :, :t_out]
            y[:, o] += np.einsum("bit,i->bt", seg, w[o, :, kk].astype(np.float64))
    if b is not None:
        y += b[None, :, None]
    return y


def _conv_transpose1d_ref(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: int,
    padding: int,
    output_padding: int,
    dilation: int,
    groups: int,
) -> np.ndarray:
    batch, c_in, t_in = x.shape
    _, c_out_g, k = w.shape
    c_in_g = c_in // groups
    full = np.zeros(
        (batch, c_out_g * groups, (t_in - 1) * stride + dilation * (k - 1) + 1 + output_padding)
    )
    for i in range(c_in):
        g = i // c_in_g
        for t in range(t_in):
            for kk in range(k):
                pos = t * stride + kk * dilation
                full[:, g * c_out_g : (g + 1) * c_out_g, pos] += x[:, i, t, None] * w[i, :, kk]
    t_out = (t_in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1
    y = full[:, :, padding : padding + t_out]
    return y + (b[None, :, None] if b is not None else 0)


def _cases(rng: np.random.Generator, n: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    while len(out) < n:
        groups = int(rng.choice([1, 1, 2, 3]))
        c_in_g, c_out_g = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        k, d, s, p = (
            int(rng.integers(1, 8)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 4)),
            int(rng.integers(0, 6)),
        )
        batch, t = int(rng.integers(1, 3)), int(rng.integers(1, 120))
        if (t + 2 * p - d * (k - 1) - 1) // s + 1 > 0:
            out.append((groups, c_in_g, c_out_g, k, d, s, p, batch, t))
    return out


@pytest.mark.parametrize("tile_bytes", [256, 1 << 21])
def test_conv1d_matches_its_definition(tile_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nb, "_COLS_BYTES", tile_bytes)  # many small tiles, then one
    rng = np.random.default_rng(0)
    for groups, c_in_g, c_out_g, k, d, s, p, batch, t in _cases(rng, 150):
        x = rng.standard_normal((batch, c_in_g * groups, t), dtype=np.float32)
        w = rng.standard_normal((c_out_g * groups, c_in_g, k), dtype=np.float32)
        b = rng.standard_normal(c_out_g * groups, dtype=np.float32) if rng.random() < 0.7 else None
        y = BE.conv1d(x, w, b, s, p, d, groups)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, _conv1d_ref(x, w, b, s, p, d, groups), atol=TOL, rtol=TOL)
        # depthwise (one input channel per group), as the duration predictor uses
        c = c_in_g + 1
        wd = rng.standard_normal((c, 1, k), dtype=np.float32)
        xd = rng.standard_normal((batch, c, t), dtype=np.float32)
        np.testing.assert_allclose(
            BE.conv1d(xd, wd, None, s, p, d, c),
            _conv1d_ref(xd, wd, None, s, p, d, c),
            atol=TOL,
            rtol=TOL,
        )


def test_conv1d_long_output_folds_the_bias() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 3000), dtype=np.float32)  # t_out >= 2 * rows: bias in the GEMM
    w = rng.standard_normal((8, 8, 7), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    np.testing.assert_allclose(
        BE.conv1d(x, w, b, 1, 9, 3), _conv1d_ref(x, w, b, 1, 9, 3, 1), atol=TOL, rtol=TOL
    )


def test_conv_transpose1d_matches_its_definition() -> None:
    rng = np.random.default_rng(2)
    checked_polyphase = 0
    for _ in range(150):
        groups = int(rng.choice([1, 1, 2]))
        c_in_g, c_out_g = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        s = int(rng.integers(1, 5))
        k = s * int(rng.integers(1, 4)) if rng.random() < 0.8 else int(rng.integers(1, 9))
        d = 1 if rng.random() < 0.8 else 2
        p = int(rng.integers(0, k))
        op = int(rng.integers(0, s)) if rng.random() < 0.4 else 0
        batch, t = int(rng.integers(1, 3)), int(rng.integers(1, 60))
        if (t - 1) * s - 2 * p + d * (k - 1) + op + 1 <= 0:
            continue
        checked_polyphase += d == 1 and k % s == 0
        x = rng.standard_normal((batch, c_in_g * groups, t), dtype=np.float32)
        w = rng.standard_normal((c_in_g * groups, c_out_g, k), dtype=np.float32)
        b = rng.standard_normal(c_out_g * groups, dtype=np.float32) if rng.random() < 0.7 else None
        y = BE.conv_transpose1d(x, w, b, s, p, op, d, groups)
        ref = _conv_transpose1d_ref(x, w, b, s, p, op, d, groups)
        np.testing.assert_allclose(y, ref, atol=TOL, rtol=TOL)
    assert checked_polyphase > 80


@pytest.mark.parametrize(
    ("c_in", "c_out", "k", "s", "t"), [(256, 128, 16, 8, 9), (64, 32, 8, 4, 40)]
)
def test_conv_transpose1d_on_piper_upsampling_shapes(
    c_in: int, c_out: int, k: int, s: int, t: int
) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, c_in, t), dtype=np.float32)
    w = rng.standard_normal((c_in, c_out, k), dtype=np.float32) * 0.1
    b = rng.standard_normal(c_out, dtype=np.float32)
    y = BE.conv_transpose1d(x, w, b, s, (k - s) // 2)
    assert y.shape == (1, c_out, t * s)
    np.testing.assert_allclose(
        y, _conv_transpose1d_ref(x, w, b, s, (k - s) // 2, 0, 1, 1), atol=TOL, rtol=TOL
    )


def test_leaky_relu_keeps_its_definition() -> None:
    x = np.array([-2.0, -0.0, 0.0, 3.0, np.nan, -1e30], dtype=np.float32)
    for slope in (0.1, 0.01, 0.0, 1.0, 2.0, -0.5):
        ref = np.where(x >= 0, x, x * np.float32(slope))
        y = BE.leaky_relu(x, slope)
        np.testing.assert_array_equal(y, ref)
        np.testing.assert_array_equal(np.signbit(y), np.signbit(ref))


def _use_path(path: str, small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run host's convs as per-tap GEMMs, with Winograd's products for every undilated conv
    of 3, 5 or 7 taps whatever its channels (convs prepared after this call), or as
    im2col GEMMs; in many small tiles or one."""
    from backends.piper import blas, host, winograd

    if path != "im2col" and not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found: only the im2col path runs")
    monkeypatch.setattr(host, "USE_TAPS", path != "im2col")
    monkeypatch.setattr(winograd, "MIN_CHANNELS_PRODUCT", 1 if path == "winograd" else 1 << 62)
    # many tiles (halos at both ends), or one
    monkeypatch.setattr(host, "TILE_BYTES", 1024 if small else 1 << 22)
    monkeypatch.setattr(host, "TAPS_TILE", 256 if small else 1 << 22)
    monkeypatch.setattr(host, "MIN_TILE", 64 if small else 256)


@pytest.mark.parametrize("path", ["taps", "winograd", "im2col"])
@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize(
    ("c_in", "c_out", "k", "d", "t"), [(8, 8, 3, 1, 700), (6, 5, 7, 3, 300), (5, 6, 5, 1, 77)]
)
def test_piper_fused_conv_matches_the_backend_ops(
    path: str,
    small: bool,
    c_in: int,
    c_out: int,
    k: int,
    d: int,
    t: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host.conv_same = activation, conv, bias, residual, accumulation, scale, activation."""
    from backends.piper import host

    _use_path(path, small, monkeypatch)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((c_in, t), dtype=np.float32)
    w = rng.standard_normal((c_out, c_in, k), dtype=np.float32) * 0.3
    b = rng.standard_normal(c_out, dtype=np.float32)
    cw = host.prepare(w, b, d)
    assert (cw.winograd is not None) == (path == "winograd" and d == 1)
    pad = d * (k - 1) // 2
    conv = BE.conv1d(BE.leaky_relu(x[None], 0.1), w, b, 1, pad, d)[0]
    out = np.empty((c_out, t), np.float32)
    host.conv_same(x, cw, out, slope=0.1)
    np.testing.assert_allclose(out, conv, atol=TOL, rtol=TOL)
    if c_in == c_out:
        host.conv_same(x, cw, out, slope=0.1, residual=True)
        np.testing.assert_allclose(out, conv + x, atol=TOL, rtol=TOL)
        acc = rng.standard_normal((c_out, t), dtype=np.float32)
        want = BE.leaky_relu((acc + conv + x) * np.float32(0.5), 0.01)
        host.conv_same(
            x, cw, acc, slope=0.1, residual=True, add_to=True, scale=0.5, post_slope=0.01
        )
        np.testing.assert_allclose(acc, want, atol=TOL, rtol=TOL)
    plain = host.prepare(w, None, d)
    host.conv_same(x, plain, out)
    np.testing.assert_allclose(out, BE.conv1d(x[None], w, None, 1, pad, d)[0], atol=TOL, rtol=TOL)


@pytest.mark.parametrize(("c_in", "k", "d", "t"), [(32, 7, 1, 700), (5, 3, 2, 77), (1, 5, 1, 40)])
def test_a_conv_to_one_channel_is_one_compiled_pass(
    c_in: int, k: int, d: int, t: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HiFi-GAN's last conv (one output channel) runs as :func:`kernels.one_row_conv` on
    every tile, with the fused steps around it (activation, bias, residual, accumulation,
    scale, post-activation), equal to the backend's ops within float32 summation order."""
    from backends import kernels
    from backends.piper import blas, host

    _use_path("taps", small=True, monkeypatch=monkeypatch)  # several tiles
    calls: list[int] = []
    kernel = kernels.one_row_conv

    def spy(*args: Any) -> None:
        calls.append(int(args[-1].shape[0]))
        kernel(*args)

    monkeypatch.setattr(kernels, "one_row_conv", spy)
    rng = np.random.default_rng(k * 10 + c_in)
    x = rng.standard_normal((c_in, t), dtype=np.float32)
    w = rng.standard_normal((1, c_in, k), dtype=np.float32) * 0.3
    b = rng.standard_normal(1, dtype=np.float32)
    cw = host.prepare(w, b, d)
    pad = d * (k - 1) // 2
    conv = BE.conv1d(BE.leaky_relu(x[None], 0.1), w, b, 1, pad, d)[0]
    out = np.empty((1, t), np.float32)
    host.conv_same(x, cw, out, slope=0.1)
    np.testing.assert_allclose(out, conv, atol=TOL, rtol=TOL)
    assert sum(calls) == t  # every column, through the compiled pass
    acc = rng.standard_normal((1, t), dtype=np.float32)
    want = BE.leaky_relu((acc + conv + (x if c_in == 1 else 0)) * np.float32(0.5), 0.01)
    host.conv_same(
        x, cw, acc, slope=0.1, residual=c_in == 1, add_to=True, scale=0.5, post_slope=0.01
    )
    np.testing.assert_allclose(acc, want, atol=TOL, rtol=TOL)
    with pytest.raises(ValueError, match="conv_taps"):  # the per-tap path's checks hold
        blas.one_row(np.empty((1, t), np.float32), cw.taps, x[:, :-1], 0, d)
    with pytest.raises(ValueError, match="conv_taps"):
        blas.one_row(x[:1, : t - pad * 2], cw.taps, x, 0, d)  # the output overlaps the source


def _outside(gaps: list[tuple[int, int]], t: int) -> np.ndarray:
    """The columns of ``t`` outside ``gaps`` (a packed batch's gap columns hold garbage)."""
    keep = np.ones(t, bool)
    for g0, g1 in gaps:
        keep[g0:g1] = False
    return keep


@pytest.mark.parametrize("path", ["taps", "winograd", "im2col"])
@pytest.mark.parametrize("small", [True, False])
def test_piper_depth_first_resblocks_match_conv_by_conv(
    path: str, small: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host.resblocks (tiles with halos, gaps masked) = the blocks one fused conv at a time."""
    from backends.piper import host

    _use_path(path, small, monkeypatch)
    rng = np.random.default_rng(5)
    c, t = 6, 900
    gaps = [(300, 340), (700, 760)]
    blocks = []
    for k, (d1, d2) in ((3, (1, 2)), (5, (2, 6)), (7, (3, 12))):
        blocks.append(
            tuple(
                host.prepare(
                    rng.standard_normal((c, c, k), dtype=np.float32) * 0.2,
                    rng.standard_normal(c, dtype=np.float32),
                    d,
                )
                for d in (d1, d2)
            )
        )
    x = rng.standard_normal((c, t), dtype=np.float32)
    out = np.empty_like(x)
    host.resblocks(x.copy(), blocks, out, slope=0.1, post_slope=0.01, gaps=gaps)
    ref = np.zeros_like(x)
    for cw1, cw2 in blocks:
        y, y2 = np.empty_like(x), np.empty_like(x)
        host.conv_same(x.copy(), cw1, y, slope=0.1, residual=True, gaps=gaps)
        host.conv_same(y, cw2, y2, slope=0.1, residual=True, gaps=gaps)
        ref += y2
    ref = BE.leaky_relu(ref * np.float32(1 / 3), 0.01)
    keep = _outside(gaps, t)  # gap columns are garbage either way
    np.testing.assert_allclose(out[:, keep], ref[:, keep], atol=TOL, rtol=TOL)


def test_conv_taps_adds_every_taps_product_into_a_strided_output() -> None:
    """blas.conv_taps: out += sum_k W_k @ src[:, start + d k :][:, :n], rows of any stride."""
    from backends.piper import blas

    if not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    rng = np.random.default_rng(6)
    for c_in, c_out, k, d, n in ((5, 7, 3, 2, 40), (1, 1, 7, 1, 9), (16, 1, 5, 3, 33)):
        src = rng.standard_normal((c_in, 200), dtype=np.float32)
        taps = rng.standard_normal((k, c_out, c_in), dtype=np.float32)
        big = rng.standard_normal((c_out, 300), dtype=np.float32)
        before = big.copy()
        start = 4
        blas.conv_taps(big[:, 10 : 10 + n], taps, src, start, d)
        want = before[:, 10 : 10 + n].astype(np.float64)
        for j in range(k):
            s0 = start + d * j
            want += taps[j].astype(np.float64) @ src[:, s0 : s0 + n].astype(np.float64)
        np.testing.assert_allclose(big[:, 10 : 10 + n], want, atol=TOL, rtol=TOL)
        np.testing.assert_array_equal(big[:, :10], before[:, :10])  # nothing outside the tile
        np.testing.assert_array_equal(big[:, 10 + n :], before[:, 10 + n :])


def test_conv_taps_refuses_operands_it_would_read_or_write_out_of_bounds() -> None:
    from backends.piper import blas

    if not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    src = np.zeros((4, 50), np.float32)
    taps = np.zeros((3, 2, 4), np.float32)
    out = np.zeros((2, 40), np.float32)
    with pytest.raises(ValueError, match="outside"):
        blas.conv_taps(out, taps, src, 7, 2)  # 7 + 2 * 2 + 40 > 50
    with pytest.raises(ValueError, match="outside"):
        blas.conv_taps(out, taps, src, -1, 1)
    with pytest.raises(ValueError, match="layout"):
        blas.conv_taps(out, taps, src.astype(np.float64), 0, 1)
    with pytest.raises(ValueError, match="layout"):
        blas.conv_taps(out[:, ::2], taps, src, 0, 1)  # columns not contiguous
    with pytest.raises(ValueError, match="layout"):
        blas.conv_taps(out, np.zeros((3, 2, 5), np.float32), src, 0, 1)  # C_in differs
    with pytest.raises(ValueError, match="overlaps"):
        buf = np.zeros((4, 100), np.float32)
        blas.conv_taps(buf[:2, 60:100], taps, buf[:, :50], 0, 1)


@pytest.mark.parametrize("path", ["taps", "matrix"])
@pytest.mark.parametrize("frames_bytes", [64, 1 << 21])
@pytest.mark.parametrize(
    ("c_in", "c_out", "k", "s", "p", "t"),
    [(16, 8, 16, 8, 4, 37), (8, 4, 8, 4, 2, 50), (5, 3, 6, 3, 1, 20), (4, 2, 8, 2, 5, 9)],
)
def test_piper_polyphase_transposed_conv_matches_its_definition(
    path: str,
    frames_bytes: int,
    c_in: int,
    c_out: int,
    k: int,
    s: int,
    p: int,
    t: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host.conv_transpose (tiles of frames: per-tap GEMMs of phase rows then the samples
    interleaved, or one GEMM a tile and the taps summed frame-major; the cropped samples at
    both ends left out) = ConvTranspose1d, gaps zeroed in the input first."""
    from backends.piper import blas, host

    if path == "taps" and not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found: only the matrix path runs")
    monkeypatch.setattr(host, "USE_TAPS", path == "taps")
    monkeypatch.setattr(host, "FRAMES_BYTES", frames_bytes)  # one frame tile each, or one
    monkeypatch.setattr(host, "TAPS_TILE", frames_bytes)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((c_in, t), dtype=np.float32)
    w = rng.standard_normal((c_in, c_out, k), dtype=np.float32) * 0.3
    b = rng.standard_normal(c_out, dtype=np.float32)
    uw = host.prepare_up(w, b, s, p)
    y = host.conv_transpose(x.copy(), uw)
    ref = _conv_transpose1d_ref(x[None], w, b, s, p, 0, 1, 1)[0]
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, atol=TOL, rtol=TOL)
    dirty = np.full(ref.shape, np.nan, np.float32)  # an earlier call's leftovers: overwritten
    assert host.conv_transpose(x.copy(), uw, out=dirty) is dirty
    np.testing.assert_array_equal(dirty, y)
    gapped = x.copy()
    gapped[:, 3:6] = 0
    np.testing.assert_allclose(
        host.conv_transpose(x.copy(), uw, [(3, 6)]),
        _conv_transpose1d_ref(gapped[None], w, b, s, p, 0, 1, 1)[0],
        atol=TOL,
        rtol=TOL,
    )


def test_a_transposed_conv_refuses_an_out_it_cannot_fill() -> None:
    from backends.piper import host

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 10), dtype=np.float32)
    uw = host.prepare_up(rng.standard_normal((4, 2, 8), dtype=np.float32), np.zeros(2), 4, 2)
    t_out = host.transposed_length(uw, 10)
    assert host.conv_transpose(x, uw).shape == (2, t_out)
    for out in (
        np.empty((2, t_out + 1), np.float32),
        np.empty((3, t_out), np.float32),
        np.empty((2, t_out), np.float64),
        np.empty((t_out, 2), np.float32).T,
    ):
        with pytest.raises(ValueError, match="out must be C-contiguous float32"):
            host.conv_transpose(x, uw, out=out)
    shared = np.empty(2 * t_out + 40, np.float32)
    with pytest.raises(ValueError, match="must not overlap"):
        host.conv_transpose(
            shared[:40].reshape(4, 10), uw, out=shared[20 : 20 + 2 * t_out].reshape(2, t_out)
        )


def test_piper_fast_paths_split_over_cores_give_the_bits_of_one_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """host's tiles on 2 or 3 cores (backends.parallel) = all of them in order, bit for bit:
    resblocks, conv_same (residual, accumulation, scale, activation) and the transposed
    conv, with several tiles each (the same tiles at every share here; a short conv cut
    finer for several cores, MIN_SPLIT_TILE, is within the thread-count tolerance)."""
    from threadpoolctl import threadpool_limits

    from backends import parallel
    from backends.piper import host, winograd

    monkeypatch.setattr(host, "TAPS_TILE", 1024)
    monkeypatch.setattr(host, "MIN_SPLIT_TILE", host.MIN_TILE)
    monkeypatch.setattr(host, "FRAMES_BYTES", 4096)
    monkeypatch.setattr(winograd, "MIN_CHANNELS_PRODUCT", 1)  # undilated convs: Winograd's
    rng = np.random.default_rng(9)
    c, t = 16, 2000
    blocks = [
        tuple(
            host.prepare(
                rng.standard_normal((c, c, k), dtype=np.float32) * 0.2,
                rng.standard_normal(c, dtype=np.float32),
                d,
            )
            for d in dil
        )
        for k, dil in ((3, (1, 2)), (5, (2, 6)), (7, (3, 12)))
    ]
    cw = host.prepare(rng.standard_normal((c, c, 5), dtype=np.float32) * 0.2, None, 3)
    cw1 = host.prepare(rng.standard_normal((c, c, 7), dtype=np.float32) * 0.2, None, 1)
    assert cw1.winograd is not None and blocks[0][0].winograd is not None
    uw = host.prepare_up(
        rng.standard_normal((c, 8, 16), dtype=np.float32) * 0.2,
        rng.standard_normal(8, dtype=np.float32),
        8,
        4,
    )
    x = rng.standard_normal((c, t), dtype=np.float32)

    def run() -> list[np.ndarray]:
        res = np.empty_like(x)
        host.resblocks(x.copy(), blocks, res, slope=0.1, post_slope=0.01, gaps=[(700, 760)])
        acc = np.ones_like(x)
        host.conv_same(
            x.copy(), cw, acc, slope=0.1, residual=True, add_to=True, scale=0.5, post_slope=0.1
        )
        one = np.empty_like(x)
        host.conv_same(x.copy(), cw1, one, slope=0.1)
        return [res, acc, one, host.conv_transpose(x[:, :300].copy(), uw)]

    results = []
    with threadpool_limits(limits=1, user_api="blas"):
        for n in (1, 2, 3):
            monkeypatch.setattr(parallel.SHARE, "share", lambda n=n: n)
            results.append(run())
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert np.array_equal(a, b)


def _flow_case(
    t: int, inter: int = 8, hidden: int = 6
) -> tuple[Any, dict[str, Any], np.ndarray, list[tuple[int, int]]]:
    """A small random flow (Hyper, its convs prepared by ``prepare_flow``), a latent
    [inter, t] and its gaps."""
    from backends.piper import flow
    from backends.piper.loader import Hyper

    h = Hyper(inter=inter, hidden=hidden, flow_layers=2, flow_wn_layers=3, flow_kernel=5)
    rng = np.random.default_rng(11)
    shapes: dict[str, tuple[int, int, int]] = {}
    for i in range(0, 2 * h.flow_layers, 2):
        p = f"flow.flows.{i}"
        shapes[f"{p}.pre"] = (h.hidden, h.inter // 2, 1)
        shapes[f"{p}.post"] = (h.inter // 2, h.hidden, 1)
        for j in range(h.flow_wn_layers):
            last = j == h.flow_wn_layers - 1
            shapes[f"{p}.enc.in_layers.{j}"] = (2 * h.hidden, h.hidden, h.flow_kernel)
            shapes[f"{p}.enc.res_skip_layers.{j}"] = (h.hidden * (1 if last else 2), h.hidden, 1)
    weights = {}
    for name, shape in shapes.items():
        weights[f"{name}.weight"] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.3)
        weights[f"{name}.bias"] = rng.standard_normal(shape[0], dtype=np.float32)
    gaps = [(t // 3, t // 3 + 6)] if t > 60 else []
    z = rng.standard_normal((h.inter, t), dtype=np.float32)
    for g0, g1 in gaps:
        z[:, g0:g1] = 0
    return h, flow.prepare_flow(weights, h), z, gaps


@pytest.mark.parametrize("winograd_convs", [False, True])
@pytest.mark.parametrize("t", [5, 9, 20, 64, 130, 257, 900])
def test_piper_flow_couplings_in_tiles_match_conv_by_conv(
    t: int, winograd_convs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flow_reverse_host on several cores runs each coupling depth first in column tiles with
    halos (zero padding at both ends, packed-batch gaps masked before every conv; tiles
    down to narrower than the halo) and gives the conv-by-conv path's values on every
    column outside the gaps; the tiles depend on the input only, so 2 and 3 cores give the
    same bits; an input shorter than COUPLING_TILE (or a numpy without its bundled BLAS)
    keeps the conv-by-conv path."""
    from backends import parallel
    from backends.piper import blas, flow, winograd

    tiles = blas.available()  # without numpy's BLAS the flow keeps the conv-by-conv path
    monkeypatch.setattr(flow, "COUPLING_TILE", 8)  # many tiles, some narrower than the halo
    if winograd_convs:  # the in-layers (5 taps, undilated) through Winograd's products
        monkeypatch.setattr(winograd, "MIN_CHANNELS_PRODUCT", 1)
    h, prep, z, gaps = _flow_case(t)
    assert (prep["flow.flows.0.enc.in_layers.0"].winograd is not None) == winograd_convs
    monkeypatch.setattr(parallel.SHARE, "share", lambda: 1)
    assert flow._coupling_tile(t) is None
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    ran: list[int] = []
    real_run = flow._CouplingTiles.run

    def run(self: flow._CouplingTiles, starts: Iterator[int]) -> None:
        ran.append(self.tile)
        real_run(self, starts)

    monkeypatch.setattr(flow._CouplingTiles, "run", run)
    keep = _outside(gaps, t)  # gap columns are garbage either way
    results = []
    for cores in (2, 3):
        monkeypatch.setattr(parallel.SHARE, "share", lambda n=cores: n)
        tile = flow._coupling_tile(t)
        assert (tile is None) == (t < 8 or not tiles)
        ran.clear()
        results.append(flow.flow_reverse_host(prep, h, z.copy(), gaps))
        assert (len(ran) >= h.flow_layers) == (tile is not None)  # every coupling, or none
        np.testing.assert_allclose(results[-1][:, keep], ref[:, keep], atol=TOL, rtol=TOL)
    assert np.array_equal(results[0], results[1])


def test_piper_flow_without_numpys_blas_keeps_the_conv_by_conv_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where numpy's BLAS is not found (or the per-tap paths are off), several cores run the
    flow conv by conv on the im2col paths (the tiles need the per-tap GEMMs), with the
    same values; a coupling net whose pre, post or res_skip conv is not kernel 1 is
    refused by the tiles."""
    from backends import parallel
    from backends.piper import flow, host

    h, prep, z, gaps = _flow_case(300)
    ref = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    monkeypatch.setattr(parallel.SHARE, "share", lambda: 2)
    monkeypatch.setattr(host, "USE_TAPS", False)
    assert flow._coupling_tile(300) is None
    keep = _outside(gaps, 300)
    got = flow.flow_reverse_host(prep, h, z.copy(), gaps)
    np.testing.assert_allclose(got[:, keep], ref[:, keep], atol=TOL, rtol=TOL)
    wide = dict(prep)
    wide["flow.flows.0.pre"] = host.prepare(np.ones((h.hidden, h.inter // 2, 3), np.float32), None)
    out = np.empty_like(z)
    with pytest.raises(ValueError, match="kernel-1"):
        flow._CouplingTiles(wide, h, "flow.flows.0", z, out, (), 64)


def test_conv_rows_gives_the_bits_of_its_pieces_on_one_core_or_two() -> None:
    """blas.conv_rows: the pieces' SGEMMs (on one lane, in order; on two, through the helpers
    where they run) write the same bits, the convolution's value, over strided rows."""
    from backends import parallel
    from backends.piper import blas

    if not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    rng = np.random.default_rng(7)
    for c_in, c_out, k, d, n, cut in ((192, 768, 3, 1, 57, 384), (7, 33, 2, 3, 20, 16)):
        src = rng.standard_normal((c_in, 200), dtype=np.float32)
        taps = rng.standard_normal((k, c_out, c_in), dtype=np.float32)
        parts = np.array([(0, cut), (cut, c_out)], np.int64)
        start = rng.standard_normal((c_out, n), dtype=np.float32)
        got = {}
        with parallel.one_thread():
            for lanes in (1, 2):
                big = np.zeros((c_out, n + 9), np.float32)
                big[:, 4 : 4 + n] = start
                blas.conv_rows(big[:, 4 : 4 + n], taps, src, 3, d, parts, lanes)
                assert not big[:, :4].any() and not big[:, 4 + n :].any()
                got[lanes] = big[:, 4 : 4 + n].copy()
        assert got[1].tobytes() == got[2].tobytes()
        want = start.astype(np.float64)
        for j in range(k):
            want += taps[j].astype(np.float64) @ src[:, 3 + d * j : 3 + d * j + n]
        np.testing.assert_allclose(got[1], want, atol=TOL, rtol=TOL)
        with pytest.raises(ValueError, match="outside"):
            blas.conv_rows(got[1], taps, src, 190, d, parts, 2)  # its checks come first


def test_row_pieces_are_two_halves_in_blocks_of_sixteen_rows() -> None:
    """host.prepare(row_pieces=True): two pieces covering every output row once, cut at a
    multiple of 16 rows; none for convs too narrow for two, or with Winograd's filters."""
    from backends.piper import host

    rng = np.random.default_rng(8)
    for c_out, cut in ((768, 384), (576, 288), (192, 96), (200, 96), (40, 16), (33, 16)):
        cw = host.prepare(rng.standard_normal((c_out, 4, 3), dtype=np.float32), None,
                          fewer_products=False, row_pieces=True)  # fmt: skip
        assert cw.rows is not None and cw.rows.tolist() == [[0, cut], [cut, c_out]]
        assert not cw.rows.flags.writeable
    for c_out in (1, 8, 16):
        cw = host.prepare(rng.standard_normal((c_out, 4, 3), dtype=np.float32), None,
                          fewer_products=False, row_pieces=True)  # fmt: skip
        assert cw.rows is None
    assert host.prepare(rng.standard_normal((64, 4, 3), dtype=np.float32), None).rows is None
    winograd = host.prepare(
        rng.standard_normal((384, 192, 5), dtype=np.float32), None, row_pieces=True
    )
    assert winograd.winograd is not None and winograd.rows is None


@pytest.mark.parametrize(
    "parts",
    [[(0, 64)], [(0, 16)], [(0, 16), (8, 32)], [(0, 16), (20, 32)], [(16, 32), (0, 16)], []],
)
def test_conv_rows_refuses_parts_that_do_not_cover_its_rows_once(parts: list[Any]) -> None:
    """Rows outside the output, rows left out, overlapping or unordered pieces: a ValueError
    before any SGEMM, on one lane as on two (nothing written around the output either)."""
    from backends import parallel
    from backends.piper import blas

    if not blas.available():
        pytest.skip("numpy's BLAS (scipy-openblas) not found")
    taps = np.ones((1, 32, 4), np.float32)
    src = np.ones((4, 10), np.float32)
    big = np.zeros((64, 10), np.float32)
    pieces = np.array(parts, np.int64).reshape(-1, 2)
    with parallel.one_thread():
        for lanes in (1, 2):
            with pytest.raises(ValueError, match="parts"):
                blas.conv_rows(big[:32], taps, src, 0, 1, pieces, lanes)
    with pytest.raises(ValueError, match="int64"):
        blas.conv_rows(big[:32], taps, src, 0, 1, np.array([(0, 32)], np.int32), 1)
    assert not big.any()


@pytest.mark.parametrize("share", [1, 2])
def test_a_convs_tiles_are_an_even_count_of_one_width(
    share: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns cut into tiles (the per-tap paths' :func:`host._tile_columns`): never wider
    than a tile may be, of one width (a multiple of 16, tiles starting on Winograd block
    boundaries) but for a short last one, and an even count where there are several, so
    that two cores get runs of equal length (stage 2 of a short sentence, 43,776 columns
    of 32 channels, was five tiles of 8,192 and one of 2,816: 56% of the work on one core)."""
    from backends import parallel
    from backends.piper import host

    monkeypatch.setattr(parallel.SHARE, "share", lambda: share)
    floor = host.MIN_TILE if share == 1 else host.MIN_SPLIT_TILE
    for channels in (32, 64, 128, 192, 384):
        widest_allowed = max(floor, host.TAPS_TILE // channels)
        for t in (*range(1, 2_000, 37), 10_944, 43_776, 87_552, 100_001):
            tile = host._tile_columns(t, channels)
            tiles = -(-t // tile)
            if tiles == 1:
                continue
            assert tile % host.TILE_STEP == 0 and tile >= floor, (t, channels, tile)
            assert tile <= max(widest_allowed, -(-t // host.SPLIT_TILES)) + host.TILE_STEP
            assert tiles % 2 == 0, (t, channels, tile)
    monkeypatch.setattr(host, "EVEN_TILES", False)
    assert -(-43_776 // host._tile_columns(43_776, 32)) == 6
    monkeypatch.setattr(host, "EVEN_TILES", True)
    assert host._tile_columns(43_776, 32) == 7_296  # six tiles of 7,296 columns
