"""Fused float32 loops of the numpy backend, compiled by numba: one pass where numpy needs several.

numpy runs an elementwise formula as one pass over memory per operation, each
allocating or overwriting a temporary: a softmax row is a max, a subtraction,
an ``exp`` and a sum, four passes, and numpy's float32 ``exp`` runs at 0.3-0.6
billion elements a second on the 2-core AMD EPYC this project is measured on
(about 45% of Whisper's encoder attention outside its two products). These
kernels do each formula in one loop that LLVM vectorizes, on the caller's
thread with the GIL released (``nogil``), so the pieces of a split
(:mod:`backends.parallel`) run them on their cores at once.

What they compute, and how it compares with numpy's:

* :func:`softmax_rows` (rows of a score map, in place, and their sums): ``exp``
  as a degree-7 polynomial after a Cody-Waite reduction (Cephes' ``expf``),
  within about 1e-7 relative of the exact exp of the same float32 argument
  (2.5e-7 of numpy's ``exp``); a NaN score makes its row NaN, as in numpy;
  the row max and the row sum in eight interleaved accumulators combined in a
  fixed order, so a row's sum has the same bits on every x86-64 CPU and at any
  thread count (not numpy's pairwise order: the sums differ from numpy's in the
  last bits).
* :func:`gelu` (exact GELU): the very operations of :func:`backends.erf.gelu`,
  in the same order, in float32 with no contraction into fused multiply-adds,
  so its values equal numpy's bit for bit.
* :func:`layer_norm` (rows with gamma and beta): the formula's operations in
  order, the mean's and variance's sums in the softmax sums' fixed order.
* :func:`query_attention` (one query a head, a decoding step's cross-attention):
  the scores, the softmax and the value product in one pass over each head's
  keys and values, every sum in a fixed order.
* :func:`panel_product` (a few rows times a weight packed in panels, the products of a
  decoding step: :mod:`backends.panels`): each output is its bias plus the terms in
  ascending order, one multiply and one add each (no fused multiply-add), so a row's
  values are the same bits whatever rows share its call and whichever panels a core
  takes.
* :func:`leaky_rows` and :func:`leaky_rows_in_place` (Piper's leaky ReLU over a strided
  tile, :func:`flat_rows`): numpy's ``maximum(x, slope * x)`` bit for bit for
  ``0 <= slope <= 1``, but +inf at slope 0 (inf here; NaN in numpy, ``0 * inf``).
* :func:`gate_rows` (WaveNet's ``tanh(a) * sigmoid(b)``, Piper's flow): the exps as the
  softmax's, within about 2.4e-7 (absolute) of numpy's ``tanh`` formulas; NaN stays NaN.

The kernels are compiled when this module is first imported (4-6 s) and cached in a
folder named after the package's sources (:mod:`backends.kernel_cache`: numba alone
would check a kernel against its own file only, not the helpers it compiles in), so
later imports load them (about 0.1-0.5 s, beside numba's own import, about 0.5 s). Only
numpy paths use them (the numpy backend, and Whisper's decoder on numpy); the OpenCL
and CUDA backends have kernels of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.core import config as _numba_config
from numba.extending import intrinsic
from numba.np.numpy_support import carray
from numpy.lib.stride_tricks import as_strided

from backends import erf, kernel_cache
from backends.erf import ERF_ALPHA, ERF_BETA
from backends.intrinsics import HALVES, widen

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS: dict[str, Any] = {
    "nogil": True,
    "cache": kernel_cache.CACHE_DIR is not None,  # a folder per source tree, see there
    "boundscheck": False,
    "error_model": "numpy",  # no division check in the loops (it keeps them from vectorizing)
}

# Cephes expf: exp(x) = 2**k * exp(r), k = round(x / ln 2), r = x - k ln 2 (two parts)
_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_P = tuple(
    np.float32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
)
_EXP_LOW = np.float32(-87.0)
"""Below this ``exp`` is taken as 0 (it is under 1.7e-38: float32's normal range ends there)."""

_P0, _P1, _P2, _P3, _P4, _P5 = _EXP_P
_A0, _A1, _A2, _A3, _A4, _A5, _A6 = ERF_ALPHA
_B0, _B1, _B2, _B3, _B4 = ERF_BETA
_SQRT2 = np.float32(math.sqrt(2.0))
_HALF, _ONE, _FOUR = np.float32(0.5), np.float32(1.0), np.float32(4.0)
_ZERO, _TWO = np.float32(0.0), np.float32(2.0)


def compiled(function: F) -> F:
    """``function`` for numba to compile with this module's options where a kernel calls it."""
    with kernel_cache.cache_dir(_NUMBA):
        return cast(F, njit(**_OPTIONS)(function))


def array_type(ndim: int, dtype: Any = types.float32, readonly: bool = False) -> Any:
    """The numba type of a C-contiguous array (float32 unless ``dtype``; a writable array
    converts to a readonly one)."""
    return types.Array(dtype, ndim, "C", readonly=readonly)


_IN1, _IN2, _IN3 = (array_type(n, readonly=True) for n in (1, 2, 3))
_OUT1, _OUT2 = array_type(1), array_type(2)


_NUMBA: Any = _numba_config
"""numba's settings, read by its compiler when it compiles (not typed: set by name)."""


def kernel(signature: Any, slp: bool = False) -> Callable[[F], F]:
    """A kernel compiled for ``signature`` (or each of a list) when this module is imported
    (or loaded from the cache): never in a request, and other argument types are refused
    (TypeError) rather than compiled. ``slp``: with LLVM's SLP vectorizer (off in numba by
    default), which turns the fully unrolled lanes of :func:`_one_row` into vector
    operations; it is on only while this kernel (and the helpers it calls, compiled with
    it) is compiled."""

    def compile_now(function: F) -> F:
        before = _NUMBA.SLP_VECTORIZE
        _NUMBA.SLP_VECTORIZE = int(slp or before)
        try:
            with kernel_cache.cache_dir(_NUMBA):
                return cast(F, njit(signature, **_OPTIONS)(function))
        finally:
            _NUMBA.SLP_VECTORIZE = before

    return compile_now


def _float_bits_typing(typingctx: Any, bits: Any) -> Any:
    signature = types.float32(types.int32)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return signature, codegen


float_bits = cast(Callable[[Any], Any], intrinsic(_float_bits_typing))
"""The float32 whose bit pattern is an int32 (a bitcast: no conversion)."""


def _stack_floats_typing(typingctx: Any, size: Any) -> Any:
    if not isinstance(size, types.IntegerLiteral):
        return None  # numba retries with the literal

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        element = context.get_value_type(types.float32)
        alloca: Any = cgutils.alloca_once
        return alloca(builder, element, size=size.literal_value)

    pointer: Any = types.CPointer
    return pointer(types.float32)(size), codegen


_stack_floats = cast(Callable[[Any], Any], intrinsic(_stack_floats_typing))
"""A pointer to ``size`` float32 on the stack (``size`` a constant): scratch that LLVM keeps
in vector registers where every index into it is a constant once loops are unrolled (an
array numba allocates lives on the heap, and its loads and stores stay in the loop)."""

PANEL = 16
"""Output columns a panel of a packed weight holds (:func:`panel_product`): two AVX vectors."""


@compiled
def _exp_le0(x: Any) -> Any:  # pragma: no cover - compiled
    """``exp(x)`` for ``x <= 0`` (a softmax's shifted scores); 0 below :data:`_EXP_LOW`, NaN for
    NaN (as numpy's softmax: one NaN score makes its row NaN, wherever it sits)."""
    c = x if x > _EXP_LOW else _EXP_LOW
    k = np.floor(c * _LOG2E + _HALF)
    r = c - k * _LN2_HI - k * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    p = p * r * r + r + _ONE
    e = p * float_bits(np.int32((np.int32(k) + 127) << 23))
    if x >= _EXP_LOW:
        return e
    return x if x != x else np.float32(0.0)  # NaN stays NaN (and spreads through the sum)


@compiled
def _row_max(row: Any) -> Any:  # pragma: no cover - compiled
    """The largest element of a float32 row (eight interleaved maxima, then those)."""
    n = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
    end = n - n % 8
    for j in range(0, end, 8):
        m0 = row[j] if row[j] > m0 else m0
        m1 = row[j + 1] if row[j + 1] > m1 else m1
        m2 = row[j + 2] if row[j + 2] > m2 else m2
        m3 = row[j + 3] if row[j + 3] > m3 else m3
        m4 = row[j + 4] if row[j + 4] > m4 else m4
        m5 = row[j + 5] if row[j + 5] > m5 else m5
        m6 = row[j + 6] if row[j + 6] > m6 else m6
        m7 = row[j + 7] if row[j + 7] > m7 else m7
    for j in range(end, n):
        m0 = row[j] if row[j] > m0 else m0
    a = m0 if m0 > m1 else m1
    b = m2 if m2 > m3 else m3
    c = m4 if m4 > m5 else m5
    d = m6 if m6 > m7 else m7
    a = a if a > b else b
    c = c if c > d else d
    return a if a > c else c


@compiled
def _exp_row(row: Any, top: Any) -> None:  # pragma: no cover - compiled
    """``row = exp(row - top)`` in place."""
    for j in range(row.shape[0]):
        row[j] = _exp_le0(row[j] - top)


@compiled
def _row_sum(row: Any) -> Any:  # pragma: no cover - compiled
    """The sum of a float32 row: eight interleaved partial sums, then those in a fixed order."""
    n = row.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
    end = n - n % 8
    for j in range(0, end, 8):
        s0 += row[j]
        s1 += row[j + 1]
        s2 += row[j + 2]
        s3 += row[j + 3]
        s4 += row[j + 4]
        s5 += row[j + 5]
        s6 += row[j + 6]
        s7 += row[j + 7]
    for j in range(end, n):
        s0 += row[j]
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@compiled
def _exp_shifted(row: Any) -> Any:  # pragma: no cover - compiled
    """``row = exp(row - max(row))`` in place; returns the new row's sum (a softmax's divisor):
    the one place the kernels' softmax is computed."""
    _exp_row(row, _row_max(row))
    return _row_sum(row)


@kernel(types.void(_OUT2, _OUT2))
def softmax_rows(scores: Any, sums: Any) -> None:  # pragma: no cover - compiled
    """Each row of the float32 ``scores`` [n, m] becomes ``exp(row - max(row))``, in place;
    ``sums`` [n, 1] gets each new row's sum (the softmax's divisor, left to the caller)."""
    if sums.shape[0] != scores.shape[0] or sums.shape[1] != 1:
        raise ValueError("softmax_rows: sums must be [rows, 1]")
    if scores.shape[1] == 0:
        raise ValueError("softmax_rows: rows must not be empty")
    for i in range(scores.shape[0]):
        sums[i, 0] = _exp_shifted(scores[i])


@kernel(types.void(_IN1, _OUT1))
def gelu(x: Any, out: Any) -> None:  # pragma: no cover - compiled
    """``out = gelu(x)`` over float32 vectors: :func:`backends.erf.gelu`'s operations, in order."""
    if out.shape[0] != x.shape[0]:
        raise ValueError("gelu: out must have the length of x")
    for j in range(x.shape[0]):
        v = x[j]
        t = v / _SQRT2
        t = t if t > -_FOUR else -_FOUR
        t = t if t < _FOUR else _FOUR
        t2 = t * t
        p = t2 * _A0
        p = (p + _A1) * t2
        p = (p + _A2) * t2
        p = (p + _A3) * t2
        p = (p + _A4) * t2
        p = (p + _A5) * t2
        p = p + _A6
        q = t2 * _B0
        q = (q + _B1) * t2
        q = (q + _B2) * t2
        q = (q + _B3) * t2
        q = q + _B4
        e = (p * t) / q
        out[j] = _HALF * v * (_ONE + e)


@kernel(types.void(_IN2, _IN1, _IN1, types.float32, _OUT2))
def layer_norm(x: Any, gamma: Any, beta: Any, eps: Any, out: Any) -> None:  # pragma: no cover
    """``out = (x - mean) / sqrt(var + eps) * gamma + beta`` over each row of ``x`` [n, d]
    (mean and biased variance over the row, their sums as :func:`_row_sum`'s)."""
    d = x.shape[1]
    if gamma.shape[0] != d or beta.shape[0] != d or out.shape[0] != x.shape[0] or out.shape[1] != d:
        raise ValueError("layer_norm: gamma and beta must have a row's length, out x's shape")
    size = np.float32(d)
    squares = np.empty(d, np.float32)
    for i in range(x.shape[0]):
        row, dst = x[i], out[i]
        mean = _row_sum(row) / size
        for j in range(d):
            dst[j] = row[j] - mean
            squares[j] = dst[j] * dst[j]
        std = np.sqrt(_row_sum(squares) / size + eps)
        for j in range(d):
            dst[j] = dst[j] / std * gamma[j] + beta[j]


@compiled
def attend_head(
    q: Any, kt: Any, v: Any, scale: Any, scores: Any, out: Any, p: Any
) -> None:  # pragma: no cover - compiled
    """:func:`query_attention` for one head: ``q [D]``, ``kt [D, T]``, ``v [T, D]``, the scaled
    scores ``[T]`` and the context ``out [D]``; ``p [T]`` is scratch. Unchecked: the caller
    checked the shapes."""
    keys, dim = v.shape
    scores[:] = 0.0
    for d in range(dim):
        qd = q[d]
        k_row = kt[d]
        for t in range(keys):
            scores[t] += qd * k_row[t]
    for t in range(keys):
        scores[t] *= scale
        p[t] = scores[t]
    total = _exp_shifted(p)
    out[:] = 0.0
    for t in range(keys):
        pt = p[t]
        v_row = v[t]
        for d in range(dim):
            out[d] += pt * v_row[d]
    for d in range(dim):
        out[d] /= total


@kernel(types.void(_IN2, _IN3, _IN3, types.float32, _OUT2, _OUT2))
def query_attention(
    q: Any, kt: Any, v: Any, scale: Any, scores: Any, out: Any
) -> None:  # pragma: no cover - compiled
    """One query per head over that head's keys and values, in one pass over each (a decoding
    step's cross-attention, memory-bound: 4.6 MB of a window's keys and values a layer):
    ``scores[h] = (q[h] @ kt[h]) * scale`` (q [H, D], kt [H, D, T]: the scores before the
    softmax, kept for alignment heads), ``out[h] = softmax(scores[h]) @ v[h]`` (v [H, T, D],
    out [H, D]; the division by the sum after the value product). Every sum runs in a
    fixed order (over D, then over T, ascending)."""
    heads, dim = q.shape
    keys = kt.shape[2]
    if (
        kt.shape[0] != heads
        or kt.shape[1] != dim
        or v.shape[0] != heads
        or v.shape[1] != keys
        or v.shape[2] != dim
        or scores.shape[0] != heads
        or scores.shape[1] != keys
        or out.shape[0] != heads
        or out.shape[1] != dim
    ):
        raise ValueError("query_attention: q [H, D], kt [H, D, T], v [H, T, D], scores [H, T]")
    if keys == 0:
        raise ValueError("query_attention: no keys")
    p = np.empty(keys, np.float32)
    for h in range(heads):
        attend_head(q[h], kt[h], v[h], scale, scores[h], out[h], p)


@compiled
def _one_row(
    x: Any, panels: Any, bias: Any, out: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """:func:`panel_product` for one row (``x [K]``, ``out [n]``): two panels at a time, so
    that four accumulators, not two, wait on the adds (the same order for each output)."""
    depth = x.shape[0]
    acc = carray(_stack_floats(32), (32,))
    tile = np.empty((2, PANEL), np.float32)
    for q in range(lo, hi, 2):
        second = min(q + 1, hi - 1)  # an odd last panel is computed twice, stored once
        a, b = panels[q], panels[second]
        start, start_b = q * PANEL, second * PANEL
        for j in range(PANEL):
            acc[j] = bias[start + j]
            acc[PANEL + j] = bias[start_b + j]
        for k in range(depth):
            wa, wb, s = a[k], b[k], x[k]
            for j in range(PANEL):
                acc[j] += s * widen(wa[j])
                acc[PANEL + j] += s * widen(wb[j])
        for j in range(PANEL):
            tile[0, j] = acc[j]
            tile[1, j] = acc[PANEL + j]
        for t in range(second - q + 1):
            base = start + t * PANEL
            for j in range(min(PANEL, out.shape[0] - base)):
                out[base + j] = tile[t, j]


@compiled
def _store(tile: Any, rows: Any, out: Any, m0: Any, start: Any) -> None:  # pragma: no cover
    """Rows ``m0`` to ``m0 + rows`` of ``out`` get ``tile``'s first rows from column
    ``start`` on (as many columns as ``out`` has left: the last panel may be partial)."""
    width = min(PANEL, out.shape[1] - start)
    for r in range(rows):
        row = out[m0 + r]
        for j in range(width):
            row[start + j] = tile[r, j]


@compiled
def panel_rows(
    x: Any, panels: Any, bias: Any, out: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """:func:`panel_product`'s loops, unchecked (the caller checked the shapes and the range);
    compiled into a kernel that calls it, with that kernel's vectorizer settings."""
    rows, depth = x.shape
    if rows == 1:
        _one_row(x[0], panels, bias, out[0], lo, hi)
        return
    acc = carray(_stack_floats(64), (64,))
    tile = np.empty((4, PANEL), np.float32)
    for q in range(lo, hi):
        panel = panels[q]
        start = q * PANEL
        for m0 in range(0, rows, 4):
            x0, x1 = x[m0], x[min(m0 + 1, rows - 1)]  # a short block repeats its last row
            x2, x3 = x[min(m0 + 2, rows - 1)], x[min(m0 + 3, rows - 1)]
            for r in range(4):
                for j in range(PANEL):
                    acc[r * PANEL + j] = bias[start + j]
            for k in range(depth):
                w = panel[k]
                s0, s1, s2, s3 = x0[k], x1[k], x2[k], x3[k]
                for j in range(PANEL):
                    wj = widen(w[j])
                    acc[j] += s0 * wj
                    acc[PANEL + j] += s1 * wj
                    acc[2 * PANEL + j] += s2 * wj
                    acc[3 * PANEL + j] += s3 * wj
            for r in range(4):
                for j in range(PANEL):
                    tile[r, j] = acc[r * PANEL + j]
            _store(tile, min(4, rows - m0), out, m0, start)


PANELS = (_IN3, array_type(3, types.uint16, readonly=True)) if HALVES else (_IN3,)
"""The panels a product takes: float32, and where halves convert by an instruction
(:data:`backends.intrinsics.HALVES`) also halves' bits (uint16)."""


@kernel([types.void(_IN2, p, _IN1, _OUT2, types.int64, types.int64) for p in PANELS], slp=True)
def panel_product(
    x: Any, panels: Any, bias: Any, out: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """``out[:, j] = bias[j] + sum_k x[:, k] * w[j, k]`` for the columns of panels ``lo`` to
    ``hi`` of a weight ``w [n, K]`` packed as ``panels [ceil(n / PANEL), K, PANEL]``
    (``panels[q, k, i] = w[q * PANEL + i, k]``, :func:`backends.panels.pack`); ``x [M, K]``,
    ``bias`` one value a panel column (``[panels * PANEL]``), ``out [M, n]``. Panels of
    halves' bits (uint16) are read as their float32 values: the same products, the same
    bits, half the bytes.

    Each output is its bias plus the terms in ascending ``k``, a multiply then an add each,
    whatever ``M`` and the range: rows go in blocks of four (the block's 8 accumulators in
    registers, each panel row loaded once for the four), a lone row two panels at a time.
    Each panel is read once a block: a step's weights, a few rows, once from memory."""
    rows, depth = x.shape
    count, cols = panels.shape[0], out.shape[1]
    if (
        panels.shape[1] != depth
        or panels.shape[2] != PANEL
        or bias.shape[0] != count * PANEL
        or out.shape[0] != rows
        or cols > count * PANEL
        or cols <= (count - 1) * PANEL
        or lo < 0
        or hi > count
    ):
        raise ValueError("panel_product: x [M, K], panels [Q, K, 16], bias [Q * 16], out [M, n]")
    panel_rows(x, panels, bias, out, lo, hi)


@compiled
def _frames_of_8(dst: Any, rows: Any, base: Any, fa: Any, fb: Any) -> None:  # pragma: no cover
    """``dst[base + 8 f + s] = rows[s, f]`` for frames ``fa`` to ``fb``: eight loads and one
    contiguous run of stores a frame (what the SLP vectorizer turns into vector stores)."""
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    r4, r5, r6, r7 = rows[4], rows[5], rows[6], rows[7]
    for f in range(fa, fb):
        o = base + f * 8
        dst[o], dst[o + 1], dst[o + 2], dst[o + 3] = r0[f], r1[f], r2[f], r3[f]
        dst[o + 4], dst[o + 5], dst[o + 6], dst[o + 7] = r4[f], r5[f], r6[f], r7[f]


@compiled
def _frames_of_4(dst: Any, rows: Any, base: Any, fa: Any, fb: Any) -> None:  # pragma: no cover
    """:func:`_frames_of_8` for four samples a frame."""
    r0, r1, r2, r3 = rows[0], rows[1], rows[2], rows[3]
    for f in range(fa, fb):
        o = base + f * 4
        dst[o], dst[o + 1], dst[o + 2], dst[o + 3] = r0[f], r1[f], r2[f], r3[f]


@kernel(types.void(_IN2, types.int64, _OUT2, types.int64, types.int64, types.int64), slp=True)
def interleave_phases(
    phases: Any, n: Any, out: Any, shift: Any, lo: Any, hi: Any
) -> None:  # pragma: no cover - compiled
    """``out[c, shift + f * u + s] = phases[c * u + s, f]`` for the ``n`` first columns ``f`` of
    ``phases [C * u, *]`` (``u = phases.shape[0] // out.shape[0]``), only where that column
    of ``out [C, *]`` is in ``[lo, hi)``: a transposed conv's phase rows (one GEMM row per
    output channel and sample within a frame) as its samples, cropped. The frames whose
    ``u`` samples are all inside go a frame at a time, contiguous stores (for ``u`` 4 and 8,
    Piper's strides: 0.64-0.76 of the time of the strided stores a phase row at a time);
    the cropped ends a phase row at a time."""
    channels = out.shape[0]
    if channels == 0:
        return
    u = phases.shape[0] // channels
    if (
        phases.shape[0] != u * channels
        or n < 0
        or n > phases.shape[1]
        or lo < 0
        or hi > out.shape[1]
    ):
        raise ValueError("interleave_phases: phases [C * u, >= n], out [C, >= hi], 0 <= lo")
    fa = max(0, -((shift - lo) // u))  # first f with shift + f u >= lo
    fb = max(fa, min(n, (hi - shift) // u))  # after the last f with shift + f u + u <= hi
    for c in range(channels):
        dst = out[c]
        rows = phases[c * u : c * u + u]
        for s in range(u):  # the cropped frames at both ends
            src = rows[s]
            f0 = max(0, -((shift + s - lo) // u))  # first f with shift + f u + s >= lo
            f1 = min(n, -((shift + s - hi) // u))  # first f with shift + f u + s >= hi
            for f in range(f0, min(f1, fa)):
                dst[shift + f * u + s] = src[f]
            for f in range(max(f0, fb), f1):
                dst[shift + f * u + s] = src[f]
        if u == 8:
            _frames_of_8(dst, rows, shift, fa, fb)
        elif u == 4:
            _frames_of_4(dst, rows, shift, fa, fb)
        else:
            for f in range(fa, fb):
                for s in range(u):
                    dst[shift + f * u + s] = rows[s, f]


def flat_rows(x: np.ndarray, writeable: bool) -> tuple[np.ndarray, int]:
    """A 2-D float32 view with unit column stride as one 1-D view over the same memory (its
    rows a row stride apart), and that row stride in elements: how the row kernels here
    take a strided tile (numba vectorizes loops over a C-contiguous row, not over a row of
    an array whose strides it learns at run time)."""
    if (
        x.dtype != np.float32
        or x.ndim != 2
        or (x.shape[1] > 1 and x.strides[1] != 4)  # one column: any column stride
        or (x.shape[0] > 1 and (x.strides[0] % 4 or x.strides[0] < 4 * x.shape[1]))
    ):
        raise ValueError("flat_rows: a float32 matrix with unit column stride and no overlap")
    ld = x.strides[0] // 4 if x.shape[0] > 1 else x.shape[1]  # one row: any stride
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
        if not writeable:
            flat = flat.view()
            flat.flags.writeable = False
        return flat, ld
    extent = (x.shape[0] - 1) * ld + x.shape[1] if x.shape[0] else 0
    return as_strided(x, (extent,), (4,), writeable=writeable), ld


_ROWS = (types.int64, types.int64)
"""A row kernel's ``rows`` and ``n`` (columns) after its flat views (:func:`flat_rows`)."""


@compiled
def rows_fit(flat: Any, ld: Any, rows: Any, n: Any) -> Any:  # pragma: no cover - compiled
    """Whether ``rows`` rows of ``n`` a row stride ``ld`` apart lie inside ``flat`` without
    overlapping (the row kernels run without bounds checks)."""
    if rows < 0 or n < 0:
        return False
    if rows == 0 or n == 0:
        return True
    return (rows == 1 or ld >= n) and (rows - 1) * ld + n <= flat.shape[0]


_CONV_BLOCK = 128
"""Outputs :func:`one_row_conv` sums at a time: eight AVX-512 registers (at 64 it ran at
0.72 of this rate, at 256 the same)."""


@kernel(types.void(_IN2, _IN1, types.int64, types.int64, types.int64, _OUT1))
def one_row_conv(
    taps: Any, src: Any, ld: Any, start: Any, dilation: Any, out: Any
) -> None:  # pragma: no cover - compiled
    """``out[i] += sum_c sum_j taps[j, c] * src[c * ld + start + j * dilation + i]``: a conv with
    one output channel (``taps [K, C_in]``) over ``C_in`` rows of a flat view ``ld`` apart,
    into ``out [n]`` (HiFi-GAN's last conv, 32 channels to one: per-tap GEMMs of one row
    ran at a sixth of the other convs' rate). Terms in ``c``, then ``j`` order, blocks of
    :data:`_CONV_BLOCK` outputs summed in registers."""
    k, c_in = taps.shape
    n = out.shape[0]
    if start < 0 or dilation < 1 or not rows_fit(src, ld, c_in, start + (k - 1) * dilation + n):
        raise ValueError("one_row_conv: C_in rows of start + (K - 1) * dilation + n must fit src")
    acc = carray(_stack_floats(_CONV_BLOCK), (_CONV_BLOCK,))
    for i0 in range(0, n, _CONV_BLOCK):
        width = min(_CONV_BLOCK, n - i0)
        for i in range(_CONV_BLOCK):
            acc[i] = _ZERO
        if width == _CONV_BLOCK:  # the same loops with a constant trip count: the block's
            # sums stay in registers (through a helper taking the width they did not: 3x slower)
            for c in range(c_in):
                for j in range(k):
                    w = taps[j, c]
                    row = src[c * ld + start + j * dilation + i0 :]
                    for i in range(_CONV_BLOCK):
                        acc[i] += w * row[i]
        else:
            for c in range(c_in):
                for j in range(k):
                    w = taps[j, c]
                    row = src[c * ld + start + j * dilation + i0 :]
                    for i in range(width):
                        acc[i] += w * row[i]
        for i in range(width):
            out[i0 + i] += acc[i]


@kernel(types.void(_IN1, types.int64, types.float32, _OUT1, types.int64, *_ROWS))
def leaky_rows(
    src: Any, lds: Any, slope: Any, out: Any, ldo: Any, rows: Any, n: Any
) -> None:  # pragma: no cover - compiled
    """``out = src if src > 0 else slope * src`` over ``rows x n`` flat views (row strides
    ``lds``, ``ldo``; not overlapping: :func:`leaky_rows_in_place` for that), in one pass
    instead of two: for ``0 <= slope <= 1`` numpy's ``maximum(src, slope * src)`` bit for
    bit (NaN stays NaN, -0.0 stays -0.0) but for +inf at slope 0 (a ReLU: inf here, NaN
    there, from ``0 * inf``)."""
    if not (rows_fit(src, lds, rows, n) and rows_fit(out, ldo, rows, n)):
        raise ValueError("leaky_rows: rows x n with their row strides must fit src and out")
    for i in range(rows):
        s = src[i * lds : i * lds + n]
        o = out[i * ldo : i * ldo + n]
        for j in range(n):
            v = s[j]
            o[j] = v if v > _ZERO else v * slope


@kernel(types.void(_OUT1, types.int64, types.float32, *_ROWS))
def leaky_rows_in_place(x: Any, ld: Any, slope: Any, rows: Any, n: Any) -> None:  # pragma: no cover
    """:func:`leaky_rows` with ``out`` = ``src`` (a loop over one array: LLVM vectorizes a
    two-array loop only where it can check they do not overlap). Written as a product
    (``v * 1`` is ``v``, bit for bit): as a choice between ``v`` and ``slope * v`` the
    store of ``v`` over itself was dropped, and the conditional store that was left kept
    the loop scalar (2.5x slower than numpy's two passes)."""
    if not rows_fit(x, ld, rows, n):
        raise ValueError("leaky_rows_in_place: rows x n with their row stride must fit x")
    for i in range(rows):
        r = x[i * ld : i * ld + n]
        for j in range(n):
            v = r[j]
            r[j] = v * (_ONE if v > _ZERO else slope)


@kernel(types.void(_OUT1, types.int64, _IN1, types.int64, *_ROWS))
def gate_rows(a: Any, lda: Any, b: Any, ldb: Any, rows: Any, n: Any) -> None:  # pragma: no cover
    """``a = tanh(a) * sigmoid(b)`` over ``rows x n`` flat views (WaveNet's gate), in one pass
    (numpy takes six): ``tanh(x) = sign(x) (1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` and
    ``sigmoid(x) = (1 or e) / (1 + e)`` with ``e = exp(-|x|)`` (1 for ``x >= 0``), the
    exps as the softmax's (:func:`_exp_le0`): within about 2.4e-7 of numpy's ``tanh``
    formulas (absolute; the results are at most 1 in magnitude); NaN stays NaN. The body
    is written out in the loop: called as a helper, it kept the loop from vectorizing."""
    if not (rows_fit(a, lda, rows, n) and rows_fit(b, ldb, rows, n)):
        raise ValueError("gate_rows: rows x n with their row strides must fit a and b")
    for i in range(rows):
        ra = a[i * lda : i * lda + n]
        rb = b[i * ldb : i * ldb + n]
        for j in range(n):
            p = ra[j]
            q = rb[j]
            ep = _exp_le0(-_TWO * abs(p))
            eq = _exp_le0(-abs(q))
            tanh = (_ONE - ep) / (_ONE + ep)
            sigmoid = _ONE / (_ONE + eq)
            sign = _ONE if p >= _ZERO else -_ONE
            top = _ONE if q >= _ZERO else eq
            ra[j] = (sign * tanh) * (top * sigmoid)


def _check_halves() -> None:
    """A product by halves' bits equals the product by their float32 values bit for bit
    (normal, subnormal and signed-zero halves): else the CPU's conversion is not what
    :func:`backends.intrinsics.widen` assumes, and loading refuses to run on it."""
    every = np.arange(1 << 16, dtype=np.uint16)
    finite = every[np.isfinite(every.view(np.float16))]
    depth = 64
    bits = finite[: (finite.size // (depth * PANEL)) * depth * PANEL].reshape(-1, depth, PANEL)
    x = np.linspace(-2.0, 2.0, 3 * depth, dtype=np.float32).reshape(3, depth)
    bias = np.zeros(bits.shape[0] * PANEL, np.float32)
    got, want = (np.empty((3, bits.shape[0] * PANEL), np.float32) for _ in range(2))
    panel_product(x, bits, bias, got, 0, bits.shape[0])
    panel_product(x, bits.view(np.float16).astype(np.float32), bias, want, 0, bits.shape[0])
    if not np.array_equal(got, want):
        raise RuntimeError("backends.kernels.panel_product: halves differ from their float32")


def _first_calls() -> None:
    """Each kernel called once on a tiny input when the module is imported: numba's first
    call of a dispatcher imports modules of its own (``numpy.ma``), which belongs to loading
    a model, not to its first request (``tests/models/test_piper_warm_up.py``). And GELU
    checked against :func:`backends.erf.gelu`: its coefficients are frozen into the compiled
    code, and numba's cache is keyed on this file only, so coefficients changed in
    ``erf.py`` would otherwise keep the cached kernel's old ones (recompiled then)."""
    probe = np.linspace(-5.0, 5.0, 41, dtype=np.float32)
    got = np.empty_like(probe)
    gelu(probe, got)
    if not np.array_equal(got, erf.gelu(np, probe)):
        gelu.recompile()  # type: ignore[attr-defined]
        gelu(probe, got)
        if not np.array_equal(got, erf.gelu(np, probe)):
            raise RuntimeError("backends.kernels.gelu differs from backends.erf.gelu")
    rows, sums = np.zeros((1, 8), np.float32), np.zeros((1, 1), np.float32)
    softmax_rows(rows, sums)
    gelu(rows[0], rows[0])
    layer_norm(rows, rows[0], rows[0], np.float32(1e-5), rows)
    keys = np.zeros((1, 8, 1), np.float32)
    query_attention(rows, keys, keys.reshape(1, 1, 8), np.float32(1), sums, np.zeros_like(rows))
    panels, bias = np.zeros((1, 8, PANEL), np.float32), np.zeros(PANEL, np.float32)
    panel_product(rows, panels, bias, np.zeros((1, PANEL), np.float32), 0, 1)
    if HALVES:
        _check_halves()
    interleave_phases(rows, 1, np.zeros((1, 8), np.float32), 0, 0, 1)
    flat, ld = flat_rows(rows, writeable=True)
    leaky_rows(flat, ld, np.float32(0.1), flat.copy(), ld, 1, 8)
    leaky_rows_in_place(flat, ld, np.float32(0.1), 1, 8)
    gate_rows(flat, ld, flat.copy(), ld, 1, 8)


_first_calls()
