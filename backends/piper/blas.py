"""The SGEMM of the BLAS numpy itself runs on, called with strides and ``beta = 1``.

numpy's ``matmul`` always writes a fresh product (``beta = 0``) and takes only
operands whose rows do not overlap. A convolution as a sum over its taps,
``out += W_k @ x[:, s + d * k : s + d * k + n]``, wants exactly what it lacks:
every tap's input is a shifted view of one activation buffer (rows a buffer's
width apart), and every tap's product adds into the same output tile. Called
through BLAS directly, that needs no im2col copy, no separate residual or bias
pass (the output is filled with them first) and no temporary product.

The library is the one numpy loaded (its wheels bundle scipy-openblas: the same
code, the same thread setting, so :mod:`server.blas`'s adaptive threads and
:mod:`backends.parallel`'s splits apply as they do to ``matmul``). Only symbols
whose integer width is known are used; :data:`SGEMM` is None where none is found
(another BLAS, another platform), and the callers fall back to their im2col
paths. Every call checks shapes, dtypes and bounds before it hands out a pointer.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from backends import handoff, kernels

_ROW_MAJOR, _NO_TRANS = 101, 111

_SYMBOLS = (
    ("scipy_cblas_sgemm64_", ctypes.c_int64),  # numpy's wheels (scipy-openblas64, ILP64)
    ("cblas_sgemm64_", ctypes.c_int64),
    ("scipy_cblas_sgemm", ctypes.c_int32),  # scipy-openblas32 (LP64)
)


def _load() -> tuple[Callable[..., Any] | None, int]:
    """``cblas_sgemm`` of the OpenBLAS bundled with numpy (None: not found) and its address
    where it takes 64-bit integers (else 0)."""
    root = os.path.dirname(np.__file__)
    paths = sorted(
        glob.glob(os.path.join(root, os.pardir, "numpy.libs", "libscipy_openblas*"))
        + glob.glob(os.path.join(root, ".dylibs", "libscipy_openblas*"))
    )
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name, integer in _SYMBOLS:
            fn = getattr(lib, name, None)
            if fn is None:
                continue
            c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
            fn.restype = None
            fn.argtypes = [c_int, c_int, c_int, integer, integer, integer, c_float]
            fn.argtypes += [ptr, integer, ptr, integer, c_float, ptr, integer]
            address = ctypes.cast(fn, ctypes.c_void_p).value or 0
            return fn, address if integer is ctypes.c_int64 else 0
    return None, 0


_FOUND = _load()
SGEMM: Callable[..., Any] | None = _FOUND[0]
"""numpy's ``cblas_sgemm`` (None: not found; use the numpy paths)."""
ADDRESS: int = _FOUND[1]
"""The address of :data:`SGEMM` where it takes 64-bit integers (numpy's wheels), for compiled
callers (:meth:`backends.handoff.Helpers.conv`); 0 otherwise."""


def available() -> bool:
    """True when :func:`conv_taps` can run (numpy's BLAS was found)."""
    return SGEMM is not None


def conv_taps(
    out: np.ndarray, taps: np.ndarray, src: np.ndarray, start: int, dilation: int
) -> None:
    """``out += sum_k taps[k] @ src[:, start + dilation * k :][:, :n]`` with ``n = out.shape[1]``.

    ``taps [K, C_out, C_in]`` contiguous, ``src [C_in, *]`` and ``out [C_out, n]``
    float32 with unit column stride (any row stride), ``out`` not overlapping
    ``src`` or ``taps``. One SGEMM per tap, each adding into ``out``.
    """
    _check(out, taps, src, start, dilation)
    if out.shape[1] and out.shape[0]:
        _gemms(out, taps, src, start, dilation, 0, out.shape[0])


def conv_rows(
    out: np.ndarray,
    taps: np.ndarray,
    src: np.ndarray,
    start: int,
    dilation: int,
    parts: np.ndarray,
    lanes: int,
) -> None:
    """:func:`conv_taps` as pieces of output rows, ``parts`` [pieces, 2] int64 (first row, end
    row; together every row once), on up to ``lanes`` cores.

    A piece is its rows' SGEMMs, one a tap in tap order, whichever thread runs it, so the
    result is the same bits on one core or several. With more than one lane they go to
    :data:`backends.handoff.HELPERS` (a hand-over of about a microsecond: products of a
    sentence's phonemes, a few hundred microseconds each, are too short for a thread
    pool); the caller holds the BLAS at one thread (:func:`backends.parallel.one_thread`).
    Otherwise, or when the helpers are busy, the pieces run one after another here.
    """
    _check(out, taps, src, start, dilation)
    _check_parts(parts, out.shape[0])
    n = out.shape[1]
    if n == 0 or out.shape[0] == 0:
        return
    if lanes > 1 and ADDRESS and handoff.usable(lanes):
        flat_src, lds = kernels.flat_rows(src, writeable=False)
        flat_out, ldo = kernels.flat_rows(out, writeable=True)
        if handoff.HELPERS.conv(
            taps, flat_src, lds, start, dilation, flat_out, ldo, n, parts, lanes, ADDRESS
        ):
            return
    for r0, r1 in parts.tolist():
        _gemms(out, taps, src, start, dilation, r0, r1)


def _check_parts(parts: np.ndarray, rows: int) -> None:
    """Refuses ``parts`` that are not int64 [pieces, 2] ranges covering ``0:rows`` in order,
    each row once (ValueError)."""
    if parts.dtype != np.int64 or parts.ndim != 2 or parts.shape[1] != 2:
        raise ValueError("conv_rows: parts must be int64 [pieces, 2]")
    at = 0
    for r0, r1 in parts.tolist():
        if r0 != at or r1 <= r0:
            break
        at = r1
    else:
        if at == rows:
            return
    raise ValueError(f"conv_rows: parts must cover the {rows} output rows in order, each once")


def one_row(out: np.ndarray, taps: np.ndarray, src: np.ndarray, start: int, dilation: int) -> None:
    """:func:`conv_taps` for a conv with one output channel (``taps [K, 1, C_in]``, ``out
    [1, n]``) as one compiled pass (:func:`backends.kernels.one_row_conv`: one-row SGEMMs
    ran at a sixth of the other convs' rate); the same checks."""
    _check(out, taps, src, start, dilation)
    if taps.shape[1] != 1:
        raise ValueError("one_row: a conv with one output channel")
    flat, ld = kernels.flat_rows(src, writeable=False)
    kernels.one_row_conv(taps[:, 0, :], flat, ld, start, dilation, out[0])


def _check(out: np.ndarray, taps: np.ndarray, src: np.ndarray, start: int, dilation: int) -> None:
    """Refuses operands :func:`conv_taps` cannot take (ValueError; RuntimeError without BLAS)."""
    if SGEMM is None:
        raise RuntimeError("conv_taps: numpy's BLAS was not found")
    k, c_out, c_in = taps.shape
    n = out.shape[1]
    if (
        taps.dtype != np.float32
        or src.dtype != np.float32
        or out.dtype != np.float32
        or not taps.flags.c_contiguous
        or src.ndim != 2
        or out.ndim != 2
        or src.shape[0] != c_in
        or out.shape[0] != c_out
        or src.strides[1] != 4
        or out.strides[1] != 4
        or src.strides[0] < 0
        or out.strides[0] < 0
    ):
        raise ValueError("conv_taps: operands of the wrong dtype, shape or layout")
    if (c_in > 1 and src.strides[0] < 4 * src.shape[1]) or (c_out > 1 and out.strides[0] < 4 * n):
        raise ValueError("conv_taps: rows overlap")
    if start < 0 or dilation < 1 or start + dilation * (k - 1) + n > src.shape[1]:
        raise ValueError("conv_taps: the taps' windows run outside the source")
    if n and c_out and (np.may_share_memory(out, src) or np.may_share_memory(out, taps)):
        raise ValueError("conv_taps: the output overlaps an input")


def _gemms(
    out: np.ndarray, taps: np.ndarray, src: np.ndarray, start: int, dilation: int, r0: int, r1: int
) -> None:
    """Rows ``r0:r1`` of a checked :func:`conv_taps`: one SGEMM a tap, in tap order."""
    sgemm = SGEMM
    assert sgemm is not None
    k, c_out, c_in = taps.shape
    n = out.shape[1]
    # a one-row operand's row stride is arbitrary; BLAS wants it at least a row long
    lds = src.strides[0] // 4 if c_in > 1 else src.shape[1]
    ldo = out.strides[0] // 4 if c_out > 1 else n
    p_src = src.ctypes.data + 4 * start
    p_taps, p_out = taps.ctypes.data + 4 * r0 * c_in, out.ctypes.data + 4 * r0 * ldo
    step = 4 * c_out * c_in
    for j in range(k):
        sgemm(
            _ROW_MAJOR, _NO_TRANS, _NO_TRANS, r1 - r0, n, c_in, 1.0,
            p_taps + j * step, c_in, p_src + 4 * dilation * j, lds, 1.0, p_out, ldo,
        )  # fmt: skip
