"""The CUDA backend: :class:`backends.base.ArrayBackend` on cupy arrays.

Matrix products go to cuBLAS through ``cupy.matmul``; GELU, layer norm, last-axis
softmax and the LSTM step are fused CUDA kernels (one launch instead of five to
eight cupy ops each; the LSTM step also makes every batch row's result independent
of the batch size, as the interface requires); the rest are plain cupy ops that
mirror the numpy reference. Arrays are C-contiguous float32 ``cupy.ndarray``.

cupy is imported lazily (in :func:`make_backend` / the constructor), so this
module imports, and the test suite collects, on machines without cupy or a GPU.

Sessions: weights are uploaded once (the upload is synchronised, so any stream may
read them); ``fork()`` returns a view on the same device with its own non-blocking
``cupy.cuda.Stream``, and every op of a view runs on its stream. cupy's memory pool
is stream-aware, so a session's scratch memory is reused on its own stream.

``CudaBackend.on_host()`` runs the same array-module code with numpy in place of
cupy and no fused kernels: it lets CI check this module's shape logic (im2col,
transposed conv, LSTM, attention) without a GPU. The fused kernels are only
exercised on a GPU (see docs/backends.md and bench/gpu_check.sh).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from backends.base import Array
from backends.erf import ERF_ALPHA, ERF_BETA, c_source

_F = TypeVar("_F", bound=Callable[..., Any])
_BLOCK = 256  # threads per block of the row kernels (a power of two)
_CONV_CHUNK = 1 << 26  # im2col elements per time chunk (256 MB of float32)

_CUDA_SOURCE = (
    r"""
#define RB 256

"""
    + c_source("__device__", "fminf(fmaxf(x, -4.0f), 4.0f)")
    + r"""
__device__ float vox_max(float a, float b) { return (b > a || isnan(b)) ? b : a; }

__device__ float block_reduce(float* buf, float v, int op) {
    const int l = threadIdx.x;
    buf[l] = v;
    __syncthreads();
    for (int s = RB / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] = op == 0 ? buf[l] + buf[l + s] : vox_max(buf[l], buf[l + s]);
        __syncthreads();
    }
    const float r = buf[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void gelu(float* out, const float* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + vox_erf(v / 1.41421353816986083984375f));
    }
}

extern "C" __global__ void softmax_rows(float* out, const float* x, int n, int logp) {
    __shared__ float buf[RB];
    const long long row = blockIdx.x;
    const int l = threadIdx.x;
    const float* xr = x + row * n;
    float* yr = out + row * n;
    float m = __int_as_float(0xff800000);
    for (int i = l; i < n; i += RB) m = vox_max(m, xr[i]);
    m = block_reduce(buf, m, 1);
    float s = 0.0f;
    for (int i = l; i < n; i += RB) s += expf(xr[i] - m);
    s = block_reduce(buf, s, 0);
    if (logp) {
        const float ls = logf(s);
        for (int i = l; i < n; i += RB) yr[i] = (xr[i] - m) - ls;
    } else {
        for (int i = l; i < n; i += RB) yr[i] = expf(xr[i] - m) / s;
    }
}

extern "C" __global__ void layer_norm_rows(float* out, const float* x, const float* gamma,
                                           const float* beta, int n, float eps, int flags) {
    __shared__ float buf[RB];
    const long long row = blockIdx.x;
    const int l = threadIdx.x;
    const float* xr = x + row * n;
    float* yr = out + row * n;
    float s = 0.0f;
    for (int i = l; i < n; i += RB) s += xr[i];
    const float mean = block_reduce(buf, s, 0) / (float)n;
    float v = 0.0f;
    for (int i = l; i < n; i += RB) { const float d = xr[i] - mean; v += d * d; }
    const float den = sqrtf(block_reduce(buf, v, 0) / (float)n + eps);
    for (int i = l; i < n; i += RB) {
        float y = (xr[i] - mean) / den;
        if (flags & 1) y = y * gamma[i];
        if (flags & 2) y = y + beta[i];
        yr[i] = y;
    }
}

// One LSTM step for (j, b) = (blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y):
// z_q = h_in[b] . w_t[:, q*H + j] + gx[b, q*H + j] with w_t = w_hh^T [H, 4H] (coalesced);
// c updated in place; h_out must not alias h_in.
extern "C" __global__ void lstm_step(float* h_out, float* c, const float* h_in, const float* gx,
                                     const float* w_t, int H) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (j >= H) return;
    const float* hr = h_in + (long long)b * H;
    const float* g = gx + (long long)b * 4 * H;
    float z[4];
    for (int q = 0; q < 4; ++q) {
        float acc = 0.0f;
        for (int k = 0; k < H; ++k) acc = fmaf(hr[k], w_t[(long long)k * 4 * H + q * H + j], acc);
        z[q] = acc + g[q * H + j];
    }
    const float ig = tanhf(z[0] * 0.5f) * 0.5f + 0.5f;
    const float fg = tanhf(z[1] * 0.5f) * 0.5f + 0.5f;
    const float gg = tanhf(z[2]);
    const float og = tanhf(z[3] * 0.5f) * 0.5f + 0.5f;
    const long long ci = (long long)b * H + j;
    const float cn = fg * c[ci] + ig * gg;
    c[ci] = cn;
    h_out[ci] = og * tanhf(cn);
}
"""
)

_modules: dict[int, Any] = {}
_modules_lock = threading.Lock()


def make_backend(device: str = "0") -> CudaBackend:
    """Backend on CUDA device ``device`` (an index; "" means 0). Needs cupy and a GPU."""
    return CudaBackend(device)


def _module(cp: Any, device_id: int) -> Any:
    """The fused-kernel module for one device, compiled once (cupy also caches on disk)."""
    with _modules_lock:
        mod = _modules.get(device_id)
        if mod is None:
            mod = cp.RawModule(code=_CUDA_SOURCE, options=("--fmad=false",))
            _modules[device_id] = mod
        return mod


def _scoped(fn: _F) -> _F:
    """Run the op with this view's device and stream current."""

    @functools.wraps(fn)
    def wrapper(self: CudaBackend, *args: Any, **kwargs: Any) -> Any:
        with self._device_ctx(), self._stream_ctx():
            return fn(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class CudaBackend:
    """ArrayBackend on one CUDA device via cupy. ``fork()`` gives a per-session stream."""

    name = "cuda"
    xp: Any
    _kernels: Any
    _device_id: int
    _cp: Any

    def __init__(
        self, device: str = "0", *, _parent: CudaBackend | None = None, _host: bool = False
    ) -> None:
        self.device = (device or "0").strip()
        if _parent is not None:
            self.xp, self.device, self._kernels = _parent.xp, _parent.device, _parent._kernels
            self._device_id, self._cp = _parent._device_id, _parent._cp
        elif _host:
            self.xp, self._kernels, self._device_id, self._cp = np, None, -1, None
        else:
            try:
                import cupy as cp  # lazily: the module must import without cupy
            except ImportError as exc:
                raise ImportError(
                    "cuda backend: cupy is not installed (pip install -e '.[cuda]')"
                ) from exc

            count = cp.cuda.runtime.getDeviceCount()
            self._device_id = int(self.device)
            if not 0 <= self._device_id < count:
                raise ValueError(f"cuda: no device {self.device!r}; {count} visible")
            self.xp, self._cp = cp, cp
            with cp.cuda.Device(self._device_id):
                self._kernels = _module(cp, self._device_id)
        self._functions: dict[str, Any] = {}
        if self._cp is not None:
            with self._cp.cuda.Device(self._device_id):
                self.stream: Any = self._cp.cuda.Stream(non_blocking=True)
        else:
            self.stream = None

    @classmethod
    def on_host(cls) -> CudaBackend:
        """This backend's array-module code on numpy, without fused kernels (CI checks)."""
        return cls("host", _host=True)

    def fork(self) -> CudaBackend:
        """A view for one session: same device, kernels and weights; its own stream."""
        self.finish()
        return CudaBackend(_parent=self)

    def finish(self) -> None:
        """Wait until this view's stream has finished its work."""
        if self.stream is not None:
            self.stream.synchronize()

    def _device_ctx(self) -> Any:
        return (
            self._cp.cuda.Device(self._device_id)
            if self._cp is not None
            else contextlib.nullcontext()
        )

    def _stream_ctx(self) -> Any:
        return self.stream if self.stream is not None else contextlib.nullcontext()

    def _kernel(self, name: str) -> Any:
        """The fused kernel ``name`` (None on the host module: callers fall back to xp ops)."""
        if self._kernels is None:
            return None
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._kernels.get_function(name)
        return fn

    # ---- transfer -------------------------------------------------------
    @_scoped
    def to_device(self, host: np.ndarray, dtype: Any = np.float32) -> Array:
        out = self.xp.asarray(np.ascontiguousarray(host, dtype=dtype))
        self.finish()  # synchronous upload: weights are read from every session's stream
        return out

    @_scoped
    def to_host(self, x: Array) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x
        out: np.ndarray = x.get(stream=self.stream)
        self.finish()
        return out

    @_scoped
    def zeros(self, shape: Sequence[int], dtype: Any = np.float32) -> Array:
        return self.xp.zeros(tuple(shape), dtype=dtype)

    def _dev(self, x: Any) -> Array:
        if isinstance(x, self.xp.ndarray):
            return x
        return self.xp.asarray(np.asarray(x, dtype=np.float32))

    # ---- shape ----------------------------------------------------------
    @_scoped
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        return self._dev(x).reshape(tuple(shape))

    @_scoped
    def transpose(self, x: Array, axes: Sequence[int]) -> Array:
        return self.xp.ascontiguousarray(self.xp.transpose(self._dev(x), tuple(axes)))

    @_scoped
    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        return self.xp.concatenate([self._dev(x) for x in xs], axis=axis)

    @_scoped
    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array:
        x = self._dev(x)
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return self.xp.ascontiguousarray(x[tuple(index)])

    @_scoped
    def pad(self, x: Array, axis: int, before: int, after: int, mode: str = "constant") -> Array:
        x = self._dev(x)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (before, after)
        return self.xp.pad(x, widths, mode=mode)

    @_scoped
    def take(self, x: Array, indices: np.ndarray, axis: int) -> Array:
        idx = self.xp.asarray(np.asarray(indices, dtype=np.int64))
        return self.xp.take(self._dev(x), idx, axis=axis)

    @_scoped
    def write_slice(self, dst: Array, axis: int, start: int, src: Array) -> None:
        src = self._dev(src)
        index = [slice(None)] * dst.ndim
        index[axis] = slice(start, start + src.shape[axis])
        dst[tuple(index)] = src

    # ---- elementwise ----------------------------------------------------
    @_scoped
    def add(self, a: Array, b: Array) -> Array:
        return self._dev(a) + self._dev(b)

    @_scoped
    def sub(self, a: Array, b: Array) -> Array:
        return self._dev(a) - self._dev(b)

    @_scoped
    def mul(self, a: Array, b: Array) -> Array:
        return self._dev(a) * self._dev(b)

    @_scoped
    def div(self, a: Array, b: Array) -> Array:
        return self._dev(a) / self._dev(b)

    @_scoped
    def scale(self, x: Array, s: float) -> Array:
        return self._dev(x) * np.float32(s)

    @_scoped
    def exp(self, x: Array) -> Array:
        return self.xp.exp(self._dev(x))

    @_scoped
    def sqrt(self, x: Array) -> Array:
        return self.xp.sqrt(self._dev(x))

    @_scoped
    def tanh(self, x: Array) -> Array:
        return self.xp.tanh(self._dev(x))

    @_scoped
    def sigmoid(self, x: Array) -> Array:
        x = self._dev(x)
        return (np.float32(0.5) * (np.float32(1.0) + self.xp.tanh(np.float32(0.5) * x))).astype(
            x.dtype, copy=False
        )

    @_scoped
    def relu(self, x: Array) -> Array:
        return self.xp.maximum(self._dev(x), np.float32(0))

    @_scoped
    def leaky_relu(self, x: Array, slope: float) -> Array:
        x = self._dev(x)
        return self.xp.where(x >= 0, x, x * np.float32(slope))

    @_scoped
    def gelu(self, x: Array) -> Array:
        x = self.xp.ascontiguousarray(self._dev(x))
        kernel = self._kernel("gelu")
        if kernel is None:
            return _gelu_xp(self.xp, x)
        out = self.xp.empty_like(x)
        if x.size:
            blocks = min(-(-x.size // _BLOCK), 65535)
            kernel((blocks,), (_BLOCK,), (out, x, np.int64(x.size)))
        return out

    # ---- reductions -----------------------------------------------------
    @_scoped
    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self.xp.sum(self._dev(x), axis=axis, keepdims=keepdims)

    @_scoped
    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self.xp.max(self._dev(x), axis=axis, keepdims=keepdims)

    def _softmax(self, x: Array, axis: int, logp: bool) -> Array:
        x = self._dev(x)
        kernel = self._kernel("softmax_rows")
        if kernel is not None and axis % x.ndim == x.ndim - 1 and x.size:
            x = self.xp.ascontiguousarray(x)
            out = self.xp.empty_like(x)
            n = x.shape[-1]
            kernel((x.size // n,), (_BLOCK,), (out, x, np.int32(n), np.int32(logp)))
            return out
        shifted = x - self.xp.max(x, axis=axis, keepdims=True)
        if logp:
            return shifted - self.xp.log(
                self.xp.sum(self.xp.exp(shifted), axis=axis, keepdims=True)
            )
        e = self.xp.exp(shifted)
        return e / self.xp.sum(e, axis=axis, keepdims=True)

    @_scoped
    def softmax(self, x: Array, axis: int = -1) -> Array:
        return self._softmax(x, axis, False)

    @_scoped
    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return self._softmax(x, axis, True)

    # ---- linear algebra and layers -----------------------------------------
    @_scoped
    def matmul(self, a: Array, b: Array) -> Array:
        return self.xp.matmul(self._dev(a), self._dev(b))

    @_scoped
    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        y = self.xp.matmul(self._dev(x), self._dev(w).T)
        if b is not None:
            y += self._dev(b)
        return y

    @_scoped
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
        """im2col (a strided view, copied in time chunks) and one batched GEMM per chunk."""
        xp = self.xp
        x, w = self._dev(x), self._dev(w)
        batch, c_in, t_in = x.shape
        c_out, c_in_g, k = w.shape
        t_out = (t_in + 2 * padding - dilation * (k - 1) - 1) // stride + 1
        if t_out <= 0:
            raise ValueError("conv1d: input shorter than the kernel's receptive field")
        c_out_g = c_out // groups
        xp_ = (
            xp.pad(x, ((0, 0), (0, 0), (padding, padding))) if padding else xp.ascontiguousarray(x)
        )
        xg = xp_.reshape(batch, groups, c_in_g, xp_.shape[-1])
        wg = w.reshape(groups, c_out_g, c_in_g * k)
        y = xp.empty((batch, groups, c_out_g, t_out), dtype=x.dtype)
        chunk = max(1, min(t_out, _CONV_CHUNK // max(1, batch * c_in * k)))
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
        out = y.reshape(batch, c_out, t_out)
        if b is not None:
            out += self._dev(b)[None, :, None]
        return out

    @_scoped
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
        """One GEMM per group for every (output channel, tap) row, then K strided adds."""
        xp = self.xp
        x, w = self._dev(x), self._dev(w)
        batch, c_in, t_in = x.shape
        _, c_out_g, k = w.shape
        c_in_g = c_in // groups
        full = (t_in - 1) * stride + dilation * (k - 1) + 1 + output_padding
        t_out = (t_in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1
        if t_out <= 0:
            raise ValueError("conv_transpose1d: empty output")
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
            y.reshape(batch, groups * c_out_g, full)[:, :, padding : padding + t_out]
        )
        if b is not None:
            out += self._dev(b)[None, :, None]
        return out

    @_scoped
    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        xp = self.xp
        x = xp.ascontiguousarray(self._dev(x))
        kernel = self._kernel("layer_norm_rows")
        if kernel is not None and x.size:
            n = x.shape[-1]
            out = xp.empty_like(x)
            g = self._dev(gamma) if gamma is not None else x
            bt = self._dev(beta) if beta is not None else x
            flags = (gamma is not None) | ((beta is not None) << 1)
            kernel(
                (x.size // n,),
                (_BLOCK,),
                (out, x, g, bt, np.int32(n), np.float32(eps), np.int32(flags)),
            )
            return out
        mean = xp.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        var = xp.mean(centered * centered, axis=-1, keepdims=True)
        y = centered / xp.sqrt(var + np.float32(eps))
        if gamma is not None:
            y = y * self._dev(gamma)
        if beta is not None:
            y = y + self._dev(beta)
        return y.astype(x.dtype, copy=False)

    def _lstm_run(self, gx: Array, h: Array, c: Array, w_hh: Array, hs: Array) -> Array:
        """Steps over gx [T, B, 4H] from (h, c); writes hs [T, B, H]; returns the final c."""
        xp = self.xp
        steps, batch, four_h = gx.shape
        hid = four_h // 4
        c = xp.array(c, dtype=np.float32, copy=True)
        kernel = self._kernel("lstm_step")
        w_t = xp.ascontiguousarray(w_hh.T)  # [H, 4H]
        h_prev = xp.ascontiguousarray(h)
        for t in range(steps):
            if kernel is not None:
                grid = (-(-hid // 128), batch)
                kernel(grid, (128,), (hs[t], c, h_prev, gx[t], w_t, np.int32(hid)))
            else:
                z = xp.matmul(h_prev[:, None, :], w_t)[:, 0, :] + gx[t]
                sig = xp.tanh(z * np.float32(0.5)) * np.float32(0.5) + np.float32(0.5)
                g = xp.tanh(z[:, 2 * hid : 3 * hid])
                c = sig[:, hid : 2 * hid] * c + sig[:, :hid] * g
                hs[t] = sig[:, 3 * hid :] * xp.tanh(c)
            h_prev = hs[t]
        return c

    @_scoped
    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        gx = self.linear(x, w_ih, b)
        hs = self.xp.empty((1, *self._dev(c).shape), dtype=np.float32)
        c_new = self._lstm_run(gx[None], self._dev(h), self._dev(c), self._dev(w_hh), hs)
        return hs[0], c_new

    @_scoped
    def lstm_sequence(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array, Array]:
        xp = self.xp
        x, h, c = self._dev(x), self._dev(h), self._dev(c)
        steps, batch, _ = x.shape
        gx = xp.ascontiguousarray(self.linear(x, w_ih, b))
        hs = xp.empty((steps, batch, h.shape[-1]), dtype=np.float32)
        c_new = self._lstm_run(gx, h, c, self._dev(w_hh), hs)
        h_last = hs[-1].copy() if steps else xp.array(h, copy=True)
        return hs, h_last, c_new

    @_scoped
    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        xp = self.xp
        q, k, v = self._dev(q), self._dev(k), self._dev(v)
        s = np.float32(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        scores = xp.matmul(q, xp.swapaxes(k, -1, -2))
        scores *= s
        if mask is not None:
            scores = scores + self._dev(mask)
        return xp.matmul(self._softmax(scores, -1, False), v)


def _gelu_xp(xp: Any, x: Array) -> Array:
    """Exact-erf GELU with array-module ops (the fused kernel's fallback), as numpy_backend."""
    z = xp.clip(x / np.float32(math.sqrt(2.0)), np.float32(-4.0), np.float32(4.0))
    z2 = z * z
    p = z2 * ERF_ALPHA[0]
    for a in ERF_ALPHA[1:-1]:
        p = (p + a) * z2
    p = p + ERF_ALPHA[-1]
    q = z2 * ERF_BETA[0]
    for c in ERF_BETA[1:-1]:
        q = (q + c) * z2
    q = q + ERF_BETA[-1]
    erf = (p * z) / q
    return (np.float32(0.5) * x * (np.float32(1.0) + erf)).astype(np.float32, copy=False)
