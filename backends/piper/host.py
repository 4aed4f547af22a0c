"""Piper's fast paths on the numpy backend: fused, tiled convolutions over host arrays.

The HiFi-GAN decoder is about three quarters of a request, nearly all of it in
its residual blocks: ``x + conv(leaky_relu(x))`` at 32 to 128 channels over
tens of thousands of samples. The backend's generic ops run that as three
passes over memory (activation, im2col conv, residual add). Here one pass over
cache-sized time tiles does all three, plus the resblock sum and its ``1 / n``
scale. With numpy's own BLAS at hand (:mod:`backends.piper.blas`, the bundled
OpenBLAS) a conv is a sum of per-tap GEMMs that add straight into the output
tile (``beta = 1``, each tap's input a shifted view of the activation buffer):
the tile is first filled with the bias and the residual, so no im2col copy, no
product temporary and no separate add pass remain. Elsewhere a tile's column
matrix is filled from the activation and one GEMM with the bias folded in (a
row of ones) writes it, the residual added after. Tile buffers are allocated
once per call (per core) and reused for every tile.

Tiles are independent, so their runs go to the caller's share of the cores
(:func:`split`, :mod:`backends.parallel`), each with one BLAS thread: small
GEMMs (32 to 128 rows) split badly over BLAS threads, and a tile computes the
same bits on any core, so results do not depend on the share.

Values are those of the backend's ops up to float32 summation order (the
GEMM over the same rows, the same bias, the same activation); the parity tests
against onnxruntime bound them.

Only for :class:`backends.numpy_backend.NumpyBackend` (host arrays): other
backends run the generic code in :mod:`backends.piper.generator`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
import numpy as np
from numpy.lib.stride_tricks import as_strided

from backends import kernels, parallel
from backends.base import ArrayBackend
from backends.numpy_backend import NumpyBackend
from backends.piper import blas, coupling_tiles, resblock_tiles, winograd
from backends.piper.conv_weights import ConvWeights as ConvWeights  # re-exported

TILE_BYTES = 1 << 22
"""Bytes of one tile's column matrix: it, the activation tile and the output tile stay in L2."""


Gaps = Sequence[tuple[int, int]]
"""Column ranges ``[start, stop)`` between the members of a packed batch (:func:`zero_gaps`)."""


def zero_gaps(x: np.ndarray, gaps: Gaps) -> None:
    """Zero the columns of ``x`` between the members of a packed batch, in place.

    A packed batch lays its members' time axes end to end with zero columns between
    them, at least as wide as any conv's padding: a conv whose input has zero gaps
    computes every member's columns exactly as it would alone (the zeros are the
    padding it would see). Only the gap columns of a conv's output mix members;
    zeroing them before the next conv (and transposed conv) keeps them apart.
    """
    for start, stop in gaps:
        x[:, start:stop] = 0


def is_host(be: ArrayBackend) -> bool:
    """True when ``be`` computes on host numpy arrays with the CPU layers (the fast paths apply)."""
    return isinstance(be, NumpyBackend)


def prepare(
    w: np.ndarray,
    b: np.ndarray | None,
    dilation: int = 1,
    fewer_products: bool = True,
    row_pieces: bool = False,
) -> ConvWeights:
    """Conv1d weights ``[C_out, C_in, K]`` and bias as :class:`ConvWeights`, with Winograd's
    filters where :func:`winograd.prepare` takes the conv and ``fewer_products``, else, with
    ``row_pieces``, its output rows in two pieces (:func:`_row_pieces`)."""
    c_out = w.shape[0]
    bias = np.zeros(c_out, np.float32) if b is None else np.asarray(b, np.float32).reshape(-1)
    taps = np.ascontiguousarray(np.asarray(w, np.float32).transpose(2, 0, 1))
    bias2 = np.ascontiguousarray(bias.reshape(c_out, 1))
    filters = winograd.prepare(taps, dilation) if fewer_products else None
    rows = _row_pieces(c_out) if row_pieces and filters is None else None
    return ConvWeights(taps, bias2, dilation, filters, rows)


ROW_PIECE = 16
"""Output rows of a piece are a multiple of this (OpenBLAS's SGEMM kernels take rows in
blocks of 16 on AVX2: a cut inside a block would give both pieces a short edge block)."""


def _row_pieces(c_out: int) -> np.ndarray | None:
    """Two pieces of about half the rows each (a multiple of :data:`ROW_PIECE`), or None when
    there are too few rows for two. Two whatever the cores: the pieces fix the GEMMs, so
    the bits do not depend on the share (on one core they run one after the other, at
    1.00-1.08 of the whole conv's time for the text encoder's convs at 60 to 250 columns)."""
    half = ROW_PIECE * round(c_out / (2 * ROW_PIECE))
    if not 0 < half < c_out:
        return None
    parts = np.array([[0, half], [half, c_out]], np.int64)
    parts.setflags(write=False)
    return parts


USE_WINOGRAD = True
"""Run the convs that have :attr:`ConvWeights.winograd` filters through them (False: their
per-tap GEMMs; for comparisons)."""


def add_conv(out: np.ndarray, cw: ConvWeights, src: np.ndarray, start: int, lanes: int = 1) -> None:
    """``out += conv(src)`` without bias over ``out``'s ``n`` columns, the conv's window on
    ``src`` starting at column ``start`` (``n + dilation * (K - 1)`` columns): Winograd's
    products where the conv has them (:mod:`backends.piper.winograd`), else one GEMM per
    tap (:func:`blas.conv_taps`), by pieces of output rows on up to ``lanes`` cores where
    the conv has them (:attr:`ConvWeights.rows`, :func:`blas.conv_rows`). A conv with one
    output channel (HiFi-GAN's last) is one compiled pass instead (:func:`blas.one_row`)."""
    if cw.c_out == 1:
        blas.one_row(out, cw.taps, src, start, cw.dilation)
    elif cw.winograd is not None and USE_WINOGRAD:
        winograd.conv_add(out, cw.winograd, src, start)
    elif cw.rows is not None:
        blas.conv_rows(out, cw.taps, src, start, cw.dilation, cw.rows, lanes)
    else:
        blas.conv_taps(out, cw.taps, src, start, cw.dilation)


def leaky_into(src: np.ndarray, slope: float, out: np.ndarray) -> None:
    """``out = leaky_relu(src)`` for ``0 <= slope <= 1`` (``max(src, slope * src)`` bit for
    bit, but +inf at slope 0: see :func:`kernels.leaky_rows`) in one compiled pass; ``out``
    may be ``src`` itself (the same memory, shape and strides:
    :func:`kernels.leaky_rows_in_place`), or else must not share its memory range
    (``np.may_share_memory``: two disjoint views of one buffer can be refused)."""
    if src.shape != out.shape or src.ndim != 2:
        raise ValueError("leaky_into: src and out must be matrices of one shape")
    rows, n = src.shape
    if rows == 0 or n == 0:
        return
    o, ldo = kernels.flat_rows(out, writeable=True)
    if src is out or (src.ctypes.data == out.ctypes.data and src.strides == out.strides):
        kernels.leaky_rows_in_place(o, ldo, np.float32(slope), rows, n)
        return
    if np.may_share_memory(src, out):
        raise ValueError("leaky_into: out overlaps src (other than being it)")
    s, lds = kernels.flat_rows(src, writeable=False)
    kernels.leaky_rows(s, lds, np.float32(slope), o, ldo, rows, n)


TAPS_TILE = 1 << 18
"""Most elements (channels x columns) of one tile of the per-tap paths. Larger than L2
would suggest (1 MB a buffer): each tap's GEMM has only ``C_in`` (32 to 128) terms, and
longer rows amortize a call's fixed cost. Paragraph, one thread, HiFi-GAN CPU ms
(alternating): 2**15 685, 2**16 625, 2**17 581-587, 2**18 573, 2**19 571, 2**20 595."""

MIN_TILE = 256
"""Fewest columns of a per-tap tile on one core (short inputs are one tile)."""

MIN_SPLIT_TILE = 64
"""Fewest columns of a per-tap tile when the caller has several cores. The flow at 255
frames (wall ms, its convs one tile against four of 64): one thread 75 against 90; two
threads on a loaded machine, 270 (OpenBLAS's threads) against 99 (tiles on the cores)."""

SPLIT_TILES = 4
"""A conv is cut into at least this many tiles (of 256 columns at least), whatever the
share, so that two to four cores get even runs and tiles never depend on the share."""


def _tile_columns(t: int, channels: int) -> int:
    """Columns of one tile of the per-tap paths over ``t`` columns of ``channels`` rows: at
    least :data:`MIN_TILE` on one core; when the caller has several, down to
    :data:`MIN_SPLIT_TILE` so that a short wide conv (the flow's, 255 frames at 384
    channels) is split too rather than left to OpenBLAS's threads. The tiles are an even
    number of one width (:data:`EVEN_TILES`): five tiles of 8,192 columns and one of 2,816
    (a short sentence's last HiFi-GAN stage) gave one of two cores 56% of the work; six of
    7,296 take 0.97 of the time at two threads (docs/performance.md, "Session 21")."""
    floor = MIN_TILE if parallel.SHARE.share() <= 1 else MIN_SPLIT_TILE
    widest = max(floor, min(t, TAPS_TILE // channels, -(-t // SPLIT_TILES)))
    if not EVEN_TILES:
        return widest
    tiles = -(-t // widest)
    if tiles > 1 and tiles % 2:  # an even count of tiles of one width: two cores, equal runs
        tiles += 1 if _step_width(t, tiles + 1) >= floor else -1
    return max(floor, _step_width(t, tiles))


def _step_width(t: int, tiles: int) -> int:
    """The narrowest multiple of :data:`TILE_STEP` that cuts ``t`` columns into ``tiles``."""
    return TILE_STEP * -(-t // (tiles * TILE_STEP))


TILE_STEP = 16
"""Tile widths (but a single tile's) are a multiple of this: tiles start on 64-byte
boundaries of a row and on a block boundary of every Winograd transform here (2 or 4
outputs a block), whatever the number of tiles."""


EVEN_TILES = True
"""Cut a conv's columns into an even number of tiles of (nearly) one width, at most as wide
as the widest a tile may be (:func:`_tile_columns`); False: tiles of the widest width and a
short last one (for comparisons)."""


USE_TAPS = True
"""Run the convs as per-tap GEMMs through numpy's BLAS where it was found (:mod:`blas`);
False: the im2col paths (also where it was not found)."""


def use_taps() -> bool:
    """Whether convs run as per-tap GEMMs (:data:`USE_TAPS` and numpy's BLAS found)."""
    return USE_TAPS and blas.available()


def conv_same(
    x: np.ndarray,
    cw: ConvWeights,
    out: np.ndarray,
    *,
    slope: float | None = None,
    residual: bool = False,
    add_to: bool = False,
    scale: float | None = None,
    post_slope: float | None = None,
    gaps: Gaps = (),
    lanes: int = 1,
) -> None:
    """One "same"-padded stride-1 Conv1d over ``x [C_in, T]`` into ``out [C_out, T]``, fused.

    Per time tile, in this order (each step optional):

    * the input is ``leaky_relu(x, slope)`` (the zero padding applies after it);
    * ``r = conv(.) + bias``, plus ``x`` itself when ``residual``;
    * ``out = r``, or ``out += r`` when ``add_to``;
    * ``out *= scale``, then ``out = leaky_relu(out, post_slope)`` (the next
      layer's activation, when nothing else reads ``out``).

    ``out`` must not overlap ``x``. ``gaps`` (a packed batch, :func:`zero_gaps`) are
    zeroed in ``x`` first. With numpy's BLAS at hand the conv is a sum of per-tap
    GEMMs adding into the output tile (:func:`blas.conv_taps`: no im2col copy, bias
    and residual written first; a conv prepared with row pieces has each tile's GEMMs
    on up to ``lanes`` cores, :func:`add_conv`); else one im2col GEMM per tile.
    """
    if not use_taps():
        _conv_same_im2col(
            x, cw, out, slope=slope, residual=residual, add_to=add_to, scale=scale,
            post_slope=post_slope, gaps=gaps,
        )  # fmt: skip
        return
    zero_gaps(x, gaps)
    c_in, t = x.shape
    tile = _tile_columns(t, max(c_in, cw.c_out))
    s = None if scale is None else np.float32(scale)
    # no activation, rows in order, columns adjacent: the GEMMs read x's tiles where they are
    direct = slope is None and x.strides[1] == 4 and x.strides[0] >= 4 * t

    def piece(run: Iterator[int]) -> None:
        pad = cw.padding
        act = np.empty((c_in, min(tile, t) + 2 * pad), np.float32)
        for t0 in run:
            n = min(tile, t - t0)
            o = out[:, t0 : t0 + n]
            if direct and pad <= t0 and t0 + n + pad <= t:  # inside: read x itself
                src, start = x, t0 - pad
            else:  # the activation, or the zero padding at an end: a copy of the window
                src, start = act[:, : n + 2 * pad], 0
                _activate(x, t0 - pad, slope, src)
            if residual:
                if add_to:
                    o += x[:, t0 : t0 + n]
                    o += cw.bias
                else:
                    np.add(x[:, t0 : t0 + n], cw.bias, out=o)
            elif add_to:
                o += cw.bias
            else:
                o[...] = cw.bias
            add_conv(o, cw, src, start, lanes)
            if s is not None:
                o *= s
            if post_slope is not None:
                leaky_into(o, post_slope, o)

    split(piece, range(0, t, tile))


def resblocks(
    x: np.ndarray,
    blocks: Sequence[tuple[ConvWeights, ConvWeights]],
    out: np.ndarray,
    *,
    slope: float,
    post_slope: float,
    gaps: Gaps = (),
    packed: resblock_tiles.Packed | None = None,
) -> None:
    """A HiFi-GAN stage's ResBlock2s, depth first: ``out = leaky(mean_j block_j(x), post_slope)``
    with ``block(x) = y + conv2(leaky(y))``, ``y = x + conv1(leaky(x))``.

    Per time tile of the output: ``leaky(x)`` over the tile and the widest halo, once
    for all blocks; per block, ``y`` over the tile plus ``conv2``'s halo (the buffer
    filled with ``x + bias1``, then ``conv1``'s taps added into it), zeroed outside
    ``[0, T)`` and in ``gaps`` (``conv2``'s zero padding, a packed batch's masking);
    the output tile gets ``y`` (plus every ``conv2``'s bias) and then ``conv2``'s taps
    added into it. Every intermediate stays in cache and ``x`` is read once per tile
    (the halo of ``y``, a few columns, is computed twice). With ``packed`` (``blocks``
    as :func:`resblock_tiles.pack` made them) each core runs its tiles in one compiled
    call, without the GIL (:mod:`backends.piper.resblock_tiles`: the same bits). Without
    numpy's BLAS, the same per tile with im2col GEMMs. ``out`` must not overlap ``x``.
    """
    if not use_taps():
        _resblocks_im2col(x, blocks, out, slope=slope, post_slope=post_slope, gaps=gaps)
        return
    zero_gaps(x, gaps)
    c, t = x.shape
    tile = _tile_columns(t, c)
    if packed is not None and USE_COMPILED_TILES:
        at = np.clip(np.array(gaps, np.int64).reshape(-1, 2), 0, t)  # as slicing clips
        counter = np.zeros(1, np.int64)

        def lane() -> None:
            buffers = resblock_tiles.scratch(packed, tile, t)
            resblock_tiles.run(x, packed, out, slope, post_slope, at, tile, counter, buffers)

        parallel.on_lanes(lane, -(-t // tile))
        return

    def piece(run: Iterator[int]) -> None:
        _resblock_tiles(x, blocks, out, slope, post_slope, gaps, tile, run)

    split(piece, range(0, t, tile))


USE_COMPILED_TILES = True
"""Run a stage's ResBlock2s in compiled tiles where they were packed (:func:`resblocks`);
False: tile by tile from Python (for comparisons)."""


def split(piece: Callable[[Iterator[int]], None], starts: range) -> None:
    """The tiles at ``starts`` on the caller's share of the cores (:mod:`backends.parallel`),
    each core with one BLAS thread: ``piece(tiles)`` runs on each core that joins in
    (allocating its buffers once) and takes tile after tile from one shared queue until
    none is left (a core that joins late finds fewer or none, see :meth:`parallel.CoreShare.run`),
    so a core that another job holds up takes fewer tiles instead of holding up the
    others (OpenBLAS's threads split a product statically and wait for the slowest).
    A tile computes the same bits whichever core takes it: the result does not depend
    on the share or on the order."""
    if min(parallel.SHARE.share(), len(starts)) <= 1:
        piece(iter(starts))
        return
    queue = _Tiles(starts)
    parallel.on_lanes(lambda: piece(queue), len(starts))


class _Tiles:
    """Tile starts handed out one at a time to several threads."""

    def __init__(self, starts: range) -> None:
        self._it = iter(starts)
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        with self._lock:
            return next(self._it)


def _resblock_tiles(
    x: np.ndarray,
    blocks: Sequence[tuple[ConvWeights, ConvWeights]],
    out: np.ndarray,
    slope: float,
    post_slope: float,
    gaps: Gaps,
    tile: int,
    starts: Iterator[int],
) -> None:
    """:func:`resblocks` over the output tiles starting at ``starts``, with its own buffers."""
    c, t = x.shape
    h2 = max(cw2.padding for _, cw2 in blocks)
    halo = max(cw1.padding + cw2.padding for cw1, cw2 in blocks)
    width = min(tile, t)
    xa = np.empty((c, width + 2 * halo), np.float32)  # leaky(x), zero outside [0, T)
    y = np.empty((c, width + 2 * h2), np.float32)
    ya = np.empty((c, width + 2 * h2), np.float32)
    bias2 = sum((cw2.bias for _, cw2 in blocks), np.zeros((c, 1), np.float32))
    scale = np.float32(1.0 / len(blocks))
    for t0 in starts:
        n = min(tile, t - t0)
        o = out[:, t0 : t0 + n]
        _activate(x, t0 - halo, slope, xa[:, : n + 2 * halo])
        for j, (cw1, cw2) in enumerate(blocks):
            p2 = cw2.padding
            e0, e1 = t0 - p2, t0 + n + p2  # y's columns, [e0, e1)
            yj = y[:, : e1 - e0]
            v0, v1 = max(e0, 0), min(e1, t)  # those inside [0, T)
            np.add(x[:, v0:v1], cw1.bias, out=yj[:, v0 - e0 : v1 - e0])
            add_conv(yj[:, v0 - e0 : v1 - e0], cw1, xa, v0 - cw1.padding - (t0 - halo))
            zero_outside(yj, e0, t, gaps)
            yc = yj[:, p2 : p2 + n]
            if j == 0:
                np.add(yc, bias2, out=o)
            else:
                o += yc
            a = ya[:, : e1 - e0]
            leaky_into(yj, slope, a)
            add_conv(o, cw2, a, 0)
        o *= scale
        leaky_into(o, post_slope, o)


def zero_outside(x: np.ndarray, lo: int, t: int, gaps: Gaps) -> None:
    """Zero the columns of a tile ``x`` (global columns ``lo`` onwards) that lie outside
    ``[0, t)`` or in ``gaps``: the zero padding and packed-batch masking a conv's input
    has there."""
    w = x.shape[1]
    if lo < 0:
        x[:, : min(-lo, w)] = 0
    if lo + w > t:
        x[:, max(t - lo, 0) :] = 0
    for g0, g1 in gaps:
        if g0 < lo + w and g1 > lo:
            x[:, max(g0, lo) - lo : min(g1, lo + w) - lo] = 0


def take_columns(src: np.ndarray, lo: int, dst: np.ndarray) -> None:
    """``dst = src[:, lo : lo + dst.shape[1]]``, zero outside ``src``'s columns (a tile and its
    halo, with the zero padding a conv sees beyond either end)."""
    _activate(src, lo, None, dst)


def _activate(src: np.ndarray, lo: int, slope: float | None, dst: np.ndarray) -> None:
    """``dst = leaky(src, slope)[:, lo : lo + dst.shape[1]]``, zero outside ``src``'s columns."""
    t = src.shape[1]
    w = dst.shape[1]
    a0, a1 = max(0, -lo), min(w, t - lo)
    if a1 > a0:
        window = src[:, lo + a0 : lo + a1]
        if slope is None:
            dst[:, a0:a1] = window
        else:
            leaky_into(window, slope, dst[:, a0:a1])
    else:
        a0 = a1 = 0
    if a0:
        dst[:, :a0] = 0
    if a1 < w:
        dst[:, max(a1, a0) :] = 0


def _conv_same_im2col(
    x: np.ndarray,
    cw: ConvWeights,
    out: np.ndarray,
    *,
    slope: float | None = None,
    residual: bool = False,
    add_to: bool = False,
    scale: float | None = None,
    post_slope: float | None = None,
    gaps: Gaps = (),
    lanes: int = 1,
) -> None:
    """:func:`conv_same` where numpy's BLAS is not found: the same steps per tile, the conv
    one im2col GEMM (``lanes`` is not used)."""
    zero_gaps(x, gaps)
    c_in, t = x.shape
    pad = cw.padding
    tile = max(256, min(t, TILE_BYTES // (4 * (c_in * cw.kernel + 1))))
    sc = _Scratch(c_in, c_in * cw.kernel, cw.c_out, tile, pad)
    s = None if scale is None else np.float32(scale)
    for t0 in range(0, t, tile):
        n = min(tile, t - t0)
        o = out[:, t0 : t0 + n]
        r = _tile_conv(x, t0, n, cw, slope, sc)
        if residual:
            if add_to:
                r += x[:, t0 : t0 + n]
            else:
                np.add(r, x[:, t0 : t0 + n], out=o)
        if add_to:
            o += r
        elif not residual:
            o[...] = r
        if s is not None:
            o *= s
        if post_slope is not None:
            np.maximum(o, np.multiply(o, np.float32(post_slope), out=r), out=o)


def _resblocks_im2col(
    x: np.ndarray,
    blocks: Sequence[tuple[ConvWeights, ConvWeights]],
    out: np.ndarray,
    *,
    slope: float,
    post_slope: float,
    gaps: Gaps = (),
    packed: resblock_tiles.Packed | None = None,
) -> None:
    """A HiFi-GAN stage's ResBlock2s, depth first: ``out = leaky(mean_j block_j(x), post_slope)``
    with ``block(x) = y + conv2(leaky(y))``, ``y = x + conv1(leaky(x))``.

    Per time tile of the output, each block computes its ``y`` over the tile plus
    ``conv2``'s halo, then ``conv2`` over the tile, and the tile's sum: every
    intermediate stays in cache and ``x`` is read once per tile (the halo of ``y``,
    a few columns, is computed twice). ``y`` is zero outside ``[0, T)`` and in
    ``gaps``, as ``conv2``'s zero padding and a packed batch's masking make it.
    Values are :func:`conv_same`'s; ``out`` must not overlap ``x``.
    """
    zero_gaps(x, gaps)
    c, t = x.shape
    halo = max(cw2.padding for _, cw2 in blocks)
    rows = max(c * cw.kernel for block in blocks for cw in block)
    tile = max(256, min(t, TILE_BYTES // (4 * (rows + 1))))
    sc = _Scratch(c, rows, c, tile + 2 * halo, max(cw.padding for b in blocks for cw in b))
    y = np.empty((c, tile + 2 * halo), np.float32)
    scale = np.float32(1.0 / len(blocks))
    for t0 in range(0, t, tile):
        n = min(tile, t - t0)
        o = out[:, t0 : t0 + n]
        for j, (cw1, cw2) in enumerate(blocks):
            e0, e1 = max(0, t0 - cw2.padding), min(t, t0 + n + cw2.padding)
            y1 = y[:, : e1 - e0]
            np.add(_tile_conv(x, e0, e1 - e0, cw1, slope, sc), x[:, e0:e1], out=y1)
            for g0, g1 in gaps:
                if g0 < e1 and g1 > e0:
                    y1[:, max(g0, e0) - e0 : min(g1, e1) - e0] = 0
            r = _tile_conv(y1, t0 - e0, n, cw2, slope, sc)
            r += y1[:, t0 - e0 : t0 - e0 + n]
            if j == 0:
                o[...] = r
            else:
                o += r
        o *= scale
        np.maximum(o, np.multiply(o, np.float32(post_slope), out=sc.tmp[:c, :n]), out=o)


class _Scratch:
    """Tile buffers shared by the convs of one call: activation, column matrix, product."""

    def __init__(self, c_in: int, rows: int, c_out: int, n: int, pad: int) -> None:
        self.act = np.empty((c_in, n + 2 * pad), np.float32)
        self.cols = np.empty((rows + 1, n), np.float32)
        self.tmp = np.empty((c_out, n), np.float32)


def _tile_conv(
    src: np.ndarray, start: int, n: int, cw: ConvWeights, slope: float | None, sc: _Scratch
) -> np.ndarray:
    """``conv(leaky(src, slope))[:, start : start + n] + bias`` (a view of ``sc.tmp``); the
    columns of ``src`` outside ``[0, src.shape[1])`` are zeros (the conv's padding)."""
    rows = src.shape[0] * cw.kernel
    cols = sc.cols[: rows + 1, :n]
    cols[rows] = 1
    _im2col(src, start, n, cw, slope, sc.act, cols[:rows])
    r = sc.tmp[: cw.c_out, :n]
    np.matmul(cw.matrix, cols, out=r)
    return r


def _im2col(
    src: np.ndarray,
    start: int,
    n: int,
    cw: ConvWeights,
    slope: float | None,
    act_buffer: np.ndarray,
    cols: np.ndarray,
) -> None:
    """``cols [C_in * K, n]`` (rows (channel, tap)) = the conv's input windows for output
    columns ``start`` to ``start + n`` of ``leaky(src, slope)``, zero outside ``src``."""
    c_in, t = src.shape
    k, d, pad = cw.kernel, cw.dilation, cw.padding
    act = act_buffer[:c_in, : n + 2 * pad]
    lo, hi = start - pad, start + n + pad
    a0, a1 = max(0, -lo), n + 2 * pad - max(0, hi - t)
    window = src[:, max(lo, 0) : min(hi, t)]
    if slope is None:
        act[:, a0:a1] = window
    else:
        leaky_into(window, slope, act[:, a0:a1])
    if a0:
        act[:, :a0] = 0
    if a1 < n + 2 * pad:
        act[:, a1:] = 0
    # every tap's shifted window in one copy: (channel, tap, time) views of ``act`` and ``cols``
    row = cols.strides[0]
    as_strided(cols, (c_in, k, n), (k * row, row, 4))[...] = as_strided(
        act, (c_in, k, n), (act.strides[0], d * 4, 4)
    )


FRAMES_BYTES = 1 << 21
"""Bytes of one tile's transposed-conv product (:func:`conv_transpose`)."""


@attrs.frozen(eq=False)
class UpWeights:
    """A ConvTranspose1d prepared for :func:`conv_transpose` (built at load by
    :func:`prepare_up`): rows (out channel, tap, phase) for one GEMM a tile, and the same
    rows by tap for the per-tap GEMMs."""

    matrix: np.ndarray  # [C_out * K, C_in]
    bias: np.ndarray  # [C_out, 1]
    stride: int
    padding: int
    phase_taps: np.ndarray
    """``[taps, C_out * stride, C_in]``: tap ``j``'s rows (out channel, phase) for the input
    frame ``taps - 1 - j`` frames back (:func:`blas.conv_taps`'s order)."""
    phase_bias: np.ndarray
    """``[C_out * stride, 1]``: each row's channel bias."""

    @property
    def c_out(self) -> int:
        return int(self.bias.shape[0])

    @property
    def taps(self) -> int:
        """Input frames each output frame reads (``K / stride``)."""
        return int(self.phase_taps.shape[0])


def prepare_up(w: np.ndarray, b: np.ndarray, stride: int, padding: int) -> UpWeights:
    """ConvTranspose1d weights ``[C_in, C_out, K]`` (``K`` a multiple of ``stride``) and bias."""
    c_in, c_out, k = w.shape
    if k % stride:
        raise ValueError(f"conv_transpose: kernel {k} is not a multiple of stride {stride}")
    matrix = np.ascontiguousarray(w.reshape(c_in, c_out * k).T, dtype=np.float32)
    bias = np.asarray(b, np.float32).reshape(c_out, 1)
    taps = k // stride
    by_tap = matrix.reshape(c_out, taps, stride, c_in)
    rows = c_out * stride
    phase_taps = np.ascontiguousarray(
        np.stack([by_tap[:, taps - 1 - j].reshape(rows, c_in) for j in range(taps)])
    )
    phase_bias = np.repeat(bias, stride, axis=0)
    return UpWeights(matrix, bias, stride, padding, phase_taps, phase_bias)


def conv_transpose(
    x: np.ndarray, uw: UpWeights, gaps: Gaps = (), out: np.ndarray | None = None
) -> np.ndarray:
    """ConvTranspose1d (dilation 1, no output padding) of ``x [C_in, T]``, polyphase, in tiles,
    into ``out`` (C-contiguous float32 ``[C_out, T_out]``, not overlapping ``x``; default: a new
    array), returned.

    Output frame ``f`` (``stride`` samples) is the sum over taps ``m`` of input frame
    ``f - m``'s product rows for that tap. With numpy's BLAS at hand, per tile of frames
    the rows (out channel, phase) of every frame are a conv over the input frames, its
    taps' GEMMs adding into a tile filled with the bias (:func:`blas.conv_taps`), and the
    phase rows are then written as samples, cropped (``padding`` at both ends), in one
    compiled pass (:func:`backends.kernels.interleave_phases`). Elsewhere one GEMM gives
    every row of the tile's inputs and the taps are summed in frame-major order
    (:func:`_conv_transpose_matrix`). ``gaps`` are zeroed in ``x`` first
    (:func:`zero_gaps`). Runs of tiles go to the caller's cores (:func:`split`).
    """
    out = _transposed_out(x, uw, out)  # checked before anything is written
    zero_gaps(x, gaps)
    if not use_taps():
        return _conv_transpose_matrix(x, uw, out)
    c_in, t = x.shape
    u, pad, taps = uw.stride, uw.padding, uw.taps
    weights, bias = uw.phase_taps, uw.phase_bias
    rows = weights.shape[1]
    t_out = out.shape[1]
    frames = t + taps - 1
    per = _frames_per_tile(TAPS_TILE // rows, frames)

    def piece(run: Iterator[int]) -> None:
        y = np.empty((rows, per), np.float32)
        edge = np.empty((c_in, per + taps - 1), np.float32)
        for f0 in run:
            f1 = min(frames, f0 + per)
            n, first = f1 - f0, f0 - taps + 1  # frames, and the input frame of tap 0's column 0
            if first >= 0 and f1 <= t:
                src = x[:, first:f1]
            else:  # a tile at either end: the frames outside the input are zeros
                src = edge[:, : n + taps - 1]
                take_columns(x, first, src)
            yv = y[:, :n]
            yv[...] = bias
            blas.conv_taps(yv, weights, src, 0, 1)
            lo, hi = max(0, f0 * u - pad), min(t_out, f1 * u - pad)
            if hi > lo:
                kernels.interleave_phases(y, n, out, f0 * u - pad, lo, hi)

    split(piece, range(0, frames, per))
    return out


def transposed_length(uw: UpWeights, t: int) -> int:
    """Output samples of :func:`conv_transpose` on ``t`` input frames."""
    return (t - 1) * uw.stride - 2 * uw.padding + uw.taps * uw.stride


def _transposed_out(x: np.ndarray, uw: UpWeights, out: np.ndarray | None) -> np.ndarray:
    """``out`` checked for :func:`conv_transpose` of ``x`` (a new array when None)."""
    shape = (uw.c_out, transposed_length(uw, x.shape[1]))
    if out is None:
        return np.empty(shape, np.float32)
    if out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"conv_transpose: out must be C-contiguous float32 {list(shape)}")
    if np.may_share_memory(out, x):
        raise ValueError("conv_transpose: out must not overlap x")
    return out


def _frames_per_tile(fits: int, frames: int) -> int:
    """Frames of one transposed-conv tile: the ``fits`` its buffers allow (at least 16); with
    several cores, :data:`SPLIT_TILES` tiles at least, as the convs are cut."""
    per = max(16, fits)
    if parallel.SHARE.share() > 1:
        per = max(16, min(per, -(-frames // SPLIT_TILES)))
    return per


def _conv_transpose_matrix(x: np.ndarray, uw: UpWeights, out: np.ndarray) -> np.ndarray:
    """:func:`conv_transpose` without numpy's BLAS: per tile of frames one GEMM gives every
    row of the tile's inputs (plus the ``taps - 1`` frames before it), the taps are summed
    into frame-major order while the product is in cache, and the cropped samples are
    written with the bias added."""
    c_in, t = x.shape
    u, pad, c_out, taps = uw.stride, uw.padding, uw.c_out, uw.taps
    t_out = out.shape[1]
    frames = t + taps - 1
    per = _frames_per_tile(FRAMES_BYTES // (4 * uw.matrix.shape[0]), frames)

    def piece(run: Iterator[int]) -> None:
        acc = np.empty((c_out, per, u), np.float32)
        for f0 in run:
            f1 = min(frames, f0 + per)
            i0, i1 = max(0, f0 - taps + 1), min(t, f1)
            c4 = np.matmul(uw.matrix, x[:, i0:i1]).reshape(c_out, taps, u, i1 - i0)
            a = acc[:, : f1 - f0]
            for m in range(taps):
                lo, hi = max(f0, i0 + m), min(f1, i1 + m)  # output frames tap m reaches
                part = c4[:, m, :, lo - m - i0 : hi - m - i0].transpose(0, 2, 1)
                if m == 0:
                    if lo > f0:
                        a[:, : lo - f0] = 0
                    if hi < f1:
                        a[:, hi - f0 :] = 0
                    a[:, lo - f0 : hi - f0] = part
                else:
                    a[:, lo - f0 : hi - f0] += part
            flat = a.reshape(c_out, (f1 - f0) * u)
            s0 = max(0, pad - f0 * u)  # first sample of this tile that is not cropped
            s1 = min((f1 - f0) * u, t_out + pad - f0 * u)
            if s1 > s0:
                o0 = f0 * u + s0 - pad
                np.add(flat[:, s0:s1], uw.bias, out=out[:, o0 : o0 + s1 - s0])

    split(piece, range(0, frames, per))
    return out


@attrs.frozen(eq=False)
class Prepared:
    """A model's weights as the fast paths' operands, by module name; built once per model."""

    convs: Mapping[str, ConvWeights]
    ups: Mapping[str, UpWeights]
    stages: Mapping[int, resblock_tiles.Packed | None] = attrs.field(factory=dict)
    """The generator's ResBlock2 stages packed for the compiled tiles, by stage index
    (:func:`backends.piper.generator.prepare_stages`)."""
    couplings: Mapping[str, coupling_tiles.Packed | None] = attrs.field(factory=dict)
    """The flow's couplings packed for the compiled tiles, by module name
    (:func:`backends.piper.flow.prepare_couplings`)."""
    flow: coupling_tiles.Flow | None = None
    """The same couplings stacked in their running order, for the whole flow in one split
    (:func:`backends.piper.flow.stack_couplings`)."""
