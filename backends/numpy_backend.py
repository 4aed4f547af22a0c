"""The numpy backend: the reference implementation of :class:`backends.base.ArrayBackend`."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import Array
from backends.erf import ERF_ALPHA, ERF_BETA


class NumpyBackend:
    """Reference backend on the host CPU. Arrays are numpy.ndarray (float32)."""

    name = "numpy"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    # ---- transfer -------------------------------------------------------
    def to_device(self, host: np.ndarray, dtype: Any = np.float32) -> Array:
        return np.ascontiguousarray(host, dtype=dtype)

    def to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: Sequence[int], dtype: Any = np.float32) -> Array:
        return np.zeros(tuple(shape), dtype=dtype)

    # ---- shape ----------------------------------------------------------
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        return x.reshape(tuple(shape))  # the method: np.reshape's dispatch costs ~1 us a call

    def transpose(self, x: Array, axes: Sequence[int]) -> Array:
        return np.ascontiguousarray(np.transpose(x, tuple(axes)))

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        return np.concatenate(list(xs), axis=axis)

    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return x[tuple(index)]

    def pad(self, x: Array, axis: int, before: int, after: int, mode: str = "constant") -> Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (before, after)
        return np.pad(x, widths, mode=mode)  # type: ignore[call-overload]

    def take(self, x: Array, indices: np.ndarray, axis: int) -> Array:
        return np.take(x, np.asarray(indices, dtype=np.intp), axis=axis)

    def write_slice(self, dst: Array, axis: int, start: int, src: Array) -> None:
        index = [slice(None)] * dst.ndim
        index[axis] = slice(start, start + src.shape[axis])
        dst[tuple(index)] = src

    # ---- elementwise ----------------------------------------------------
    def add(self, a: Array, b: Array) -> Array:
        return a + b

    def sub(self, a: Array, b: Array) -> Array:
        return a - b

    def mul(self, a: Array, b: Array) -> Array:
        return a * b

    def div(self, a: Array, b: Array) -> Array:
        return a / b

    def scale(self, x: Array, s: float) -> Array:
        return x * np.float32(s)

    def exp(self, x: Array) -> Array:
        return np.exp(x)

    def sqrt(self, x: Array) -> Array:
        return np.sqrt(x)

    def tanh(self, x: Array) -> Array:
        return np.tanh(x)

    def sigmoid(self, x: Array) -> Array:
        out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))
        return out.astype(x.dtype, copy=False)

    def relu(self, x: Array) -> Array:
        return np.maximum(x, 0)

    def leaky_relu(self, x: Array, slope: float) -> Array:
        if 0.0 <= slope <= 1.0:  # then max(x, slope * x) is the same function, one pass cheaper
            y = x * np.float32(slope)
            return np.maximum(x, y, out=y)
        return np.where(x >= 0, x, x * np.float32(slope))

    def gelu(self, x: Array) -> Array:
        # exact (erf) GELU, as torch.nn.GELU() and Whisper use; large inputs go through in
        # cache-sized chunks (same values, ~2.5x faster than whole-array passes)
        if x.size <= _CHUNK:
            return _gelu(x)
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty_like(flat)
        for i in range(0, flat.size, _CHUNK):
            out[i : i + _CHUNK] = _gelu(flat[i : i + _CHUNK])
        return out.reshape(x.shape)

    # ---- reductions -----------------------------------------------------
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return np.sum(x, axis=axis, keepdims=keepdims)

    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return np.max(x, axis=axis, keepdims=keepdims)

    def softmax(self, x: Array, axis: int = -1) -> Array:
        e = x - np.max(x, axis=axis, keepdims=True)
        np.exp(e, out=e)  # in place: same values, no extra temporaries on big score maps
        e /= np.sum(e, axis=axis, keepdims=True)
        return e

    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        shifted = x - np.max(x, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    # ---- linear algebra and layers -----------------------------------------
    def matmul(self, a: Array, b: Array) -> Array:
        return np.matmul(a, b)

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        y = np.matmul(x, w.T)
        if b is not None:
            y += b
        return y

    def conv1d(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
    ) -> Array:
        return _conv1d(x, w, b, stride, padding, dilation, groups)

    def conv_transpose1d(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int = 1,
        padding: int = 0,
        output_padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
    ) -> Array:
        if dilation == 1 and w.shape[2] % stride == 0:
            return _conv_transpose1d_polyphase(x, w, b, stride, padding, output_padding, groups)
        batch, c_in, t_in = x.shape
        _, c_out_g, k = w.shape
        c_in_g = c_in // groups
        full = (t_in - 1) * stride + dilation * (k - 1) + 1 + output_padding
        y = np.zeros((batch, c_out_g * groups, full), dtype=x.dtype)
        for g in range(groups):
            xg = x[:, g * c_in_g : (g + 1) * c_in_g]  # [B, Cin_g, Tin]
            wg = w[g * c_in_g : (g + 1) * c_in_g]  # [Cin_g, Cout_g, K]
            # contributions [B, Cout_g, K, Tin]
            contrib = np.einsum("bit,iok->bokt", xg, wg, optimize=True)
            yg = y[:, g * c_out_g : (g + 1) * c_out_g]
            for kk in range(k):
                off = kk * dilation
                yg[:, :, off : off + (t_in - 1) * stride + 1 : stride] += contrib[:, :, kk]
        t_out = (t_in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1
        y = y[:, :, padding : padding + t_out]
        if b is not None:
            y = y + b[None, :, None]
        return np.ascontiguousarray(y)

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        # np.mean's own steps without its Python overhead (~20 us a call on small rows)
        n = np.intp(x.shape[-1])
        mean = np.add.reduce(x, axis=-1, keepdims=True)
        np.true_divide(mean, n, out=mean, casting="unsafe")
        centered = x - mean
        var = np.add.reduce(centered * centered, axis=-1, keepdims=True)
        np.true_divide(var, n, out=var, casting="unsafe")
        y = centered / np.sqrt(var + np.float32(eps))
        if gamma is not None:
            y = y * gamma
        if beta is not None:
            y = y + beta
        return y.astype(x.dtype, copy=False)

    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        gates = np.matmul(x, w_ih.T) + np.matmul(h, w_hh.T)
        if b is not None:
            gates += b
        i, f, g, o = np.split(gates, 4, axis=-1)
        i = self.sigmoid(i)
        f = self.sigmoid(f)
        g = np.tanh(g)
        o = self.sigmoid(o)
        c_new = f * c + i * g
        h_new = o * np.tanh(c_new)
        return h_new, c_new

    def lstm_sequence(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array, Array]:
        # Row-wise products ([..., 1, In] @ [In, 4H]): BLAS picks its kernel per call
        # shape, so one product per row keeps each row independent of the batch size.
        steps, batch, _ = x.shape
        hid = h.shape[-1]
        gx = np.matmul(x[:, :, None, :], w_ih.T)[:, :, 0, :]
        if b is not None:
            gx += b
        w_hh_t = w_hh.T
        # sigmoid(z) = 0.5 * tanh(z / 2) + 0.5: a single tanh over all four gates
        half = _lstm_gate_scale(hid)
        hs = np.empty((steps, batch, hid), dtype=np.float32)
        h_row = np.asarray(h, dtype=np.float32)[:, None, :]
        c = np.asarray(c, dtype=np.float32)
        for t in range(steps):
            z = np.matmul(h_row, w_hh_t)[:, 0, :]
            z += gx[t]
            z *= half
            np.tanh(z, out=z)
            sig = z * np.float32(0.5) + np.float32(0.5)
            c = sig[:, hid : 2 * hid] * c + sig[:, :hid] * z[:, 2 * hid : 3 * hid]
            hs[t] = sig[:, 3 * hid :] * np.tanh(c)
            h_row = hs[t][:, None, :]
        return hs, hs[-1].copy() if steps else h_row[:, 0, :].copy(), c

    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        d = q.shape[-1]
        s = np.float32(1.0 / math.sqrt(d)) if scale is None else np.float32(scale)
        rows, keys = q.shape[-2], k.shape[-2]
        lead = int(np.prod(q.shape[:-2]))
        block = max(1, _ATTENTION_BLOCK // max(1, lead * keys))
        if rows <= 2 * block:
            return self._attention_rows(q, k, v, mask, s)
        # Long sequences: query rows in blocks so the score map stays in cache (rows are
        # independent, so the values are those of the whole-matrix computation).
        row_mask = mask is not None and mask.ndim >= 2 and mask.shape[-2] == rows
        parts = []
        for i in range(0, rows, block):
            m = mask[..., i : i + block, :] if row_mask and mask is not None else mask
            parts.append(self._attention_rows(q[..., i : i + block, :], k, v, m, s))
        return np.concatenate(parts, axis=-2)

    def _attention_rows(
        self, q: Array, k: Array, v: Array, mask: Array | None, s: np.float32
    ) -> Array:
        if math.frexp(float(s))[0] == 0.5:
            # a power-of-two scale is exact either way: scale the (T x D) queries
            # instead of the (T x S) scores
            scores = np.matmul(q * s, np.swapaxes(k, -1, -2))
        else:
            scores = np.matmul(q, np.swapaxes(k, -1, -2))
            scores *= s
        if mask is not None:
            if np.broadcast_shapes(scores.shape, np.shape(mask)) == scores.shape:
                scores += mask
            else:
                scores = scores + mask
        # softmax in place on our own score buffer (same operations as ``softmax``)
        scores -= np.max(scores, axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= np.sum(scores, axis=-1, keepdims=True)
        return np.matmul(scores, v)


@functools.cache
def _lstm_gate_scale(hid: int) -> np.ndarray:
    """Per-gate pre-scale for the tanh form of sigmoid: 0.5 for i, f, o and 1 for g."""
    half = np.full(4 * hid, 0.5, dtype=np.float32)
    half[2 * hid : 3 * hid] = 1.0
    half.setflags(write=False)
    return half


_CHUNK = 1 << 16  # elements per elementwise chunk (fits L2)
_ATTENTION_BLOCK = 1 << 20  # score elements per query block (4 MB, about L2)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = _erf(x / np.float32(math.sqrt(2.0)))
    return (np.float32(0.5) * x * (np.float32(1.0) + erf)).astype(x.dtype, copy=False)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf without scipy: a float32 rational approximation, max abs error < 5e-7.

    numpy has no erf ufunc and ``np.vectorize(math.erf)`` is ~100x slower. The
    odd/even polynomial ratio below (the one Eigen and XLA use for float32) is
    accurate to a few ulp, ample for GELU parity with torch/ctranslate2.
    """
    if x.dtype != np.float32:
        return np.asarray(np.vectorize(math.erf, otypes=[np.float64])(x)).astype(x.dtype)
    x = np.clip(x, np.float32(-4.0), np.float32(4.0))
    x2 = np.multiply(x, x)
    p: np.ndarray = np.multiply(x2, ERF_ALPHA[0])
    for a in ERF_ALPHA[1:-1]:
        p += a
        p *= x2
    p += ERF_ALPHA[-1]
    q: np.ndarray = np.multiply(x2, ERF_BETA[0])
    for b in ERF_BETA[1:-1]:
        q += b
        q *= x2
    q += ERF_BETA[-1]
    p *= x
    p /= q
    return p


_COLS_BYTES = 1 << 21
"""Bytes of one im2col tile: large enough for an efficient GEMM, small enough for L2/L3."""


def _conv1d(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: int,
    padding: int,
    dilation: int,
    groups: int,
) -> np.ndarray:
    """Conv1d as im2col GEMMs over time tiles (no padded copy, no full-size column matrix;
    on long outputs the bias rides in the GEMM).

    Depthwise convs (one input channel per group) are K shifted multiply-adds instead.
    """
    batch, c_in, t_in = x.shape
    c_out, c_in_g, k = w.shape
    t_out = (t_in + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    if t_out <= 0:
        raise ValueError("conv1d: input shorter than the kernel's receptive field")
    if groups > 1 and c_in_g == 1 and c_out == groups:
        xp = np.pad(x, ((0, 0), (0, 0), (padding, padding))) if padding else x
        span = (t_out - 1) * stride + 1
        y = xp[:, :, 0:span:stride] * w[None, :, 0, 0, None]
        for kk in range(1, k):
            off = kk * dilation
            y += xp[:, :, off : off + span : stride] * w[None, :, 0, kk, None]
        if b is not None:
            y += b[None, :, None]
        return np.ascontiguousarray(y, dtype=x.dtype)
    if k == 1 and stride == 1 and padding == 0 and groups == 1:  # pointwise: no im2col
        y = np.matmul(w[:, :, 0], x)
        if b is not None:
            y += b[:, None]
        return np.asarray(y)
    c_out_g = c_out // groups
    rows = c_in_g * k
    tile = max(64, min(t_out, _COLS_BYTES // (x.itemsize * rows)))
    y = np.empty((batch, c_out, t_out), dtype=x.dtype)
    # Long outputs fold the bias into the GEMM (a row of ones times a bias column);
    # short ones add it afterwards rather than copy the weights for it.
    fold = b is not None and t_out >= 2 * rows
    # rows ordered (input channel, tap), then the ones row if folding
    cols = np.empty((rows + fold, tile), dtype=x.dtype)
    cols[rows:] = 1
    cols3 = cols[:rows].reshape(c_in_g, k, tile)
    w2 = w.reshape(groups, c_out_g, rows)
    if fold:
        assert b is not None
        w2 = np.concatenate([w2, b.reshape(groups, c_out_g, 1).astype(w.dtype)], axis=2)
    for bi in range(batch):
        for g in range(groups):
            xg = x[bi, g * c_in_g : (g + 1) * c_in_g]
            for t0 in range(0, t_out, tile):
                n = min(tile, t_out - t0)
                for kk in range(k):
                    off = kk * dilation - padding  # input index read by output 0 at tap kk
                    lo = min(n, max(0, -(off // stride) - t0))  # first j reading index >= 0
                    hi = max(lo, min(n, (t_in - 1 - off) // stride - t0 + 1))
                    dst = cols3[:, kk]
                    if lo > 0:
                        dst[:, :lo] = 0
                    if hi < n:
                        dst[:, hi:n] = 0
                    if hi > lo:
                        start = (t0 + lo) * stride + off
                        dst[:, lo:hi] = xg[:, start : start + (hi - lo - 1) * stride + 1 : stride]
                out = y[bi, g * c_out_g : (g + 1) * c_out_g, t0 : t0 + n]
                np.matmul(w2[g], cols[:, :n], out=out)
                if b is not None and not fold:
                    out += b[g * c_out_g : (g + 1) * c_out_g, None]
    return y


def _conv_transpose1d_polyphase(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    stride: int,
    padding: int,
    output_padding: int,
    groups: int,
) -> np.ndarray:
    """Transposed conv (dilation 1, kernel a multiple of stride) in phase-major order.

    One GEMM per group gives every (output channel, tap) row; taps that land in
    the same output phase are summed with contiguous shifted adds, and the phases
    are interleaved into time once, instead of K strided scatters.
    """
    batch, c_in, t_in = x.shape
    _, c_out_g, k = w.shape
    c_in_g = c_in // groups
    t_out = (t_in - 1) * stride - 2 * padding + (k - 1) + output_padding + 1
    taps = k // stride
    frames = t_in + taps - 1  # output frames of `stride` samples, before cropping
    y = np.empty((batch, c_out_g * groups, t_out), dtype=x.dtype)
    # whole frames (plus zero frames for output_padding); `full` is a view of it
    framed = np.zeros((c_out_g, frames + -(-output_padding // stride), stride), dtype=x.dtype)
    full = framed.reshape(c_out_g, -1)
    phases = np.empty((c_out_g, stride, frames), dtype=x.dtype)
    for g in range(groups):
        # [Cout_g * K, Cin_g]: rows ordered (output channel, tap)
        wg = np.ascontiguousarray(w[g * c_in_g : (g + 1) * c_in_g].reshape(c_in_g, c_out_g * k).T)
        bg = None if b is None else b[g * c_out_g : (g + 1) * c_out_g, None]
        for bi in range(batch):
            contrib = np.matmul(wg, x[bi, g * c_in_g : (g + 1) * c_in_g])
            c4 = contrib.reshape(c_out_g, taps, stride, t_in)
            phases[:, :, :t_in] = c4[:, 0]
            phases[:, :, t_in:] = 0
            for m in range(1, taps):
                phases[:, :, m : m + t_in] += c4[:, m]
            framed[:, :frames] = phases.transpose(0, 2, 1)
            out = y[bi, g * c_out_g : (g + 1) * c_out_g]
            if bg is None:
                out[...] = full[:, padding : padding + t_out]
            else:
                np.add(full[:, padding : padding + t_out], bg, out=out)
    return y
