"""The numpy backend: the reference implementation of :class:`backends.base.ArrayBackend`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import Array


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
        return np.reshape(x, tuple(shape))

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
        return np.where(x >= 0, x, x * np.float32(slope))

    def gelu(self, x: Array) -> Array:
        # exact (erf) GELU, as torch.nn.GELU() and Whisper use
        from math import sqrt

        erf = _erf(x / np.float32(sqrt(2.0)))
        return (np.float32(0.5) * x * (np.float32(1.0) + erf)).astype(x.dtype, copy=False)

    # ---- reductions -----------------------------------------------------
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return np.sum(x, axis=axis, keepdims=keepdims)

    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return np.max(x, axis=axis, keepdims=keepdims)

    def softmax(self, x: Array, axis: int = -1) -> Array:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

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
        batch, c_in, _ = x.shape
        c_out, c_in_g, k = w.shape
        if padding:
            x = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
        t_pad = x.shape[2]
        t_out = (t_pad - dilation * (k - 1) - 1) // stride + 1
        # im2col: [B, Cin, K, Tout] as a strided view, then one matmul per group
        s_b, s_c, s_t = x.strides
        cols = np.lib.stride_tricks.as_strided(
            x, shape=(batch, c_in, k, t_out), strides=(s_b, s_c, s_t * dilation, s_t * stride)
        )
        c_out_g = c_out // groups
        outs = []
        for g in range(groups):
            cg = cols[:, g * c_in_g : (g + 1) * c_in_g].reshape(batch, c_in_g * k, t_out)
            wg = w[g * c_out_g : (g + 1) * c_out_g].reshape(c_out_g, c_in_g * k)
            outs.append(np.matmul(wg, cg))
        y = outs[0] if groups == 1 else np.concatenate(outs, axis=1)
        if b is not None:
            y += b[None, :, None]
        return np.ascontiguousarray(y, dtype=x.dtype)

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

    def layer_norm(self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5) -> Array:
        mean = np.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        var = np.mean(centered * centered, axis=-1, keepdims=True)
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

    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        d = q.shape[-1]
        s = np.float32(1.0 / math.sqrt(d)) if scale is None else np.float32(scale)
        scores = np.matmul(q, np.swapaxes(k, -1, -2)) * s
        if mask is not None:
            scores = scores + mask
        return np.matmul(self.softmax(scores, axis=-1), v)


def _erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf in float64 then cast back (numpy has no erf ufunc)."""
    try:
        from scipy.special import erf  # optional, faster

        return erf(x).astype(x.dtype, copy=False)  # type: ignore[no-any-return]
    except ImportError:  # pragma: no cover - depends on the environment
        pass
    # Abramowitz-Stegun 7.1.26 is too coarse for parity; use math.erf through frompyfunc
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)
