"""The CUDA backend: :class:`backends.base.ArrayBackend` on cupy arrays.

Every op is :class:`backends.xp_backend.XpBackend`'s with cupy as the array module
(matrix products go to cuBLAS through ``cupy.matmul``), except GELU, layer norm,
last-axis softmax and the LSTM step, which are fused CUDA kernels here (one launch
instead of five to eight cupy ops each; the LSTM step also makes every batch row's
result independent of the batch size, as the interface requires). Arrays are
C-contiguous float32 ``cupy.ndarray``; every op runs with this view's device and
stream current.

cupy is imported lazily (in :func:`make_backend` / the constructor), so this
module imports, and the test suite collects, on machines without cupy or a GPU.

Sessions: weights are uploaded once (the upload is synchronised, so any stream may
read them); ``fork()`` returns a view on the same device with its own non-blocking
``cupy.cuda.Stream``, and every op of a view runs on its stream. cupy's memory pool
is stream-aware, so a session's scratch memory is reused on its own stream.

``CudaBackend.on_host()`` runs this class with numpy in place of cupy and no fused
kernels, and ``XpBackend(numpy)`` the generic code it inherits: CI checks both
without a GPU. The fused kernels are only exercised on a GPU (see
docs/backends.md and bench/gpu_check.sh).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from backends import shapes
from backends.base import OPS, Array
from backends.erf import c_source
from backends.xp_backend import XpBackend

_F = TypeVar("_F", bound=Callable[..., Any])
_BLOCK = 256  # threads per block of the row kernels (a power of two)

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


def _scope_ops(cls: type[CudaBackend]) -> type[CudaBackend]:
    """Wrap every interface op of ``cls`` (its own or inherited) in :func:`_scoped`."""
    for op in OPS:
        setattr(cls, op, _scoped(getattr(cls, op)))
    return cls


@_scope_ops
class CudaBackend(XpBackend):
    """ArrayBackend on one CUDA device via cupy. ``fork()`` gives a per-session stream."""

    name = "cuda"
    _kernels: Any
    _device_id: int
    _cp: Any

    def __init__(
        self, device: str = "0", *, _parent: CudaBackend | None = None, _host: bool = False
    ) -> None:
        device = (device or "0").strip()
        if _parent is not None:
            super().__init__(_parent.xp, _parent.device)
            self._kernels, self._device_id, self._cp = (
                _parent._kernels,
                _parent._device_id,
                _parent._cp,
            )
        elif _host:
            super().__init__(np, device)
            self._kernels, self._device_id, self._cp = None, -1, None
        else:
            try:
                import cupy as cp  # lazily: the module must import without cupy
            except ImportError as exc:
                raise ImportError(
                    "cuda backend: cupy is not installed (pip install -e '.[cuda]')"
                ) from exc

            count = cp.cuda.runtime.getDeviceCount()
            self._device_id = int(device)
            if not 0 <= self._device_id < count:
                raise ValueError(f"cuda: no device {device!r}; {count} visible")
            super().__init__(cp, device)
            self._cp = cp
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
    def to_host(self, x: Array) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x
        out: np.ndarray = x.get(stream=self.stream)
        self.finish()
        return out

    # ---- ops with a cupy-specific form ------------------------------------
    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array:
        return self.xp.ascontiguousarray(super().slice(x, axis, start, stop))

    def gelu(self, x: Array) -> Array:
        kernel = self._kernel("gelu")
        if kernel is None:
            return super().gelu(x)
        x = self.xp.ascontiguousarray(self._dev(x))
        out = self.xp.empty_like(x)
        if x.size:
            blocks = min(-(-x.size // _BLOCK), 65535)
            kernel((blocks,), (_BLOCK,), (out, x, np.int64(x.size)))
        return out

    def _softmax_rows(self, x: Array, axis: int, logp: bool) -> Array | None:
        """(log-)softmax over the last axis by the fused kernel; None where it doesn't apply."""
        x = self._dev(x)
        kernel = self._kernel("softmax_rows")
        if kernel is None or axis % x.ndim != x.ndim - 1 or not x.size:
            return None
        x = self.xp.ascontiguousarray(x)
        out = self.xp.empty_like(x)
        n = x.shape[-1]
        kernel((x.size // n,), (_BLOCK,), (out, x, np.int32(n), np.int32(logp)))
        return out

    def softmax(self, x: Array, axis: int = -1) -> Array:
        out = self._softmax_rows(x, axis, False)
        return super().softmax(x, axis) if out is None else out

    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        out = self._softmax_rows(x, axis, True)
        return super().log_softmax(x, axis) if out is None else out

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        kernel = self._kernel("layer_norm_rows")
        x = self.xp.ascontiguousarray(self._dev(x))
        if kernel is None or not x.size:
            return super().layer_norm(x, gamma, beta, eps)
        g, bt = self._dev_opt(gamma), self._dev_opt(beta)
        shapes.layer_norm_shape(x.shape, shapes.shape_of(g), shapes.shape_of(bt))
        g, bt = (x if g is None else g), (x if bt is None else bt)  # read only where flagged
        n = x.shape[-1]
        out = self.xp.empty_like(x)
        flags = (gamma is not None) | ((beta is not None) << 1)
        kernel(
            (x.size // n,),
            (_BLOCK,),
            (out, x, g, bt, np.int32(n), np.float32(eps), np.int32(flags)),
        )
        return out

    def _lstm_run(self, gx: Array, h: Array, c: Array, w_hh: Array, hs: Array) -> Array:
        """Steps over gx [T, B, 4H] from (h, c) by the fused step kernel; returns the final c."""
        kernel = self._kernel("lstm_step")
        if kernel is None:
            return super()._lstm_run(gx, h, c, w_hh, hs)
        xp = self.xp
        steps, batch, four_h = gx.shape
        hid = four_h // 4
        c = xp.array(c, dtype=np.float32, copy=True)
        w_t = xp.ascontiguousarray(w_hh.T)  # [H, 4H]
        h_prev = xp.ascontiguousarray(h)
        for t in range(steps):
            grid = (-(-hid // 128), batch)
            kernel(grid, (128,), (hs[t], c, h_prev, gx[t], w_t, np.int32(hid)))
            h_prev = hs[t]
        return c
