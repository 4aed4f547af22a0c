"""VITS stochastic duration predictor, run in reverse (inference) with noise ``noise_w``.

The flows act on two channels of length T (phonemes). The spline of each
ConvFlow (a piecewise rational-quadratic map with a bin search) runs on the host
on its [T, 29] parameters: it is tiny, it needs a search the backend interface
does not have, and its output (log durations) is needed on the host anyway to
place frames. Everything with weights runs on the backend; on the numpy backend the
dilated depth-separable layers run as compiled passes around their 1x1 convs instead of
op by op, with the same operations in the same order (:func:`_dds_conv_host`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba.core import types

from backends import kernels
from backends.base import Array, ArrayBackend
from backends.piper import host
from backends.piper.column_norm import SUMS, norm_columns
from backends.piper.layers import Weights, channel_norm, conv, split_channels
from backends.piper.loader import Hyper

_MIN_BIN = np.float32(1e-3)
_MIN_DERIVATIVE = np.float32(1e-3)


def log_durations(
    be: ArrayBackend, w: Weights, h: Hyper, x: Array, noise: np.ndarray
) -> np.ndarray:
    """Encoder output x [1, C, T] and noise [1, 2, T] (already times noise_w) -> logw [T]."""
    x = conv(be, w, "dp.pre", x)
    x = _dds_conv(be, w, h, "dp.convs", x)
    x = conv(be, w, "dp.proj", x)
    z = be.to_device(noise)
    # reversed flows without the unused first ConvFlow:
    # Flip, CF7, Flip, CF5, Flip, CF3, Flip, affine
    for i in sorted(h.dp_flow_ids, reverse=True):
        z = _flip2(be, z)
        z = _conv_flow(be, w, h, f"dp.flows.{i}", z, x)
    z = _flip2(be, z)
    z = be.mul(be.sub(z, w["dp.flows.0.m"]), w["dp.flows.0.exp_neg_logs"])
    return be.to_host(be.slice(z, 1, 0, 1)).reshape(-1)


def _flip2(be: ArrayBackend, z: Array) -> Array:
    a, b = split_channels(be, z, 1)
    return be.concat([b, a], 1)


def _dds_conv(be: ArrayBackend, w: Weights, h: Hyper, p: str, x: Array) -> Array:
    """Dilated depth-separable conv stack (dilations 1, 3, 9), exact-erf GELU."""
    if host.is_host(be) and USE_COMPILED_LAYERS and _one_float32_input(x):
        return _dds_conv_host(w, h, p, np.asarray(x))
    c = x.shape[1]
    for j in range(h.dp_layers):
        d = h.dp_kernel**j
        y = conv(
            be, w, f"{p}.convs_sep.{j}", x, padding=d * (h.dp_kernel - 1) // 2, dilation=d, groups=c
        )
        y = be.gelu(channel_norm(be, w, f"{p}.norms_1.{j}", y))
        y = conv(be, w, f"{p}.convs_1x1.{j}", y)
        y = be.gelu(channel_norm(be, w, f"{p}.norms_2.{j}", y))
        x = be.add(x, y)
    return x


USE_COMPILED_LAYERS = True
"""On the numpy backend, each DDS layer as two compiled passes around its 1x1 conv
(:func:`_dds_conv_host`: the same values); False: op by op (for comparisons)."""


def _one_float32_input(x: Array) -> bool:
    """Whether ``x`` is what :func:`_dds_conv_host` takes: one float32 host array [1, C, T],
    not empty (anything else goes op by op)."""
    return (
        isinstance(x, np.ndarray)
        and x.dtype == np.float32
        and x.ndim == 3
        and x.shape[0] == 1
        and x.shape[1] > 0
        and x.shape[2] > 0
    )


def _dds_conv_host(w: Weights, h: Hyper, p: str, x: np.ndarray) -> np.ndarray:
    """:func:`_dds_conv` on a host array [1, C, T] with the numpy backend's operations in their
    order, so the same values, bit for bit (but a NaN's sign bit, which the order of a
    NaN + NaN may pick differently): per layer the depthwise conv, its channel norm and GELU in one
    compiled pass (:func:`_depthwise_norm_gelu`), the 1x1 conv as the backend runs it
    (``np.matmul``, then the bias), then the second norm, GELU and the residual add in one
    more (:func:`_norm_gelu_add`). Op by op a short sentence's durations took 2.1 ms at one
    thread, most of it in the two dozen small numpy calls a layer makes."""
    _, c, t = x.shape
    out = np.array(x[0], np.float32, order="C")  # the residual stream, updated in place
    y = np.empty((c, t), np.float32)
    scratch = np.empty((c, t), np.float32)
    sums = np.empty((SUMS, t), np.float32)
    eps = np.float32(1e-5)
    for j in range(h.dp_layers):
        sep, n1, n2 = f"{p}.convs_sep.{j}", f"{p}.norms_1.{j}", f"{p}.norms_2.{j}"
        _depthwise_norm_gelu(
            out, w[f"{sep}.weight"][:, 0], w[f"{sep}.bias"], h.dp_kernel**j, w[f"{n1}.gamma"],
            w[f"{n1}.beta"], eps, y, scratch, sums,
        )  # fmt: skip
        one = f"{p}.convs_1x1.{j}"
        z = np.matmul(w[f"{one}.weight"][:, :, 0], y)
        z += w[f"{one}.bias"][:, None]
        _norm_gelu_add(z, w[f"{n2}.gamma"], w[f"{n2}.beta"], eps, out, scratch, sums)
    return out[None]


@kernels.compiled
def _depthwise(x: Any, taps: Any, bias: Any, d: Any, y: Any) -> None:  # pragma: no cover
    """``y = depthwise(x)``, "same" padding at dilation ``d`` (``x, y [C, T]``, ``taps [C, K]``,
    ``K`` odd): the numpy backend's order, tap 0's product, then each next tap's product
    added, then the bias, a term outside ``x`` being ``0 * tap``."""
    c, t = x.shape
    k = taps.shape[1]
    pad = d * (k - 1) // 2
    zero = np.float32(0.0)
    for r in range(c):
        out = y[r]
        for m in range(k):
            w, shift = taps[r, m], m * d - pad  # column q reads x[q + shift]
            lo, hi = min(max(0, -shift), t), max(min(t, t - shift), 0)  # where that is inside
            hi = max(hi, lo)
            inside, src = out[lo:hi], x[r, lo + shift : hi + shift]
            if m == 0:
                out[:lo] = zero * w
                for i in range(hi - lo):  # from 0: no index wraparound, so it vectorizes
                    inside[i] = src[i] * w
                out[hi:] = zero * w
            else:
                _add_constant(out[:lo], zero * w)
                for i in range(hi - lo):
                    inside[i] = inside[i] + src[i] * w
                _add_constant(out[hi:], zero * w)
        _add_constant(out, bias[r])


@kernels.compiled
def _add_constant(row: Any, value: Any) -> None:  # pragma: no cover - compiled
    """``row = row + value``, element by element."""
    for i in range(row.shape[0]):
        row[i] = row[i] + value


_F32 = types.float32
_IN1, _IN2 = kernels.array_type(1, readonly=True), kernels.array_type(2, readonly=True)
_OUT2 = kernels.array_type(2)


@kernels.kernel(types.void(_IN2, _IN2, _IN1, types.int64, _IN1, _IN1, _F32, _OUT2, _OUT2, _OUT2))
def _depthwise_norm_gelu(
    x: Any,
    taps: Any,
    bias: Any,
    d: Any,
    gamma: Any,
    beta: Any,
    eps: Any,
    y: Any,
    scratch: Any,
    sums: Any,
) -> None:  # pragma: no cover - compiled
    """``y = gelu(norm(depthwise(x)))`` for ``x, y, scratch [C, T]``, three arrays apart
    (:func:`_depthwise`, :func:`_channel_norm` with ``sums [10, T]``,
    :func:`backends.kernels.gelu`)."""
    c, t = x.shape
    if (
        taps.shape[0] != c or taps.shape[1] % 2 == 0 or bias.shape[0] != c or d < 1
        or gamma.shape[0] != c or beta.shape[0] != c or y.shape != x.shape
        or scratch.shape != x.shape or sums.shape[0] != SUMS or sums.shape[1] != t
    ):  # fmt: skip
        raise ValueError("depthwise: x, y [C, T], taps [C, K odd], bias [C], sums [10, T]")
    _depthwise(x, taps, bias, d, y)
    norm_columns(y, gamma, beta, eps, scratch, sums)
    kernels.gelu(scratch.reshape(-1), y.reshape(-1))


@kernels.kernel(types.void(_OUT2, _IN1, _IN1, _F32, _OUT2, _OUT2, _OUT2))
def _norm_gelu_add(
    z: Any, gamma: Any, beta: Any, eps: Any, x: Any, scratch: Any, sums: Any
) -> None:  # pragma: no cover - compiled
    """``x += gelu(norm(z))`` for ``z, x, scratch [C, T]``, three arrays apart (``z``
    overwritten)."""
    c, t = z.shape
    if (
        gamma.shape[0] != c or beta.shape[0] != c or x.shape != z.shape
        or scratch.shape != z.shape or sums.shape[0] != SUMS or sums.shape[1] != t
    ):  # fmt: skip
        raise ValueError("norm_gelu_add: z, x [C, T], sums [10, T]")
    norm_columns(z, gamma, beta, eps, scratch, sums)
    kernels.gelu(scratch.reshape(-1), z.reshape(-1))
    for r in range(c):
        for q in range(t):
            x[r, q] = x[r, q] + z[r, q]


def _conv_flow(be: ArrayBackend, w: Weights, h: Hyper, p: str, z: Array, g: Array) -> Array:
    x0, x1 = split_channels(be, z, 1)
    hh = conv(be, w, f"{p}.pre", x0)
    hh = _dds_conv(be, w, h, f"{p}.convs", be.add(hh, g))
    params = be.to_host(conv(be, w, f"{p}.proj", hh))[0].T  # [T, 3 * bins - 1]
    scale = np.float32(math.sqrt(h.dp_filter))
    nb = h.num_bins
    y1 = spline_inverse(
        be.to_host(x1).reshape(-1),
        params[:, :nb] / scale,
        params[:, nb : 2 * nb] / scale,
        params[:, 2 * nb :],
        np.float32(h.tail_bound),
    )
    return be.concat([x0, be.to_device(y1.reshape(1, 1, -1))], 1)


_DERIVATIVE_PAD = np.float32(np.log(np.exp(1 - 1e-3) - 1))
"""The unnormalized derivative at both ends (the linear tails' slope, 1 - 1e-3 after the
softplus)."""


def spline_inverse(
    x: np.ndarray,
    widths_u: np.ndarray,
    heights_u: np.ndarray,
    derivs_u: np.ndarray,
    bound: np.float32,
) -> np.ndarray:
    """Inverse piecewise rational-quadratic spline with linear tails (neural spline flows):
    ``x [T]``, each row's unnormalized bin widths and heights ``[T, bins]`` and inner
    derivatives ``[T, bins - 1]`` (float32) -> ``y [T]`` (float32).

    The exponentials are numpy's (one ``exp`` over both softmaxes' shifted inputs, one
    ``logaddexp`` for the softplus); everything else, bins, knots, the bin search and the
    quadratic's root, is one compiled pass a row (:func:`_spline_rows`) with the float32
    operations of the op-by-op version this replaced, in its order, a softmax's sum adding
    a row's terms one after another, as numpy did on the rows :func:`_conv_flow` passes
    (columns of a transposed array). So a sentence's log durations keep their bits
    (``tests/models/test_piper_spline.py``, a NaN's sign aside). Op by op it took about 40
    numpy calls, 0.1-0.2 ms a ConvFlow on a short sentence; now about 25 us."""
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    if widths_u.ndim != 2:
        raise ValueError("spline_inverse: widths, heights [T, bins], derivatives [T, bins - 1]")
    t, bins = x.shape[0], widths_u.shape[-1]
    if (
        widths_u.shape != (t, bins)
        or heights_u.shape != (t, bins)
        or derivs_u.shape != (t, bins - 1)
        or bins < 1
    ):
        raise ValueError("spline_inverse: widths, heights [T, bins], derivatives [T, bins - 1]")
    u = np.empty((t, 2, bins), np.float32)
    u[:, 0], u[:, 1] = widths_u, heights_u
    e = np.exp(u - u.max(axis=-1, keepdims=True))
    padded = np.empty((t, bins + 1), np.float32)
    padded[:, 0] = padded[:, bins] = _DERIVATIVE_PAD
    padded[:, 1:bins] = derivs_u
    softplus = np.logaddexp(np.float32(0), padded)
    out = np.empty(t, np.float32)
    _spline_rows(x, e, softplus, np.float32(bound), out)
    return out


@kernels.compiled
def _knots_row(e: Any, share: Any, bound: Any, knots: Any) -> None:  # pragma: no cover
    """A row's bin edges from its softmax's exponentials ``e [bins]`` into ``knots [bins + 1]``:
    ``e / e.sum()`` (the terms added one after another), each size ``1e-3 + share * p``,
    their running sum scaled to ``[-bound, bound]``."""
    bins = e.shape[0]
    total = e[0]
    for j in range(1, bins):
        total += e[j]
    knots[0] = -bound
    run = np.float32(0.0)
    for j in range(bins):
        run = run + (_MIN_BIN + share * (e[j] / total)) if j else _MIN_BIN + share * (e[j] / total)
        knots[j + 1] = np.float32(2.0) * bound * run - bound
    knots[bins] = bound


_ROWS = kernels.array_type(3, readonly=True)


@kernels.kernel(types.void(_IN1, _ROWS, _IN2, _F32, kernels.array_type(1)))
def _spline_rows(x: Any, e: Any, softplus: Any, bound: Any, out: Any) -> None:  # pragma: no cover
    """:func:`spline_inverse`'s pass: row ``i`` of ``e [T, 2, bins]`` holds the exponentials of
    the widths' and heights' shifted inputs, of ``softplus [T, bins + 1]`` the derivatives
    before their minimum is added."""
    t, bins = e.shape[0], e.shape[2]
    if x.shape[0] != t or out.shape[0] != t or e.shape[1] != 2 or softplus.shape != (t, bins + 1):
        raise ValueError("spline_rows: x, out [T], e [T, 2, bins], softplus [T, bins + 1]")
    one, two, four = np.float32(1.0), np.float32(2.0), np.float32(4.0)
    cw = np.empty(bins + 1, np.float32)
    ch = np.empty(bins + 1, np.float32)
    share = one - _MIN_BIN * np.float32(bins)
    for i in range(t):
        _knots_row(e[i, 0], share, bound, cw)
        _knots_row(e[i, 1], share, bound, ch)
        xi = x[i]
        count = 0  # how many knots (the last one 1e-6 higher) are at or below x
        for j in range(bins + 1):
            knot = ch[j] + np.float32(1e-6) if j == bins else ch[j]
            if xi >= knot:
                count += 1
        k = min(max(count - 1, 0), bins - 1)
        in_cw, in_ch = cw[k], ch[k]
        in_w, in_h = cw[k + 1] - cw[k], ch[k + 1] - ch[k]
        delta = in_h / in_w
        d0 = _MIN_DERIVATIVE + softplus[i, k]
        d1 = _MIN_DERIVATIVE + softplus[i, k + 1]
        dy = xi - in_ch
        s = d0 + d1 - two * delta
        a = dy * s + in_h * (delta - d0)
        b = in_h * d0 - dy * s
        c = -delta * dy
        disc = max(b * b - four * a * c, np.float32(0.0))
        root = (two * c) / (-b - np.sqrt(disc))
        inside = xi >= -bound and xi <= bound
        out[i] = root * in_w + in_cw if inside else xi
