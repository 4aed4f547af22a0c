"""The OpenCL backend: every op of :class:`backends.base.ArrayBackend` as our own OpenCL C kernels.

Arrays are C-contiguous ``pyopencl.array.Array`` (float32 activations; int32/int64
where host indices need them) with no offset: every op returns a fresh
contiguous array, and ``reshape`` is the only view. Runs on any OpenCL 1.2+
device, including PoCL on a plain CPU (what CI uses).

Sessions: the program is built once per context and weights are uploaded once
(blocking, so any queue may read them). ``fork()`` returns a view on the same
context and program with its own in-order command queue, so sessions run
concurrently; a model family gives each session ``backend.fork()`` when the
backend has one (see docs/backends.md). Kernel objects (whose argument slots are
state) are per thread, so even one view shared by several threads is safe: its
queue then serialises their work.

Devices: every device is probed once (a tiny kernel built and run) and the
default device ``"0"`` is the first one that passes, so a platform whose
compiler cannot target this CPU is skipped; when none works,
:class:`OpenCLUnavailable` says which devices were tried, why they failed and
how to fix it (see :mod:`backends.opencl.devices`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

from backends import shapes
from backends.base import Array
from backends.opencl import ROW_GROUP, Kernels, program
from backends.opencl.devices import (
    DeviceProbe,
    OpenCLUnavailable,
    devices,
    first_cause,
    probe,
    select_device,
    working_devices,
)
from backends.opencl.shapes import (
    broadcast_strides,
    check_size,
    collapse,
    contiguous_strides,
    launches,
    need_float,
    prod,
    round_up,
    split3,
)
from backends.xp_backend import check_lstm

_UNARY = {
    "scale": 0,
    "exp": 1,
    "sqrt": 2,
    "tanh": 3,
    "sigmoid": 4,
    "relu": 5,
    "leaky_relu": 6,
    "gelu": 7,
}
_BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3}
_PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2, "symmetric": 3}
_ROWS_MIN = 128  # rows at least this long get a work group each, shorter ones a work item
_TILE = 32  # GEMM output tile (TM = TN in kernels.cl); 8x8 work items per tile
_GROUP = 32  # work-group size of the elementwise / copy / direct-GEMM kernels

__all__ = [
    "DeviceProbe",
    "OpenCLBackend",
    "OpenCLUnavailable",
    "check_device",
    "devices",
    "make_backend",
    "probe",
    "working_devices",
]


def make_backend(device: str = "0") -> OpenCLBackend:
    """Backend on ``device``: "0" or "" for the first device that can build kernels,
    "platform:device" or one index over all devices for exactly that device, or
    "cpu" / "gpu" for the first working device of that type (see backends.opencl.devices).

    Raises :class:`OpenCLUnavailable` when no selected device can build kernels.
    """
    return OpenCLBackend(device)


def check_device(device: str = "0") -> DeviceProbe:
    """The device ``make_backend(device)`` would use, probed, without building the backend.

    Raises :class:`OpenCLUnavailable` (naming every device tried, the cause and
    the fix) or ``ValueError`` (a spec naming no device).
    """
    return select_device(device)


class OpenCLBackend:
    """ArrayBackend on one OpenCL device. ``fork()`` gives a per-session view (own queue)."""

    name = "opencl"
    gemm: str
    probe: DeviceProbe

    def __init__(
        self, device: str = "0", *, gemm: str = "auto", _parent: OpenCLBackend | None = None
    ) -> None:
        if gemm not in ("auto", "tiled", "cpu"):
            raise ValueError(f"opencl: gemm must be auto, tiled or cpu, not {gemm!r}")
        if _parent is None:
            self.device = device
            self.probe = select_device(device)
            dev = self.probe.device
            self.context = cl.Context([dev])
            self.cl_device = dev
            try:
                self.program = program(self.context)
            except cl.Error as exc:  # the probe kernel built, ours did not
                raise OpenCLUnavailable(
                    f"opencl: {self.probe.describe()} cannot build voxpool's kernels: "
                    f"{first_cause(exc)}"
                ) from exc
        else:
            self.device = _parent.device
            self.probe = _parent.probe
            self.context = _parent.context
            self.cl_device = _parent.cl_device
            self.program = _parent.program
        if _parent is not None:
            gemm = _parent.gemm
        elif gemm == "auto":  # local-memory tiles on GPUs; CPUs (PoCL) prefer register blocks
            gemm = "cpu" if self.cl_device.type & cl.device_type.CPU else "tiled"
        self.gemm = gemm
        # work-group row reductions pay on GPUs; on CPUs one work item per row is faster
        self._group_rows = gemm == "tiled"
        self.queue = cl.CommandQueue(self.context)
        self._tls = threading.local()  # kernel objects per thread (their arguments are state)
        self._dummy = cla.empty(self.queue, (1,), np.float32)

    def fork(self) -> OpenCLBackend:
        """A view for one session: same context, program and weights; its own queue and kernels.

        Waits for this view's queue first, so whatever it computed (weights derived
        on the device at load time) is complete before another queue reads it.
        """
        self.queue.finish()
        return OpenCLBackend(_parent=self)

    def finish(self) -> None:
        """Wait until every command on this view's queue is done."""
        self.queue.finish()

    # ---- transfer -------------------------------------------------------
    def to_device(self, host: np.ndarray, dtype: Any = np.float32) -> Array:
        data = np.ascontiguousarray(host, dtype=dtype)
        check_size(data.shape)
        out = cla.empty(self.queue, data.shape, data.dtype)
        if data.size:
            cl.enqueue_copy(
                self.queue, cast(cl.Buffer, out.data), data, is_blocking=True
            )  # blocking: any queue may read it
        return out

    def to_host(self, x: Array) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x
        out = np.empty(x.shape, x.dtype)
        if x.size:
            cl.enqueue_copy(self.queue, out, x.data, is_blocking=True)
        return out

    def zeros(self, shape: Sequence[int], dtype: Any = np.float32) -> Array:
        shape = tuple(int(s) for s in shape)
        check_size(shape)
        out = cla.empty(self.queue, shape, dtype)
        if out.size:
            buf = cast(cl.Buffer, out.data)
            cl.enqueue_fill_buffer(self.queue, buf, np.zeros(1, np.uint8), 0, out.nbytes)
        return out

    # ---- helpers ---------------------------------------------------------
    def _dev(self, x: Any) -> Array:
        """Device array for ``x``; host arrays and Python scalars are uploaded (float32)."""
        if isinstance(x, cla.Array):
            return x
        return self.to_device(np.asarray(x, dtype=np.float32))

    def _dev_opt(self, x: Any | None) -> Array | None:
        """An optional operand (a bias, gamma, beta, a mask) as :meth:`_dev` has it; None stays."""
        return None if x is None else self._dev(x)

    def _weighted(self, x: Any, w: Any, b: Any | None) -> tuple[Array, Array, Array | None]:
        """A weighted layer's operands (input, float weights, optional bias) on the device."""
        x, w = self._dev(x), self._dev(w)
        need_float(x, w)
        return x, w, self._dev_opt(b)

    def _empty(self, shape: Sequence[int], dtype: Any = np.float32) -> Array:
        shape = tuple(int(s) for s in shape)
        check_size(shape)
        return cla.empty(self.queue, shape, dtype)

    @property
    def kernels(self) -> Kernels:
        """This thread's kernel objects for this view (built lazily from the shared program)."""
        kernels: Kernels | None = getattr(self._tls, "kernels", None)
        if kernels is None:
            kernels = self._tls.kernels = Kernels(self.program)
        return kernels

    def _run(
        self, name: str, gsize: tuple[int, ...], lsize: tuple[int, ...] | None, *args: Any
    ) -> None:
        self.kernels[name](self.queue, gsize, lsize, *args)

    # Fixed work-group sizes (global sizes rounded up, kernels bound-check): PoCL builds
    # one work-group function per kernel and local size, so a fixed size means one build
    # per kernel instead of one per array shape.
    def _flat(self, name: str, n: int, *args: Any) -> None:
        """A 1-D kernel over ``n`` items (its last argument is ``n``)."""
        self._run(name, (round_up(n, _GROUP),), (_GROUP,), *args, n)

    def _rows(self, name: str, n: int, rows: int, *args: Any) -> None:
        """A 2-D kernel over ``n`` items in each of ``rows`` rows (last argument ``n``)."""
        self._run(name, (round_up(n, _GROUP), rows), (_GROUP, 1), *args, n)

    def _copy_kernel(self, name: str, x: Array) -> str:
        size = x.dtype.itemsize
        if size not in (4, 8):
            raise TypeError(f"opencl: {name} supports 4- and 8-byte elements, not {x.dtype}")
        return f"{name}_{size}"

    # ---- shape ----------------------------------------------------------
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        x = self._dev(x)
        return x.reshape(shapes.reshape_shape(x.size, shape))

    def transpose(self, x: Array, axes: Sequence[int]) -> Array:
        x = self._dev(x)
        axes = [a % x.ndim for a in axes] if x.ndim else []
        if axes == list(range(x.ndim)):
            return x
        shape = tuple(x.shape[a] for a in axes)
        own = contiguous_strides(x.shape)
        return self._strided_copy(x, shape, [own[a] for a in axes])

    def _strided_copy(self, x: Array, shape: tuple[int, ...], strides: Sequence[int]) -> Array:
        out = self._empty(shape, x.dtype)
        if out.size == 0:
            return out
        name = self._copy_kernel("copy_nd", x)
        for dims, (st,), o_out, (o_src,) in launches(*collapse(shape, strides)):
            self._flat(name, prod(dims), out.data, x.data, *dims[1:], *st, o_out, o_src)
        return out

    def _broadcast_to(self, x: Array, shape: tuple[int, ...]) -> Array:
        if tuple(x.shape) == shape:
            return x
        return self._strided_copy(x, shape, broadcast_strides(x.shape, shape))

    def concat(self, xs: Sequence[Array], axis: int) -> Array:
        parts = [self._dev(x) for x in xs]
        shape = shapes.concat_shape([p.shape for p in parts], axis)
        first = parts[0]
        axis %= first.ndim
        total = shape[axis]
        out = self._empty(shape, first.dtype)
        outer = prod(shape[:axis])
        inner = prod(shape[axis + 1 :])
        offset = 0
        for p in parts:
            n = p.shape[axis] * inner
            if n and outer:
                self._rows(
                    self._copy_kernel("copy_block", p),
                    n,
                    outer,
                    out.data,
                    p.data,
                    total * inner,
                    offset,
                    n,
                    0,
                )
            offset += n
        return out

    def slice(self, x: Array, axis: int, start: int, stop: int) -> Array:
        x = self._dev(x)
        axis %= x.ndim
        start, stop, _ = slice(start, stop).indices(x.shape[axis])
        count = max(0, stop - start)
        if count == x.shape[axis]:
            return x
        shape = (*x.shape[:axis], count, *x.shape[axis + 1 :])
        out = self._empty(shape, x.dtype)
        inner = prod(x.shape[axis + 1 :])
        outer = prod(x.shape[:axis])
        if out.size:
            n = count * inner
            self._rows(
                self._copy_kernel("copy_block", x),
                n,
                outer,
                out.data,
                x.data,
                n,
                0,
                x.shape[axis] * inner,
                start * inner,
            )
        return out

    def pad(self, x: Array, axis: int, before: int, after: int, mode: str = "constant") -> Array:
        x = self._dev(x)
        if mode not in _PAD_MODES:
            raise ValueError(f"pad: mode {mode!r} not supported; one of {sorted(_PAD_MODES)}")
        axis %= x.ndim
        n_in = x.shape[axis]
        if n_in == 0 and (before or after) and mode != "constant":
            raise ValueError(f"pad: can't {mode}-pad an empty axis")
        n_out = n_in + before + after
        shape = (*x.shape[:axis], n_out, *x.shape[axis + 1 :])
        out = self._empty(shape, x.dtype)
        if out.size:
            inner = prod(x.shape[axis + 1 :])
            self._flat(
                self._copy_kernel("pad", x),
                out.size,
                out.data,
                x.data,
                n_in,
                n_out,
                inner,
                before,
                _PAD_MODES[mode],
            )
        return out

    def take(self, x: Array, indices: np.ndarray, axis: int) -> Array:
        x = self._dev(x)
        axis %= x.ndim
        n_in = x.shape[axis]
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -n_in or idx.max() >= n_in):
            raise IndexError(f"take: index out of range for axis of size {n_in}")
        idx = np.where(idx < 0, idx + n_in, idx).astype(np.int32)
        idx_shape = np.shape(indices)
        shape = (*x.shape[:axis], *idx_shape, *x.shape[axis + 1 :])
        out = self._empty(shape, x.dtype)
        if out.size:
            d_idx = self.to_device(idx, np.int32)
            inner = prod(x.shape[axis + 1 :])
            self._flat(
                self._copy_kernel("take", x),
                out.size,
                out.data,
                x.data,
                d_idx.data,
                n_in,
                idx.size,
                inner,
            )
        return out

    def write_slice(self, dst: Array, axis: int, start: int, src: Array) -> None:
        src = self._dev(src)
        axis, start = shapes.write_slice_start(dst.shape, axis, start, src.shape)
        if src.dtype != dst.dtype:
            raise TypeError(f"write_slice: dtype {src.dtype} into {dst.dtype}")
        count = src.shape[axis]
        if src.size == 0:
            return
        inner = prod(dst.shape[axis + 1 :])
        n = count * inner
        self._rows(
            self._copy_kernel("copy_block", dst),
            n,
            prod(dst.shape[:axis]),
            dst.data,
            src.data,
            dst.shape[axis] * inner,
            start * inner,
            n,
            0,
        )

    # ---- elementwise ----------------------------------------------------
    def _binary(self, op: str, a: Any, b: Any) -> Array:
        a, b = self._dev(a), self._dev(b)
        need_float(a, b)
        shape = shapes.broadcast_shape(op, a.shape, b.shape)
        out = self._empty(shape)
        if out.size == 0:
            return out
        if tuple(a.shape) == tuple(b.shape):
            self._flat("binary_flat", out.size, out.data, a.data, b.data, _BINARY[op])
            return out
        collapsed = collapse(
            shape, broadcast_strides(a.shape, shape), broadcast_strides(b.shape, shape)
        )
        dims2, (sa2, sb2) = collapsed
        if len(dims2) <= 2:  # a 2-D launch: no index division per element
            d = [1] * (2 - len(dims2)) + dims2
            sa2, sb2 = [0] * (2 - len(sa2)) + sa2, [0] * (2 - len(sb2)) + sb2
            self._rows("binary_2d", d[1], d[0], out.data, a.data, b.data, _BINARY[op], *sa2, *sb2)
            return out
        for dims, (sa, sb), o_out, (o_a, o_b) in launches(*collapsed):
            self._flat(
                "binary_nd",
                prod(dims),
                out.data,
                a.data,
                b.data,
                _BINARY[op],
                *dims[1:],
                *sa,
                *sb,
                o_out,
                o_a,
                o_b,
            )
        return out

    def add(self, a: Array, b: Array) -> Array:
        return self._binary("add", a, b)

    def sub(self, a: Array, b: Array) -> Array:
        return self._binary("sub", a, b)

    def mul(self, a: Array, b: Array) -> Array:
        return self._binary("mul", a, b)

    def div(self, a: Array, b: Array) -> Array:
        return self._binary("div", a, b)

    def _unary(self, op: str, x: Any, p: float = 0.0) -> Array:
        x = self._dev(x)
        need_float(x)
        out = self._empty(x.shape)
        if out.size:
            self._flat("unary_f", out.size, out.data, x.data, _UNARY[op], p)
        return out

    def scale(self, x: Array, s: float) -> Array:
        return self._unary("scale", x, float(s))

    def exp(self, x: Array) -> Array:
        return self._unary("exp", x)

    def sqrt(self, x: Array) -> Array:
        return self._unary("sqrt", x)

    def tanh(self, x: Array) -> Array:
        return self._unary("tanh", x)

    def sigmoid(self, x: Array) -> Array:
        return self._unary("sigmoid", x)

    def relu(self, x: Array) -> Array:
        return self._unary("relu", x)

    def leaky_relu(self, x: Array, slope: float) -> Array:
        return self._unary("leaky_relu", x, float(slope))

    def gelu(self, x: Array) -> Array:
        return self._unary("gelu", x)

    # ---- reductions -----------------------------------------------------
    def _reduce(self, x: Any, axis: int, keepdims: bool, op: int) -> Array:
        x = self._dev(x)
        need_float(x)
        axis %= x.ndim
        outer, n, inner = split3(x.shape, axis)
        shape = (
            (*x.shape[:axis], 1, *x.shape[axis + 1 :])
            if keepdims
            else (*x.shape[:axis], *x.shape[axis + 1 :])
        )
        out = self._empty(shape)
        if out.size == 0:
            return out
        if n == 0:
            if op == 1:
                raise ValueError("max: zero-size reduction axis")
            cl.enqueue_fill_buffer(self.queue, out.data, np.zeros(1, np.uint8), 0, out.nbytes)
        elif inner == 1 and n >= _ROWS_MIN and self._group_rows:
            self._run("reduce_rows", (outer * ROW_GROUP,), (ROW_GROUP,), out.data, x.data, n, op)
        else:
            self._flat("reduce_strided", outer * inner, out.data, x.data, n, inner, op)
        return out

    def sum(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self._reduce(x, axis, keepdims, 0)

    def max(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return self._reduce(x, axis, keepdims, 1)

    def _softmax(self, x: Any, axis: int, logp: int) -> Array:
        x = self._dev(x)
        need_float(x)
        axis %= x.ndim
        outer, n, inner = split3(x.shape, axis)
        out = self._empty(x.shape)
        if out.size == 0:
            return out
        if inner == 1 and n >= _ROWS_MIN and self._group_rows:
            self._run("softmax_rows", (outer * ROW_GROUP,), (ROW_GROUP,), out.data, x.data, n, logp)
        elif inner == 1 and n >= 8:  # CPUs: one item per row, eight lanes along it
            self._flat("softmax_vec", outer, out.data, x.data, n, logp)
        else:
            self._flat("softmax_strided", outer * inner, out.data, x.data, n, inner, logp)
        return out

    def softmax(self, x: Array, axis: int = -1) -> Array:
        return self._softmax(x, axis, 0)

    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return self._softmax(x, axis, 1)

    # ---- linear algebra and layers -----------------------------------------
    def _gemm(
        self,
        out: Array,
        a: Array,
        b: Array,
        m: int,
        n: int,
        k: int,
        batch: int,
        *,
        trans_b: bool = False,
        a_mod: int = 1,
        a_stride: int = 0,
        b_mod: int = 1,
        b_stride: int = 0,
        alpha: float = 1.0,
        bias: Array | None = None,
        bias_mode: int = 0,
        conv: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0),
    ) -> None:
        """out[bz] = alpha * A[bz] B[bz] (+ bias); see the gemm kernel for the batch mapping."""
        if m == 0 or n == 0 or batch == 0:
            return
        lda = k
        ldb = k if trans_b else n
        if self.gemm == "tiled":
            name, gsize, lsize = "gemm", (-(-n // _TILE) * 8, -(-m // _TILE) * 8, batch), (8, 8, 1)
        elif trans_b and m >= 4 and conv[1] == 0:
            # B [N, K] rows are read across work items by the block kernel: transpose once
            bt = self._strided_copy(b.reshape((b.size,)), (max(1, b_mod), k, n), (n * k, 1, k))
            self._gemm(
                out,
                a,
                bt,
                m,
                n,
                k,
                batch,
                a_mod=a_mod,
                a_stride=a_stride,
                b_mod=b_mod,
                b_stride=b_stride,
                alpha=alpha,
                bias=bias,
                bias_mode=bias_mode,
            )
            return
        elif m < 4 and not trans_b and conv[1] == 0:  # vector x matrix: 32 columns per item
            name, lsize = "gemm_wide", (8, 1, 1)
            gsize = (round_up(-(-n // 32), 8), m, batch)
        elif trans_b and m < 4:  # matrix-vector products (decoder steps): one dot per item
            name, gsize, lsize = "gemm_direct", (round_up(n, _GROUP), m, batch), (_GROUP, 1, 1)
        else:  # 4 x 8 register blocks, 8 x 8 items per group (few groups: PoCL's dispatch is slow)
            name, lsize = "gemm_block", (8, 8, 1)
            gsize = (round_up(-(-n // 8), 8), round_up(-(-m // 4), 8), batch)
        bias_buf = (bias if bias is not None else self._dummy).data
        self._run(
            name,
            gsize,
            lsize,
            out.data,
            a.data,
            b.data,
            bias_buf,
            m,
            n,
            k,
            lda,
            ldb,
            int(trans_b),
            max(1, a_mod),
            a_stride,
            max(1, b_mod),
            b_stride,
            float(alpha),
            bias_mode if bias is not None else 0,
            *conv,
        )

    def _batched(self, a: Array, b: Array, trans_b: bool, alpha: float = 1.0) -> Array:
        """a [..., M, K] @ b [..., K, N] (b [..., N, K] when trans_b), batch dims broadcast."""
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-2] if trans_b else b.shape[-1]
        lead = shapes.broadcast_shape("matmul", a.shape[:-2], b.shape[:-2])
        batch = prod(lead)
        a_mod, a = self._batch_operand(a, lead)
        b_mod, b = self._batch_operand(b, lead)
        out = self._empty((*lead, m, n))
        self._gemm(
            out,
            a,
            b,
            m,
            n,
            k,
            batch,
            trans_b=trans_b,
            a_mod=a_mod,
            a_stride=m * k,
            b_mod=b_mod,
            b_stride=k * n,
            alpha=alpha,
        )
        return out

    def _batch_operand(self, x: Array, lead: tuple[int, ...]) -> tuple[int, Array]:
        """(mod, array) with batch bz reading matrix bz % mod: a suffix of the batch shape
        is read directly, anything else is broadcast to the full batch first."""
        own = tuple(x.shape[:-2])
        while own and own[0] == 1:
            own = own[1:]
        if own == lead[len(lead) - len(own) :]:
            return prod(own), x
        full = self._broadcast_to(x, (*lead, *x.shape[-2:]))
        return prod(lead), full

    def matmul(self, a: Array, b: Array) -> Array:
        a, b = self._dev(a), self._dev(b)
        need_float(a, b)
        shape = shapes.matmul_shape(a.shape, b.shape)
        a2 = a.reshape((1, a.shape[0])) if a.ndim == 1 else a
        b2 = b.reshape((b.shape[0], 1)) if b.ndim == 1 else b
        return self._batched(a2, b2, trans_b=False).reshape(shape)

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        x, w, bias = self._weighted(x, w, b)
        shape = shapes.linear_shape(x.shape, w.shape, shapes.shape_of(bias))
        n, k = w.shape
        m = prod(shape[:-1])
        out = self._empty(shape)
        self._gemm(out, x, w, m, n, k, 1, trans_b=True, bias=bias, bias_mode=1)
        return out

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
        x, w, bias = self._weighted(x, w, b)
        s = shapes.conv1d_shape(
            x.shape, w.shape, shapes.shape_of(bias), stride, padding, dilation, groups
        )
        batch, t_in, c_out, c_out_g = s.batch, s.length, s.c_out, s.c_out_g
        c_in_g, k, t_out = s.c_in_g, s.kernel, s.out_length
        out = self._empty((batch, c_out, t_out))
        self._gemm(
            out,
            w,
            x,
            c_out_g,
            t_out,
            c_in_g * k,
            batch * groups,
            a_mod=groups,
            a_stride=c_out_g * c_in_g * k,
            b_mod=batch * groups,
            b_stride=c_in_g * t_in,
            bias=bias,
            bias_mode=2,
            conv=(t_in, k, stride, dilation, padding),
        )
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
        x, w, bias_in = self._weighted(x, w, b)
        s = shapes.conv_transpose1d_shape(
            x.shape,
            w.shape,
            shapes.shape_of(bias_in),
            stride,
            padding,
            output_padding,
            dilation,
            groups,
        )
        batch, t_in, c_out, c_out_g = s.batch, s.length, s.c_out, s.c_out_g
        k, t_out = s.kernel, s.out_length
        # one GEMM per (batch, group) gives every (output channel, tap) row, then the
        # taps that land on each output sample are summed (overlap-add)
        c_in_g = s.c_in_g
        wt = self._strided_copy(  # [G, Cout_g * K, Cin_g]: w's last two dims swapped
            w.reshape((groups * c_in_g * c_out_g * k,)),
            (groups, c_out_g * k, c_in_g),
            (c_in_g * c_out_g * k, 1, c_out_g * k),
        )
        contrib = self._empty((batch, c_out, k, t_in))
        self._gemm(
            contrib,
            wt,
            x,
            c_out_g * k,
            t_in,
            c_in_g,
            batch * groups,
            a_mod=groups,
            a_stride=c_out_g * k * c_in_g,
            b_mod=batch * groups,
            b_stride=c_in_g * t_in,
        )
        out = self._empty((batch, c_out, t_out))
        if out.size:
            bias = bias_in if bias_in is not None else self._dummy
            self._flat(
                "overlap_add",
                out.size,
                out.data,
                contrib.data,
                bias.data,
                int(b is not None),
                c_out,
                t_in,
                t_out,
                k,
                stride,
                padding,
                dilation,
            )
        return out

    def layer_norm(
        self, x: Array, gamma: Array | None, beta: Array | None, eps: float = 1e-5
    ) -> Array:
        x = self._dev(x)
        need_float(x)
        g, bt = self._dev_opt(gamma), self._dev_opt(beta)
        shapes.layer_norm_shape(x.shape, shapes.shape_of(g), shapes.shape_of(bt))
        g = self._dummy if g is None else g
        bt = self._dummy if bt is None else bt
        n = x.shape[-1]
        rows = x.size // n if n else 0
        out = self._empty(x.shape)
        if out.size == 0:
            return out
        flags = (gamma is not None) | ((beta is not None) << 1)
        if n >= _ROWS_MIN and self._group_rows:
            self._run(
                "layer_norm_rows",
                (rows * ROW_GROUP,),
                (ROW_GROUP,),
                out.data,
                x.data,
                g.data,
                bt.data,
                n,
                float(eps),
                flags,
            )
        else:
            self._flat(
                "layer_norm_item", rows, out.data, x.data, g.data, bt.data, n, float(eps), flags
            )
        return out

    def _lstm_steps(
        self, gx: Array, hs: Array, h0: Array, c: Array, w_hh: Array, steps: int, batch: int
    ) -> None:
        """Run the recurrence: gx [T, B, 4H] input gates, hs [T, B, H] output.

        ``c`` is updated in place.
        """
        hid = c.shape[-1]
        for t in range(steps):
            h_in, h_in_off = (h0, 0) if t == 0 else (hs, (t - 1) * batch * hid)
            self._run(
                "lstm_step",
                (round_up(hid, _GROUP), batch),
                (_GROUP, 1),
                hs.data,
                c.data,
                h_in.data,
                gx.data,
                w_hh.data,
                hid,
                h_in_off,
                t * batch * hid,
                t * batch * 4 * hid,
            )

    def lstm_cell(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array]:
        x, h, c, w_ih, w_hh = (self._dev(v) for v in (x, h, c, w_ih, w_hh))
        need_float(x, h, c, w_ih, w_hh)
        b = self._dev_opt(b)
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=False)
        gx = self.linear(x, w_ih, b)
        lead = tuple(c.shape[:-1])
        batch = prod(lead)
        c_new = self._copy(c)
        h_new = self._empty(c.shape)
        if batch and c.shape[-1]:
            self._lstm_steps(gx, h_new, h, c_new, w_hh, 1, batch)
        return h_new, c_new

    def lstm_sequence(
        self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array | None
    ) -> tuple[Array, Array, Array]:
        x, h, c, w_ih, w_hh = (self._dev(v) for v in (x, h, c, w_ih, w_hh))
        need_float(x, h, c, w_ih, w_hh)
        b = self._dev_opt(b)
        check_lstm(x, h, c, w_ih, w_hh, b, sequence=True)
        steps, batch, _ = x.shape
        hid = h.shape[-1]
        gx = self.linear(x, w_ih, b)  # [T, B, 4H], one GEMM for every step
        hs = self._empty((steps, batch, hid))
        c_new = self._copy(c)
        if steps == 0:
            return hs, self._copy(h), c_new
        if batch and hid:
            self._lstm_steps(gx, hs, h, c_new, w_hh, steps, batch)
        return hs, self.slice(hs, 0, steps - 1, steps).reshape((batch, hid)), c_new

    def _copy(self, x: Array) -> Array:
        out = self._empty(x.shape, x.dtype)
        if out.size:
            cl.enqueue_copy(self.queue, out.data, x.data, byte_count=x.nbytes)
        return out

    def attention(
        self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None
    ) -> Array:
        q, k, v = self._dev(q), self._dev(k), self._dev(v)
        mask = self._dev_opt(mask)
        shapes.attention_shape(q.shape, k.shape, v.shape, shapes.shape_of(mask))
        s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        scores = self._batched(q, k, trans_b=True, alpha=s)
        if mask is not None:
            scores = self.add(scores, mask)
        return self._batched(self.softmax(scores, axis=-1), v, trans_b=False)
