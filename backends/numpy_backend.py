"""The numpy backend: the reference implementation of :class:`backends.base.ArrayBackend`.

Most ops are :class:`backends.xp_backend.XpBackend`'s with numpy as the array
module; this subclass keeps what is CPU-specific: host arrays are taken as they
are (no upload), GELU, the softmax and layer norm run as fused loops
(:mod:`backends.kernels`, GELU in cache-sized chunks on the caller's cores), and the
layers are tuned for CPU caches and BLAS (tiled im2col conv, polyphase transposed
conv, a row-wise LSTM whose rows never depend on the batch, attention in query
blocks).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from backends import kernels, parallel, shapes
from backends.base import Array
from backends.xp_backend import XpBackend, check_lstm


class NumpyBackend(XpBackend):
    """Reference backend on the host CPU. Arrays are numpy.ndarray (float32)."""

    name = "numpy"

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(np, device)

    def _dev(self, x: Any) -> Array:
        return x  # host arrays (and scalars) are numpy's own operands

    def gelu(self, x: Array) -> Array:
        """:func:`backends.kernels.gelu` (numpy's :func:`backends.erf.gelu` bit for bit, in one
        pass); large inputs in chunks (:data:`_CHUNK`) spread over the caller's share of the
        cores. Other dtypes: the array-module formula."""
        x = np.asarray(x)
        if x.dtype != np.float32:
            return super().gelu(x)
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty_like(flat)
        if flat.size <= _CHUNK:
            kernels.gelu(flat, out)
            return out.reshape(x.shape)

        def chunk(i: int) -> None:
            kernels.gelu(flat[i : i + _CHUNK], out[i : i + _CHUNK])

        parallel.run_pieces(chunk, range(0, flat.size, _CHUNK))  # on the caller's cores
        return out.reshape(x.shape)

    def softmax(self, x: Array, axis: int = -1) -> Array:
        """Over the last axis of float32: :func:`_exp_rows` on a copy, then the division."""
        x = np.asarray(x)
        if x.dtype != np.float32 or axis not in (-1, x.ndim - 1) or x.size == 0:
            return super().softmax(x, axis)
        e = np.array(x, dtype=np.float32, order="C")
        e /= _exp_rows(e)
        return e

    def matmul(self, a: Array, b: Array) -> Array:
        """A few rows times a wide matrix (Whisper's vocabulary projection of a decoding
        step: one row by a [384, 51864] embedding, 80 MB read per token) in column tiles
        on the caller's share of the cores (:func:`_wide_product`); anything else as
        numpy's ``matmul``."""
        if (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.ndim == 2
            and b.ndim == 2
            and a.shape[0] <= _WIDE_ROWS
            and a.shape[1] == b.shape[0]
            and b.shape[1] >= 2 * _WIDE_TILE
            and b.size >= _WIDE_ELEMENTS
            and a.dtype == b.dtype == np.float32
        ):
            return _wide_product(a, b)
        return super().matmul(a, b)

    # ---- layers (XpBackend checks the operands, these compute) ---------------
    def _conv1d(self, x: Array, w: Array, b: Array | None, s: shapes.ConvShape) -> Array:
        """Tiled im2col GEMMs (see the module function :func:`_conv1d`)."""
        return _conv1d(x, w, None if b is None else b.reshape(-1), s)

    def _conv_transpose1d(self, x: Array, w: Array, b: Array | None, s: shapes.ConvShape) -> Array:
        """Polyphase where it applies, else one einsum per group and K strided adds."""
        b = None if b is None else b.reshape(-1)
        stride, padding, dilation = s.stride, s.padding, s.dilation
        if dilation == 1 and s.kernel % stride == 0:
            return _conv_transpose1d_polyphase(x, w, b, s)
        c_in_g, c_out_g, k, t_in, groups = s.c_in_g, s.c_out_g, s.kernel, s.length, s.groups
        output_padding = s.output_padding
        # uncropped: the padding is cut from both ends afterwards
        full = shapes.conv_transpose1d_length(t_in, k, stride, 0, output_padding, dilation)
        y = np.zeros((s.batch, s.c_out, full), dtype=x.dtype)
        for g in range(groups):
            xg = x[:, g * c_in_g : (g + 1) * c_in_g]  # [B, Cin_g, Tin]
            wg = w[g * c_in_g : (g + 1) * c_in_g]  # [Cin_g, Cout_g, K]
            # contributions [B, Cout_g, K, Tin]
            contrib = np.einsum("bit,iok->bokt", xg, wg, optimize=True)
            yg = y[:, g * c_out_g : (g + 1) * c_out_g]
            for kk in range(k):
                off = kk * dilation
                yg[:, :, off : off + (t_in - 1) * stride + 1 : stride] += contrib[:, :, kk]
        y = y[:, :, padding : padding + s.out_length]
        if b is not None:
            y = y + b[None, :, None]
        return np.ascontiguousarray(y)

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        """:func:`backends.kernels.layer_norm` on float32 rows with both gamma and beta (one
        pass a row instead of nine numpy operations: a decoding step's norms are rows of
        384); anything else as XpBackend's."""
        if not (
            isinstance(x, np.ndarray)
            and x.dtype == np.float32
            and x.ndim >= 1
            and x.size
            and all(
                isinstance(v, np.ndarray) and v.dtype == np.float32 and v.shape == x.shape[-1:]
                for v in (gamma, beta)
            )
        ):
            return super().layer_norm(x, gamma, beta, eps)
        rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        out = np.empty_like(rows)
        g, b = np.ascontiguousarray(gamma), np.ascontiguousarray(beta)
        kernels.layer_norm(rows, g, b, np.float32(eps), out)
        return out.reshape(x.shape)

    def _normalise(self, x: Array, eps: float) -> Array:
        """XpBackend's normalisation by np.mean's own steps without its Python overhead
        (~20 us a call on small rows), on ``x`` as it is."""
        n = np.intp(x.shape[-1])
        mean = np.add.reduce(x, axis=-1, keepdims=True)
        np.true_divide(mean, n, out=mean, casting="unsafe")
        centered = x - mean
        var = np.add.reduce(centered * centered, axis=-1, keepdims=True)
        np.true_divide(var, n, out=var, casting="unsafe")
        return centered / np.sqrt(var + np.float32(eps))

    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=False)
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
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=True)
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
        shapes.attention_shape(q.shape, k.shape, v.shape, None if mask is None else np.shape(mask))
        d = q.shape[-1]
        s = np.float32(1.0 / math.sqrt(d)) if scale is None else np.float32(scale)
        rows, keys = q.shape[-2], k.shape[-2]
        lead = int(np.prod(q.shape[:-2]))
        if rows * keys * lead <= 2 * _ATTENTION_BLOCK:
            return self._attention_rows(q, k, v, mask, s)
        return self._attention_tiled(q, k, v, mask, s)

    def _attention_tiled(
        self, q: Array, k: Array, v: Array, mask: Array | None, s: np.float32
    ) -> Array:
        """Long sequences: one head at a time, query rows in tiles whose score map stays in
        L2 (:data:`_ATTENTION_TILE`), normalised after the value product (the softmax's
        division on [tile, D] instead of [tile, keys]). Rows are independent, so only that
        division's rounding differs from :meth:`_attention_rows` (measured 1.6e-6 relative
        on Whisper's encoder; 11% less time there than whole-head blocks)."""
        rows, keys, d = q.shape[-2], k.shape[-2], q.shape[-1]
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        qh = np.broadcast_to(q, (*lead, rows, d))
        kh = np.broadcast_to(k, (*lead, keys, d))
        vh = np.broadcast_to(v, (*lead, keys, v.shape[-1]))
        out = np.empty((*lead, rows, v.shape[-1]), dtype=np.result_type(q, k, v))
        exact = math.frexp(float(s))[0] == 0.5  # a power-of-two scale may go on the queries
        tile = max(8, min(rows, _ATTENTION_TILE // max(1, keys)))
        masks = None if mask is None else np.broadcast_to(mask, (*lead, rows, keys))

        def head(index: tuple[int, ...]) -> None:
            scores_buf = np.empty((tile, keys), dtype=out.dtype)
            total = np.empty((tile, 1), dtype=out.dtype)
            k_t = kh[index].T
            for i in range(0, rows, tile):
                n = min(tile, rows - i)
                scores, norm = scores_buf[:n], total[:n]
                if exact:
                    np.matmul(qh[index][i : i + n] * s, k_t, out=scores)
                else:
                    np.matmul(qh[index][i : i + n], k_t, out=scores)
                    scores *= s
                if masks is not None:
                    scores += masks[index][i : i + n]
                _exp_rows(scores, norm)
                dst = out[index][i : i + n]
                np.matmul(scores, vh[index], out=dst)
                dst /= norm

        # heads are independent: they run on the caller's share of the cores
        parallel.run_pieces(head, list(np.ndindex(*lead)))
        return out

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
        # softmax in place on our own score buffer (as ``softmax``)
        scores /= _exp_rows(scores)
        return np.matmul(scores, v)


@functools.cache
def _lstm_gate_scale(hid: int) -> np.ndarray:
    """Per-gate pre-scale for the tanh form of sigmoid: 0.5 for i, f, o and 1 for g."""
    half = np.full(4 * hid, 0.5, dtype=np.float32)
    half[2 * hid : 3 * hid] = 1.0
    half.setflags(write=False)
    return half


def _exp_rows(scores: np.ndarray, sums: np.ndarray | None = None) -> np.ndarray:
    """``scores = exp(scores - max)`` over the last axis, in place; returns the new rows' sums
    [..., 1] (written into ``sums`` when given): :func:`backends.kernels.softmax_rows` for
    float32 scores in one C-contiguous block (``sums`` then C-contiguous too), numpy's passes
    for anything else."""
    if sums is None:
        sums = np.empty((*scores.shape[:-1], 1), scores.dtype)
    if scores.dtype == np.float32 and scores.flags.c_contiguous and sums.flags.c_contiguous:
        kernels.softmax_rows(scores.reshape(-1, scores.shape[-1]), sums.reshape(-1, 1))
        return sums
    scores -= np.max(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    np.sum(scores, axis=-1, keepdims=True, out=sums)
    return sums


_CHUNK = 1 << 18
"""Elements of one piece of a large GELU on the caller's cores (1 MB of float32: about a
quarter of a millisecond of :func:`backends.kernels.gelu`, long against handing a piece to
another core; Whisper's encoder GELU [1500, 1536] is nine)."""
_ATTENTION_BLOCK = 1 << 20  # score elements up to which attention runs as whole products
_ATTENTION_TILE = 1 << 18  # score elements of one head's query tile (1 MB: L2)


_WIDE_ROWS = 4
"""Most rows of a product that :meth:`NumpyBackend.matmul` splits by columns. Up to here
OpenBLAS computes a column tile exactly as the whole product (a matrix-vector kernel per
row; measured bit for bit at 1 to 5 rows and tiles of 4,096 to 16,384 columns); from 8
rows on a whole GEMM's blocking differs in the last bits."""

_WIDE_TILE = 8192
"""Columns of one tile of a wide product (a multiple of 4,096: OpenBLAS's own blocking)."""

_WIDE_ELEMENTS = 1 << 22
"""Fewest elements (16 MB) of the right operand for a column split: memory-bound products
large enough that a second core's bandwidth pays for handing out tiles."""


def _wide_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for a few rows ``a`` and a wide ``b``, in tiles of :data:`_WIDE_TILE` columns
    taken one at a time by the caller's share of the cores, each on one BLAS thread
    (:func:`backends.parallel.run_pieces`). The product reads all of ``b`` for a few
    FLOPs a byte, so each core streams its own tiles; OpenBLAS's threaded matrix-vector
    product waits for its slowest thread on every call. Every tile is computed alike
    at any share (and equals the whole product up to :data:`_WIDE_ROWS` rows), so the
    result does not depend on the share."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)

    def tile(j: int) -> None:
        np.matmul(a, b[:, j : j + _WIDE_TILE], out=out[:, j : j + _WIDE_TILE])

    parallel.run_pieces(tile, range(0, b.shape[1], _WIDE_TILE))
    return out


_COLS_BYTES = 1 << 21
"""Bytes of one im2col tile: large enough for an efficient GEMM, small enough for L2/L3."""


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, s: shapes.ConvShape) -> np.ndarray:
    """Conv1d as im2col GEMMs over time tiles (no padded copy, no full-size column matrix;
    on long outputs the bias rides in the GEMM).

    Depthwise convs (one input channel per group) are K shifted multiply-adds instead.
    """
    batch, t_in, t_out, groups = s.batch, s.length, s.out_length, s.groups
    stride, padding, dilation = s.stride, s.padding, s.dilation
    c_out, c_in_g, k = s.c_out, s.c_in_g, s.kernel
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
    x: np.ndarray, w: np.ndarray, b: np.ndarray | None, s: shapes.ConvShape
) -> np.ndarray:
    """Transposed conv (dilation 1, kernel a multiple of stride) in phase-major order.

    One GEMM per group gives every (output channel, tap) row; taps that land in
    the same output phase are summed with contiguous shifted adds, and the phases
    are interleaved into time once, instead of K strided scatters.
    """
    batch, t_in, t_out, groups = s.batch, s.length, s.out_length, s.groups
    c_in_g, c_out_g, k = s.c_in_g, s.c_out_g, s.kernel
    stride, padding, output_padding = s.stride, s.padding, s.output_padding
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
