"""VITS stochastic duration predictor, run in reverse (inference) with noise ``noise_w``.

The flows act on two channels of length T (phonemes). The spline of each
ConvFlow (a piecewise rational-quadratic map with a bin search) runs on the host
on its [T, 29] parameters: it is tiny, it needs a search the backend interface
does not have, and its output (log durations) is needed on the host anyway to
place frames. Everything with weights runs on the backend.
"""

from __future__ import annotations

import math

import numpy as np

from backends.base import Array, ArrayBackend
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


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _knots(unnormalized: np.ndarray, bound: np.float32) -> np.ndarray:
    """Bin edges [n, bins + 1] from -bound to bound (min bin size 1e-3)."""
    bins = unnormalized.shape[-1]
    sizes = _MIN_BIN + (1 - _MIN_BIN * bins) * _softmax(unnormalized)
    edges = np.pad(np.cumsum(sizes, axis=-1), ((0, 0), (1, 0)))
    edges = 2 * bound * edges - bound
    edges[:, 0] = -bound
    edges[:, -1] = bound
    return edges.astype(np.float32, copy=False)


def spline_inverse(
    x: np.ndarray,
    widths_u: np.ndarray,
    heights_u: np.ndarray,
    derivs_u: np.ndarray,
    bound: np.float32,
) -> np.ndarray:
    """Inverse piecewise rational-quadratic spline with linear tails (neural spline flows)."""
    x = x.astype(np.float32, copy=False)
    constant = np.float32(np.log(np.exp(1 - 1e-3) - 1))
    derivs_u = np.pad(derivs_u, ((0, 0), (1, 1)), constant_values=constant)
    cw = _knots(widths_u, bound)
    ch = _knots(heights_u, bound)
    widths = cw[:, 1:] - cw[:, :-1]
    heights = ch[:, 1:] - ch[:, :-1]
    derivs = _MIN_DERIVATIVE + np.logaddexp(np.float32(0), derivs_u)
    search = ch.copy()
    search[:, -1] += np.float32(1e-6)
    idx = np.sum(x[:, None] >= search, axis=-1) - 1
    idx = np.clip(idx, 0, widths.shape[1] - 1)[:, None]

    def pick(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, idx, axis=1)[:, 0]

    in_cw, in_w, in_ch, in_h = pick(cw), pick(widths), pick(ch), pick(heights)
    delta = pick(heights / widths)
    d0 = pick(derivs)
    d1 = pick(derivs[:, 1:])
    dy = x - in_ch
    s = d0 + d1 - 2 * delta
    a = dy * s + in_h * (delta - d0)
    b = in_h * d0 - dy * s
    c = -delta * dy
    disc = np.maximum(b * b - 4 * a * c, np.float32(0))
    root = (2 * c) / (-b - np.sqrt(disc))
    inside = (x >= -bound) & (x <= bound)
    out = np.where(inside, root * in_w + in_cw, x)
    return out.astype(np.float32, copy=False)
