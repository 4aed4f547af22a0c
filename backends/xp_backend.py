"""One implementation of :class:`backends.base.ArrayBackend` for numpy-like array modules.

:class:`XpBackend` is written against an array module ``xp`` (numpy or cupy): every
op is the module's own functions, with the shape checks of :mod:`backends.shapes`
and GELU's erf from :mod:`backends.erf`. Where the module already refuses exactly
the shapes the shared rule refuses (broadcasting, matmul, concat, reshape), the
rule runs only after the module's ``ValueError``, to raise the shared
:class:`~backends.shapes.ShapeError`; elsewhere it runs first.

The numpy backend and the CUDA backend are thin subclasses that keep only what
really differs: the numpy backend its CPU-tuned layers (cache-sized im2col tiles,
polyphase transposed conv, row-wise LSTM, blocked attention) and host arrays
taken as they are; the CUDA backend its device transfers, streams and fused
kernels. ``XpBackend(numpy)`` runs the code the CUDA backend runs wherever it has
no fused kernel, so CI tests it without a GPU.

Heavy layers here favour a few large array operations (one batched GEMM per conv
chunk, K strided adds for a transposed conv), which suits a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends import erf, shapes
from backends.base import Array

CONV_CHUNK = 1 << 26
"""im2col elements per time chunk of :meth:`XpBackend.conv1d` (256 MB of float32)."""


class XpBackend:
    """ArrayBackend on the arrays of the module ``xp`` (numpy or cupy)."""

    name = "xp"

    def __init__(self, xp: Any = np, device: str = "cpu") -> None:
        self.xp = xp
        self.device = device

    def finish(self) -> None:
        """Wait until this backend's queued work is done (nothing queues here)."""

    def _dev(self, x: Any) -> Array:
        """``x`` as an array of this module; host arrays and Python scalars become float32."""
        if isinstance(x, self.xp.ndarray):
            return x
        return self.xp.asarray(np.asarray(x, dtype=np.float32))

    def _dev_opt(self, x: Any | None) -> Array | None:
        """An optional operand (a bias, gamma, beta, a mask) as :meth:`_dev` has it; None stays."""
        return None if x is None else self._dev(x)

    # ---- transfer -------------------------------------------------------
    def to_device(self, host: np.ndarray, dtype: Any = np.float32) -> Array:
        out = self.xp.asarray(np.ascontiguousarray(host, dtype=dtype))
        self.finish()  # synchronous upload: weights are read from every session's queue
        return out

    def to_host(self, x: Array) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: Sequence[int], dtype: Any = np.float32) -> Array:
        return self.xp.zeros(tuple(shape), dtype=dtype)

    # ---- shape ----------------------------------------------------------
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        x = self._dev(x)
        try:
            return x.reshape(tuple(shape))  # the method: np.reshape's dispatch costs ~1 us
        except ValueError:
            shapes.reshape_shape(x.size, shape)  # raises the shared error when it applies
            raise

    def transpose(self, x: Array, axes: Sequence[int]) -> Array:
        return self.xp.ascontiguousarray(self.xp.transpose(self._dev(x), tuple(axes)))

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        parts = [self._dev(x) for x in xs]
        try:
            return self.xp.concatenate(parts, axis=axis)
        except ValueError:  # checked only on failure (the module's own rules are the same)
            shapes.concat_shape([p.shape for p in parts], axis)
            raise

    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array:
        x = self._dev(x)
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return x[tuple(index)]

    def pad(self, x: Array, axis: int, before: int, after: int, mode: str = "constant") -> Array:
        x = self._dev(x)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (before, after)
        return self.xp.pad(x, widths, mode=mode)

    def take(self, x: Array, indices: np.ndarray, axis: int) -> Array:
        idx = self.xp.asarray(np.asarray(indices, dtype=np.intp))
        return self.xp.take(self._dev(x), idx, axis=axis)

    def write_slice(self, dst: Array, axis: int, start: int, src: Array) -> None:
        src = self._dev(src)
        axis, start = shapes.write_slice_start(dst.shape, axis, start, src.shape)
        index = [slice(None)] * dst.ndim
        index[axis] = slice(start, start + src.shape[axis])
        dst[tuple(index)] = src

    # ---- elementwise ----------------------------------------------------
    def _binary(self, op: str, ufunc: Any, a: Array, b: Array) -> Array:
        a, b = self._dev(a), self._dev(b)
        try:
            return ufunc(a, b)
        except ValueError:  # checked only on failure: the shared error for bad shapes
            shapes.broadcast_shape(op, a.shape, b.shape)
            raise

    def add(self, a: Array, b: Array) -> Array:
        return self._binary("add", self.xp.add, a, b)

    def sub(self, a: Array, b: Array) -> Array:
        return self._binary("sub", self.xp.subtract, a, b)

    def mul(self, a: Array, b: Array) -> Array:
        return self._binary("mul", self.xp.multiply, a, b)

    def div(self, a: Array, b: Array) -> Array:
        return self._binary("div", self.xp.true_divide, a, b)

    def scale(self, x: Array, s: float) -> Array:
        return self._dev(x) * np.float32(s)

    def exp(self, x: Array) -> Array:
        return self.xp.exp(self._dev(x))

    def sqrt(self, x: Array) -> Array:
        return self.xp.sqrt(self._dev(x))

    def tanh(self, x: Array) -> Array:
        return self.xp.tanh(self._dev(x))

    def sigmoid(self, x: Array) -> Array:
        x = self._dev(x)
        return (0.5 * (1.0 + self.xp.tanh(0.5 * x))).astype(x.dtype, copy=False)

    def relu(self, x: Array) -> Array:
        return self.xp.maximum(self._dev(x), 0)

    def leaky_relu(self, x: Array, slope: float) -> Array:
        x = self._dev(x)
        if 0.0 <= slope <= 1.0:  # then max(x, slope * x) is the same function, one pass cheaper
            y = x * np.float32(slope)
            return self.xp.maximum(x, y, out=y)
        return self.xp.where(x >= 0, x, x * np.float32(slope))

    def gelu(self, x: Array) -> Array:
        return erf.gelu(self.xp, self._dev(x))

    # ---- reductions -----------------------------------------------------
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self.xp.sum(self._dev(x), axis=axis, keepdims=keepdims)

    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self.xp.max(self._dev(x), axis=axis, keepdims=keepdims)

    def softmax(self, x: Array, axis: int = -1) -> Array:
        xp = self.xp
        x = self._dev(x)
        e = x - xp.max(x, axis=axis, keepdims=True)
        xp.exp(e, out=e)  # in place: same values, no extra temporaries on big score maps
        e /= xp.sum(e, axis=axis, keepdims=True)
        return e

    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        xp = self.xp
        x = self._dev(x)
        shifted = x - xp.max(x, axis=axis, keepdims=True)
        return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))

    # ---- linear algebra and layers -----------------------------------------
    def matmul(self, a: Array, b: Array) -> Array:
        a, b = self._dev(a), self._dev(b)
        try:
            return self.xp.matmul(a, b)
        except ValueError:  # checked only on failure (the module's own rules are the same)
            shapes.matmul_shape(a.shape, b.shape)
            raise

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        x, w, b = self._dev(x), self._dev(w), self._dev_opt(b)
        shapes.linear_shape(x.shape, w.shape, shapes.shape_of(b))
        y = self.xp.matmul(x, w.T)
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
        x, w, b = self._dev(x), self._dev(w), self._dev_opt(b)
        s = shapes.conv1d_shape(
            x.shape, w.shape, shapes.shape_of(b), stride, padding, dilation, groups
        )
        return self._conv1d(x, w, b, s)

    def _conv1d(self, x: Array, w: Array, b: Array | None, s: shapes.ConvShape) -> Array:
        """Conv1d on checked operands: im2col (a strided view, copied in time chunks) and one
        batched GEMM per chunk."""
        xp = self.xp
        batch, c_in_g, k, t_out, groups = s.batch, s.c_in_g, s.kernel, s.out_length, s.groups
        stride, padding, dilation = s.stride, s.padding, s.dilation
        padded = (
            xp.pad(x, ((0, 0), (0, 0), (padding, padding))) if padding else xp.ascontiguousarray(x)
        )
        xg = padded.reshape(batch, groups, c_in_g, padded.shape[-1])
        wg = w.reshape(groups, s.c_out_g, c_in_g * k)
        y = xp.empty((batch, groups, s.c_out_g, t_out), dtype=x.dtype)
        chunk = max(1, min(t_out, CONV_CHUNK // max(1, batch * s.c_in * k)))
        s_b, s_g, s_c, s_t = xg.strides
        for t0 in range(0, t_out, chunk):
            n = min(chunk, t_out - t0)
            view = xp.lib.stride_tricks.as_strided(
                xg[..., t0 * stride :],
                shape=(batch, groups, c_in_g, k, n),
                strides=(s_b, s_g, s_c, dilation * s_t, stride * s_t),
            )
            cols = xp.ascontiguousarray(view).reshape(batch, groups, c_in_g * k, n)
            y[..., t0 : t0 + n] = xp.matmul(wg, cols)
        out = y.reshape(batch, s.c_out, t_out)
        if b is not None:
            out += b.reshape(-1)[None, :, None]
        return out

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
        x, w, b = self._dev(x), self._dev(w), self._dev_opt(b)
        s = shapes.conv_transpose1d_shape(
            x.shape, w.shape, shapes.shape_of(b), stride, padding, output_padding, dilation, groups
        )
        return self._conv_transpose1d(x, w, b, s)

    def _conv_transpose1d(self, x: Array, w: Array, b: Array | None, s: shapes.ConvShape) -> Array:
        """conv_transpose1d on checked operands: one GEMM per group for every (output channel,
        tap) row, then K strided adds."""
        xp = self.xp
        batch, c_in_g, c_out_g, k, t_in = s.batch, s.c_in_g, s.c_out_g, s.kernel, s.length
        groups, stride, padding, dilation = s.groups, s.stride, s.padding, s.dilation
        output_padding = s.output_padding
        # uncropped: the padding is cut from both ends afterwards
        full = shapes.conv_transpose1d_length(t_in, k, stride, 0, output_padding, dilation)
        # [G, Cout_g * K, Cin_g] @ [B, G, Cin_g, Tin] -> [B, G, Cout_g, K, Tin]
        wt = xp.ascontiguousarray(w.reshape(groups, c_in_g, c_out_g * k).transpose(0, 2, 1))
        contrib = xp.matmul(wt, x.reshape(batch, groups, c_in_g, t_in)).reshape(
            batch, groups, c_out_g, k, t_in
        )
        y = xp.zeros((batch, groups, c_out_g, full), dtype=x.dtype)
        span = (t_in - 1) * stride + 1
        for kk in range(k):
            off = kk * dilation
            y[..., off : off + span : stride] += contrib[..., kk, :]
        out = xp.ascontiguousarray(
            y.reshape(batch, s.c_out, full)[:, :, padding : padding + s.out_length]
        )
        if b is not None:
            out += b.reshape(-1)[None, :, None]
        return out

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        x, gamma, beta = self._dev(x), self._dev_opt(gamma), self._dev_opt(beta)
        shapes.layer_norm_shape(x.shape, shapes.shape_of(gamma), shapes.shape_of(beta))
        y = self._normalise(x, eps)
        if gamma is not None:
            y = y * gamma
        if beta is not None:
            y = y + beta
        return y.astype(x.dtype, copy=False)

    def _normalise(self, x: Array, eps: float) -> Array:
        """``(x - mean) / sqrt(var + eps)`` over the last axis (layer norm before gamma, beta)."""
        xp = self.xp
        x = xp.ascontiguousarray(x)
        centered = x - xp.mean(x, axis=-1, keepdims=True)
        var = xp.mean(centered * centered, axis=-1, keepdims=True)
        return centered / xp.sqrt(var + np.float32(eps))

    def _lstm_run(self, gx: Array, h: Array, c: Array, w_hh: Array, hs: Array) -> Array:
        """Steps over gx [T, B, 4H] from (h, c); writes hs [T, B, H]; returns the final c.

        Row-wise products ([B, 1, H] @ [H, 4H]) keep each row independent of the batch.
        """
        xp = self.xp
        hid = gx.shape[-1] // 4
        c = xp.array(c, dtype=np.float32, copy=True)
        w_t = xp.ascontiguousarray(w_hh.T)  # [H, 4H]
        h_prev = xp.ascontiguousarray(h)
        for t in range(gx.shape[0]):
            z = xp.matmul(h_prev[:, None, :], w_t)[:, 0, :] + gx[t]
            sig = xp.tanh(z * np.float32(0.5)) * np.float32(0.5) + np.float32(0.5)
            g = xp.tanh(z[:, 2 * hid : 3 * hid])
            c = sig[:, hid : 2 * hid] * c + sig[:, :hid] * g
            hs[t] = sig[:, 3 * hid :] * xp.tanh(c)
            h_prev = hs[t]
        return c

    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        x, h, c, w_ih, w_hh = (self._dev(v) for v in (x, h, c, w_ih, w_hh))
        b = self._dev_opt(b)
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=False)
        gx = self.linear(x, w_ih, b)
        hs = self.xp.empty((1, *c.shape), dtype=np.float32)
        c_new = self._lstm_run(gx[None], h, c, w_hh, hs)
        return hs[0], c_new

    def lstm_sequence(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array, Array]:
        xp = self.xp
        x, h, c, w_ih, w_hh = (self._dev(v) for v in (x, h, c, w_ih, w_hh))
        b = self._dev_opt(b)
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=True)
        steps, batch, _ = x.shape
        gx = xp.ascontiguousarray(self.linear(x, w_ih, b))
        hs = xp.empty((steps, batch, h.shape[-1]), dtype=np.float32)
        c_new = self._lstm_run(gx, h, c, w_hh, hs)
        h_last = hs[-1].copy() if steps else xp.array(h, copy=True)
        return hs, h_last, c_new

    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        xp = self.xp
        q, k, v = self._dev(q), self._dev(k), self._dev(v)
        mask = self._dev_opt(mask)
        shapes.attention_shape(q.shape, k.shape, v.shape, shapes.shape_of(mask))
        s = np.float32(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        scores = xp.matmul(q, xp.swapaxes(k, -1, -2))
        scores *= s
        if mask is not None:
            scores = scores + mask
        return xp.matmul(self.softmax(scores, -1), v)


def check_lstm(
    x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None, *, sequence: bool
) -> None:
    """The shared LSTM shape check on arrays (see :func:`backends.shapes.lstm_shape`)."""
    shapes.lstm_shape(
        x.shape, h.shape, c.shape, w_ih.shape, w_hh.shape, shapes.shape_of(b), sequence=sequence
    )
