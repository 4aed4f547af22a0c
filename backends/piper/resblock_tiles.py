"""A HiFi-GAN stage's ResBlock2 tiles as one compiled loop: the whole stage without the GIL.

:func:`backends.piper.host.resblocks` runs a stage tile by tile: per tile and block an
activation, a bias and residual add, one SGEMM a tap (30 a tile on Piper's voices),
zeroing, a leaky ReLU and the scaling, each a numpy call or a ``ctypes`` call of the
BLAS from Python. Every one of them takes and gives back the GIL, and the ``ctypes``
calls convert 14 arguments each while holding it. Alone that costs a little; with two
requests on two slots in one process it costs more than its share: each hand-over of
the GIL between the two threads waits on the other (a short request's few thousand
such calls made a wave of eight Piper requests on two slots take 1.06-1.13 times what
the same split over two processes took, ``docs/performance.md``).

Here the same steps run in one numba function (``nogil``) per lane: the tiles are
claimed from a shared counter with an atomic add (so a lane that joins late takes
fewer, as :func:`backends.piper.host.split`'s queue does), the elementwise steps are
loops over rows, and every tap's product is the BLAS's ``cblas_sgemm`` called by its
address (:data:`backends.intrinsics.sgemm`), with the very operands, in the very order,
of the Python path: the results are the same bits (``tests/models/test_piper_resblock_tiles.py``).

Only for what that path does with per-tap GEMMs: every conv of the stage square
(``C`` to ``C`` channels), none with Winograd's filters or row pieces
(:func:`pack` returns None otherwise, and where numpy's BLAS takes 32-bit integers or
was not found), and the caller checks every operand before the compiled loop runs
(:func:`run`): it has no bounds checks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from numba.core import types

from backends import kernels
from backends.intrinsics import add as _atomic_add
from backends.intrinsics import sgemm as _sgemm
from backends.piper import blas
from backends.piper.conv_weights import ConvWeights

_ZERO, _ONE = np.float32(0.0), np.float32(1.0)


@attrs.frozen(eq=False)
class Packed:
    """A stage's ResBlock2 pairs as the compiled loop's operands (built once per model).

    ``taps`` holds every conv's ``[K, C, C]`` taps end to end (block ``j``'s first conv,
    then its second); ``meta [blocks, 6]`` each block's (offset, taps, dilation) of its
    first conv, then of its second; ``bias1 [blocks, C]`` the first convs' biases;
    ``bias2 [C]`` the second convs' biases summed in block order (what the Python path
    adds to the output tile first)."""

    taps: np.ndarray
    meta: np.ndarray
    bias1: np.ndarray
    bias2: np.ndarray
    channels: int
    halo: int
    """Columns of input a tile reads on each side beyond its own."""
    inner_halo: int
    """Columns of a block's inner output (``y``) computed on each side beyond the tile."""


def pack(blocks: Sequence[tuple[ConvWeights, ConvWeights]]) -> Packed | None:
    """``blocks`` packed for :func:`run`, or None where the compiled loop does not apply (see
    the module doc): then :func:`backends.piper.host.resblocks` keeps its Python path."""
    if not blocks or not blas.ADDRESS:
        return None
    c = blocks[0][0].c_out
    convs = [cw for pair in blocks for cw in pair]
    if c < 2 or any(
        cw.taps.shape[1:] != (c, c)
        or cw.kernel % 2 == 0  # "same" padding of an even kernel: refused by blas.conv_taps
        or cw.winograd is not None
        or cw.rows is not None
        for cw in convs
    ):
        return None
    meta = np.zeros((len(blocks), 6), np.int64)
    at = 0
    for j, (cw1, cw2) in enumerate(blocks):
        for m, cw in enumerate((cw1, cw2)):
            meta[j, 3 * m : 3 * m + 3] = (at, cw.kernel, cw.dilation)
            at += cw.taps.size
    taps = np.concatenate([cw.taps.reshape(-1) for cw in convs]).astype(np.float32)
    bias1 = np.stack([cw1.bias.reshape(-1) for cw1, _ in blocks]).astype(np.float32)
    bias2 = sum((cw2.bias for _, cw2 in blocks), np.zeros((c, 1), np.float32)).reshape(-1)
    for a in (taps, meta, bias1, bias2):
        a.setflags(write=False)
    return Packed(
        taps=taps,
        meta=meta,
        bias1=np.ascontiguousarray(bias1),
        bias2=np.ascontiguousarray(bias2, np.float32),
        channels=c,
        halo=max(cw1.padding + cw2.padding for cw1, cw2 in blocks),
        inner_halo=max(cw2.padding for _, cw2 in blocks),
    )


def share_taps(
    packed: Packed, blocks: Sequence[tuple[ConvWeights, ConvWeights]]
) -> list[tuple[ConvWeights, ConvWeights]]:
    """``blocks`` (those :func:`pack` packed) with their taps as views of ``packed.taps``, so a
    model holds one copy of them (the Python paths read the same numbers)."""
    shared = []
    for j, (cw1, cw2) in enumerate(blocks):
        a1, a2 = int(packed.meta[j, 0]), int(packed.meta[j, 3])
        shared.append(
            (
                attrs.evolve(
                    cw1, taps=packed.taps[a1 : a1 + cw1.taps.size].reshape(cw1.taps.shape)
                ),
                attrs.evolve(
                    cw2, taps=packed.taps[a2 : a2 + cw2.taps.size].reshape(cw2.taps.shape)
                ),
            )
        )
    return shared


def scratch(packed: Packed, tile: int, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One lane's buffers for :func:`run`: ``leaky(x)`` over a tile and its halo, a block's
    inner output and its activation over a tile and the inner halo."""
    c, width = packed.channels, min(tile, t)
    xa = np.empty((c, width + 2 * packed.halo), np.float32)
    y = np.empty((c, width + 2 * packed.inner_halo), np.float32)
    return xa, y, np.empty_like(y)


def run(
    x: np.ndarray,
    packed: Packed,
    out: np.ndarray,
    slope: float,
    post_slope: float,
    gaps: np.ndarray,
    tile: int,
    counter: np.ndarray,
    buffers: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> int:
    """The stage's output tiles claimed from ``counter`` (int64 [1], shared by the lanes: the
    next tile's index) until none is left; returns how many this call ran. ``x`` and
    ``out [C, T]`` C-contiguous float32, not overlapping; ``gaps`` int64 [g, 2] column
    ranges inside ``[0, T)`` (zeroed in ``x`` by the caller); ``buffers`` from
    :func:`scratch` for this ``tile`` (ValueError for anything else)."""
    c, t = x.shape
    xa, y, ya = buffers
    if (
        c != packed.channels
        or out.shape != x.shape
        or tile < 1
        or not all(_c_float32(a) for a in (x, out, xa, y, ya))
        or xa.shape != (c, min(tile, t) + 2 * packed.halo)
        or y.shape != (c, min(tile, t) + 2 * packed.inner_halo)
        or ya.shape != y.shape
        or not counter_and_gaps_fit(counter, gaps, t)
    ):
        raise ValueError("resblock_tiles.run: operands of the wrong shape, dtype or layout")
    if any(np.may_share_memory(a, b) for a, b in itertools.combinations((x, out, *buffers), 2)):
        raise ValueError("resblock_tiles.run: out or a buffer overlaps an input")
    scale = np.float32(1.0 / packed.meta.shape[0])
    return int(
        _tiles(
            x, out, packed.taps, packed.meta, packed.bias1, packed.bias2,
            np.float32(slope), np.float32(post_slope), scale, gaps, tile, counter,
            xa, y, ya, blas.ADDRESS,
        )
    )  # fmt: skip


def counter_and_gaps_fit(counter: np.ndarray, gaps: np.ndarray, t: int) -> bool:
    """Whether ``counter`` is an int64 [1] tile counter not below 0 and ``gaps`` int64 [g, 2]
    column ranges inside ``[0, t)`` (what the compiled loops here take without checks: a
    negative index would put a tile before the output). A counter already past the last
    tile is a lane that came late: it runs nothing (a stage starts from a zero counter)."""
    return (
        counter.dtype == np.int64
        and counter.shape == (1,)
        and int(counter[0]) >= 0
        and gaps_fit(gaps, t)
    )


def gaps_fit(gaps: np.ndarray, t: int) -> bool:
    """Whether ``gaps`` are int64 [g, 2] column ranges inside ``[0, t)``."""
    return (
        gaps.dtype == np.int64
        and gaps.ndim == 2
        and gaps.shape[1] == 2
        and all(0 <= g0 <= g1 <= t for g0, g1 in gaps.tolist())
    )


def _c_float32(a: np.ndarray) -> bool:
    return a.dtype == np.float32 and a.ndim == 2 and bool(a.flags.c_contiguous)


@kernels.compiled
def leaky_row(src: Any, dst: Any, slope: Any) -> None:  # pragma: no cover - compiled
    """``dst = leaky(src)`` for two rows of one length (:func:`kernels.leaky_rows`' formula)."""
    for i in range(src.shape[0]):
        v = src[i]
        dst[i] = v if v > _ZERO else v * slope


@kernels.compiled
def add_row(src: Any, value: Any, dst: Any) -> None:  # pragma: no cover - compiled
    """``dst = src + value`` for two rows of one length."""
    for i in range(src.shape[0]):
        dst[i] = src[i] + value


@kernels.compiled
def accumulate_row(src: Any, dst: Any) -> None:  # pragma: no cover - compiled
    """``dst += src`` for two rows of one length."""
    for i in range(src.shape[0]):
        dst[i] += src[i]


@kernels.compiled
def scale_leaky_row(row: Any, scale: Any, slope: Any) -> None:  # pragma: no cover - compiled
    """``row = leaky(row * scale)`` in place (:func:`kernels.leaky_rows_in_place`' formula
    after numpy's ``row *= scale``). Each of these row loops runs from 0 over a row slice:
    LLVM left the same loop over an offset range of a whole row scalar (8x slower)."""
    for i in range(row.shape[0]):
        v = row[i] * scale
        row[i] = v * (_ONE if v > _ZERO else slope)


@kernels.compiled
def _activate(x: Any, lo: Any, slope: Any, dst: Any, w: Any) -> None:  # pragma: no cover
    """``dst[:, :w] = leaky(x)[:, lo : lo + w]``, zero outside ``x``'s columns
    (:func:`backends.piper.host._activate`)."""
    t = x.shape[1]
    a0, a1 = max(0, -lo), min(w, t - lo)
    if a1 <= a0:
        a0 = a1 = 0
    for r in range(x.shape[0]):
        row = dst[r]
        for i in range(a0):
            row[i] = _ZERO
        if a1 > a0:
            leaky_row(x[r, lo + a0 : lo + a1], row[a0:a1], slope)
        for i in range(max(a1, a0), w):
            row[i] = _ZERO


@kernels.compiled
def zero_outside(y: Any, w: Any, lo: Any, t: Any, gaps: Any) -> None:  # pragma: no cover
    """Zero ``y``'s first ``w`` columns (global columns ``lo`` on) outside ``[0, t)`` and in
    ``gaps`` (:func:`backends.piper.host.zero_outside`)."""
    for r in range(y.shape[0]):
        row = y[r]
        if lo < 0:
            for i in range(min(-lo, w)):
                row[i] = _ZERO
        if lo + w > t:
            for i in range(max(t - lo, 0), w):
                row[i] = _ZERO
        for g in range(gaps.shape[0]):
            g0, g1 = gaps[g, 0], gaps[g, 1]
            if g0 < lo + w and g1 > lo:
                for i in range(max(g0, lo) - lo, min(g1, lo + w) - lo):
                    row[i] = _ZERO


@kernels.compiled
def _taps(
    sgemm: Any,
    taps: Any,
    offset: Any,
    k: Any,
    dilation: Any,
    src: Any,
    start: Any,
    dst: Any,
    col: Any,
    n: Any,
) -> None:  # pragma: no cover - compiled
    """``dst[:, col : col + n] += sum_j taps[j] @ src[:, start + dilation j :][:, :n]``, one
    SGEMM a tap in tap order (:func:`backends.piper.blas.conv_taps`' calls)."""
    c = dst.shape[0]
    lds, ldd = src.shape[1], dst.shape[1]
    p_taps, p_src = np.int64(taps.ctypes.data), np.int64(src.ctypes.data)
    p_dst = np.int64(dst.ctypes.data) + 4 * col
    for j in range(k):
        a = p_taps + 4 * (offset + j * c * c)
        b = p_src + 4 * (start + dilation * j)
        _sgemm(sgemm, c, n, c, a, c, b, lds, p_dst, ldd)


_IN1, _IN2 = kernels.array_type(1, readonly=True), kernels.array_type(2, readonly=True)
_OUT2 = kernels.array_type(2)
_I64_2 = kernels.array_type(2, types.int64, readonly=True)
_COUNTER = kernels.array_type(1, types.int64)
_F32, _I64 = types.float32, types.int64
_SIGNATURE = types.int64(
    _IN2, _OUT2, _IN1, _I64_2, _IN2, _IN1, _F32, _F32, _F32, _I64_2, _I64, _COUNTER,
    _OUT2, _OUT2, _OUT2, _I64,
)  # fmt: skip


@kernels.kernel(_SIGNATURE)
def _tiles(
    x: Any,
    out: Any,
    taps: Any,
    meta: Any,
    bias1: Any,
    bias2: Any,
    slope: Any,
    post: Any,
    scale: Any,
    gaps: Any,
    tile: Any,
    counter: Any,
    xa: Any,
    y: Any,
    ya: Any,
    sgemm: Any,
) -> Any:  # pragma: no cover - compiled
    """:func:`run`'s loop: the steps of :func:`backends.piper.host._resblock_tiles`, in order."""
    c, t = x.shape
    halo = (xa.shape[1] - min(tile, t)) // 2
    tiles = (t - 1) // tile + 1  # t >= 1; no overflow for any tile
    done = 0
    while True:
        i = _atomic_add(np.int64(counter.ctypes.data), 1)
        if i >= tiles:
            return done
        t0 = i * tile
        n = min(tile, t - t0)
        _activate(x, t0 - halo, slope, xa, n + 2 * halo)
        for j in range(meta.shape[0]):
            o1, k1, d1 = meta[j, 0], meta[j, 1], meta[j, 2]
            o2, k2, d2 = meta[j, 3], meta[j, 4], meta[j, 5]
            p1, p2 = d1 * (k1 - 1) // 2, d2 * (k2 - 1) // 2
            e0, e1 = t0 - p2, t0 + n + p2  # y's columns, [e0, e1)
            v0, v1 = max(e0, 0), min(e1, t)  # those inside [0, T)
            for r in range(c):
                add_row(x[r, v0:v1], bias1[j, r], y[r, v0 - e0 : v1 - e0])
            _taps(sgemm, taps, o1, k1, d1, xa, v0 - p1 - (t0 - halo), y, v0 - e0, v1 - v0)
            zero_outside(y, e1 - e0, e0, t, gaps)
            for r in range(c):
                if j == 0:
                    add_row(y[r, p2 : p2 + n], bias2[r], out[r, t0 : t0 + n])
                else:
                    accumulate_row(y[r, p2 : p2 + n], out[r, t0 : t0 + n])
                leaky_row(y[r, : e1 - e0], ya[r, : e1 - e0], slope)
            _taps(sgemm, taps, o2, k2, d2, ya, 0, out, t0, n)
        for r in range(c):
            scale_leaky_row(out[r, t0 : t0 + n], scale, post)
        done += 1
