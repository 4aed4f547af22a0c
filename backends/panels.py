"""Weights packed in panels for products of a few rows: a decoding step's, on numpy.

A decoding step multiplies a few rows (one a sequence) by every weight of the
decoder and by the 80 MB vocabulary projection. OpenBLAS runs one row as a
matrix-vector product at memory speed, but for two to eight rows it packs the
whole weight into its own layout on every call, which costs about what the
product does: one step of two members took twice the time of one
(docs/performance.md, "Session 10"). :func:`pack` puts a weight in that kind of layout
once, when the model is loaded (the same bytes as the checkpoint's: it replaces
that copy), and :func:`linear` multiplies rows by it with
:func:`backends.kernels.panel_product`, which reads each panel once for all rows.

A weight whose every value is a half-precision number (Whisper's checkpoints are
stored as float16, so every weight of theirs is) is packed as the halves' bits
where the CPU converts halves by an instruction (:data:`backends.intrinsics.HALVES`):
a product reads half the bytes, and since a half's float32 value is exact, its
outputs are the float32 panels' bits. A decoding step reads its weights from
memory (one core: about 2 ms a step for the 80 MB vocabulary projection), so it
takes what reading takes.

Every output is its bias plus the terms in ascending order, so a row's values are
the same bits whether it is alone or one of a batch's rows, and whichever core
computes its columns. On several cores the panels are split into pieces
(:mod:`backends.parallel`) when the weight is large enough for a piece to pay for
its hand-over.
"""

from __future__ import annotations

import functools
import itertools

import attrs
import numpy as np

from backends import handoff, kernels, parallel
from backends.intrinsics import HALVES

PANEL = kernels.PANEL

PIECE_BYTES = 1 << 21
"""A split's pieces hold about this many bytes of a weight's panels or more (2 MiB: a few
hundred microseconds of reading, against 20-100 us for handing a piece to another core
on the development VM); smaller weights are one call on the caller's thread, unless
they have many rows (:data:`SPLIT_ROWS`)."""

HANDOFF_PIECE_BYTES = 1 << 18
"""The same where the pieces go to spinning helpers (:mod:`backends.handoff`: about a
microsecond a hand-over): 256 KiB, so that a decoding step's 0.6-2.4 MB layer weights
are split too."""

MAX_PIECES = 16

SPLIT_ROWS = 32
"""Rows from which a weight too small to split by panels is split by rows instead, one
group of rows (a multiple of four) a lane, each reading the whole weight (from cache):
a prompt's tokens or the alignment pass's positions are compute, not memory."""


@attrs.frozen(eq=False)
class PackedWeight:
    """A linear layer's weight ``w [out, in]`` as panels of :data:`PANEL` output rows:
    ``panels[q, k, j] = w[q * PANEL + j, k]``, zero past ``out`` (each panel one contiguous
    block, read from start to end by a product); float32, or the bits of halves (uint16)
    when every value is one (:func:`pack`)."""

    panels: np.ndarray  # [ceil(out / PANEL), in, PANEL] float32 or uint16, C-contiguous
    out_features: int
    zero_bias: np.ndarray  # [ceil(out / PANEL) * PANEL]: the bias of a product without one

    @property
    def in_features(self) -> int:
        return int(self.panels.shape[1])

    @property
    def halves(self) -> bool:
        """Whether the panels hold halves' bits (uint16) rather than float32 values."""
        return self.panels.dtype == np.uint16

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)``: the shape of the weight it packs."""
        return (self.out_features, self.in_features)


def pack(w: np.ndarray, halves: bool | None = None) -> PackedWeight:
    """``w [out, in]`` (any float dtype and layout) packed in panels: as halves' bits when
    ``halves`` (None: where the CPU converts them, :data:`backends.intrinsics.HALVES`) and
    every value of ``w`` is exactly a half (at most 11 significant bits, within a half's
    range or infinite, not NaN), else as float32. A product's outputs are the same bits
    either way."""
    if w.ndim != 2:
        raise ValueError(f"pack: a weight [out, in], not shape {w.shape}")
    if halves is None:
        halves = HALVES
    elif halves and not HALVES:
        raise ValueError("pack: this CPU has no half conversion (backends.intrinsics.HALVES)")
    out_features, in_features = w.shape
    count, full = -(-out_features // PANEL), out_features // PANEL
    panels = np.zeros((count, in_features, PANEL), np.float32)  # one copy, written in place
    panels[:full] = w[: full * PANEL].reshape(full, PANEL, in_features).transpose(0, 2, 1)
    if full < count:  # a last, partial panel: its missing columns stay zero
        panels[full, :, : out_features - full * PANEL] = w[full * PANEL :].T
    if halves:
        with np.errstate(over="ignore"):  # finite but out of a half's range: inf, refused
            as_halves = panels.astype(np.float16)
        if np.array_equal(as_halves.astype(np.float32), panels):  # NaN, inf or rounding: no
            panels = as_halves.view(np.uint16)
    return PackedWeight(panels, out_features, np.zeros(count * PANEL, np.float32))


def unpack(p: PackedWeight) -> np.ndarray:
    """The weight ``[out, in]`` that ``p`` packs (a new array)."""
    return rows(p, np.arange(p.out_features))


def rows(p: PackedWeight, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the packed weight, ``[len(ids), in]`` (a tied embedding's token
    vectors). Ids outside ``[0, out)`` raise IndexError."""
    ids = np.asarray(ids, dtype=np.intp).reshape(-1)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= p.out_features):
        raise IndexError(f"rows: ids must be in [0, {p.out_features})")
    picked = p.panels[ids // PANEL, :, ids % PANEL]
    if p.halves:
        return picked.view(np.float16).astype(np.float32)
    return np.ascontiguousarray(picked)


def linear(
    x: np.ndarray, p: PackedWeight, bias: np.ndarray | None = None, lanes: int | None = None
) -> np.ndarray:
    """``x [M, in] @ w.T + bias`` as float32 ``[M, out]``, on up to ``lanes`` cores at once
    (None: the caller's share, :func:`backends.parallel.SHARE`)."""
    if x.ndim != 2 or x.shape[1] != p.in_features:
        raise ValueError(f"linear: rows [M, {p.in_features}], not shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = p.zero_bias if bias is None else _padded_bias(bias, p)
    out = np.empty((x.shape[0], p.out_features), np.float32)
    if x.shape[0] == 0:
        return out
    cores = parallel.SHARE.share() if lanes is None else lanes
    helpers = handoff.usable(cores)
    parts = _parts(x.shape[0], p.panels.shape[0], p.panels.nbytes, cores, helpers)

    def piece(part: np.ndarray) -> None:
        r0, r1, lo, hi = part.tolist()
        kernels.panel_product(x[r0:r1], p.panels, b, out[r0:r1], lo, hi)

    if len(parts) == 1:
        kernels.panel_product(x, p.panels, b, out, 0, p.panels.shape[0])
    elif not (helpers and handoff.HELPERS.product(x, p.panels, b, out, parts, cores)):
        # the thread pool's pieces (another caller holds the helpers: cut for the pool)
        pool = _parts(x.shape[0], p.panels.shape[0], p.panels.nbytes, cores, False)
        parallel.run_pieces(piece, list(pool), lanes=cores)
    return out


@functools.lru_cache(maxsize=1024)
def _parts(rows: int, count: int, size: int, cores: int, helpers: bool) -> np.ndarray:
    """How a product of ``rows`` rows by a weight of ``count`` panels (``size`` bytes) is cut
    for ``cores`` cores, as rows of (first row, end row, first panel, end panel), int64,
    read-only (the same cut every step: computed once): by panels when the weight is large
    (:data:`PIECE_BYTES`, :data:`HANDOFF_PIECE_BYTES` for ``helpers``), by groups of rows
    (multiples of four) when it is small but has many rows (:data:`SPLIT_ROWS`), else one
    part."""
    pieces = min(MAX_PIECES, size // (HANDOFF_PIECE_BYTES if helpers else PIECE_BYTES), count)
    if cores > 1 and pieces > 1:
        bounds = [count * i // pieces for i in range(pieces + 1)]
        cut = [(0, rows, lo, hi) for lo, hi in itertools.pairwise(bounds)]
    elif cores > 1 and rows >= SPLIT_ROWS:
        groups = sorted({4 * (-(-rows // 4) * i // cores) for i in range(cores)} | {rows})
        cut = [(r0, r1, 0, count) for r0, r1 in itertools.pairwise(groups)]  # none empty
    else:
        cut = [(0, rows, 0, count)]
    parts = np.array(cut, np.int64)
    parts.flags.writeable = False
    return parts


def _padded_bias(bias: np.ndarray, p: PackedWeight) -> np.ndarray:
    """``bias [out]`` as one value a panel column (zeros after ``out``)."""
    if bias.shape != (p.out_features,):
        raise ValueError(f"linear: bias [{p.out_features}], not shape {bias.shape}")
    if p.zero_bias.shape[0] == p.out_features:
        return np.ascontiguousarray(bias, dtype=np.float32)
    padded = np.zeros_like(p.zero_bias)
    padded[: p.out_features] = bias
    return padded
