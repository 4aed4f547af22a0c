"""A flow coupling's tiles as one compiled loop: the WaveNet coupling net without the GIL.

:class:`backends.piper.flow._CouplingTiles` runs a coupling (reverse, mean-only) depth
first over column tiles: per tile the pre conv, four gated layers (a Winograd ``F(4, 5)``
in-layer conv, the gate, a 1x1 res/skip conv, two adds) and the post conv, each a
numpy, numba or ``ctypes`` call from Python that takes and gives back the GIL: about
forty a tile. Two cores sharing one request's tiles waited on each other's hand-overs
(the flow of a short sentence took 10.5 ms on two cores against 11.7 on one), and two
requests on two slots lose time to the same hand-overs.

Here the same steps run in one numba function (``nogil``) per core: tiles are claimed
from a shared counter (an atomic add), the Winograd transforms are the generated
kernels of :mod:`backends.piper.winograd_kernels`, every product (the transform's
points, the 1x1 convs) is the BLAS's ``cblas_sgemm`` by its address, with the operands
and order of the Python path, so each tile is the same bits
(``tests/models/test_piper_coupling_tiles.py``). On one core the coupling is one tile
as wide as the input, so it has no halo to compute twice.

Only for couplings whose in-layers have ``F(4, 5)`` filters and whose other convs are
1x1 (:func:`pack` returns None otherwise, and where numpy's BLAS takes 32-bit integers);
the caller checks every operand (:func:`run`): the compiled loop has no bounds checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
from numba.core import types

from backends import kernels, parallel
from backends.handoff import SCHED_YIELD, spin
from backends.intrinsics import add as _atomic_add
from backends.intrinsics import load as _load
from backends.intrinsics import sgemm as _sgemm
from backends.piper import blas
from backends.piper.conv_weights import ConvWeights
from backends.piper.resblock_tiles import (
    accumulate_row,
    counter_and_gaps_fit,
    gaps_fit,
    zero_outside,
)
from backends.piper.winograd_kernels import input_4_5, output_4_5

M, R = 4, 5
"""The Winograd transform the in-layers must have: ``F(4, 5)``."""
POINTS = M + R - 1


@attrs.frozen(eq=False)
class Packed:
    """One coupling's weights as the compiled loop's operands (built once per model): the
    pre and post 1x1 convs, each layer's in-layer filters ``[POINTS, 2C, C]`` and bias, and
    its res/skip 1x1 conv (``2C`` rows, ``C`` for the last layer) and bias."""

    pre_w: np.ndarray
    pre_b: np.ndarray
    in_u: np.ndarray
    in_b: np.ndarray
    rs_w: np.ndarray
    rs_b: np.ndarray
    post_w: np.ndarray
    post_b: np.ndarray

    @property
    def hidden(self) -> int:
        return int(self.pre_w.shape[0])

    @property
    def half(self) -> int:
        return int(self.pre_w.shape[1])

    @property
    def halo(self) -> int:
        """Columns each side of a tile its layers read beyond it."""
        return int(self.in_u.shape[0]) * (R - 1) // 2


def pack(prep: Mapping[str, ConvWeights], p: str, layers: int) -> Packed | None:
    """Coupling ``p``'s convs packed for :func:`run`, or None where it does not apply."""
    if not blas.ADDRESS or layers < 1:
        return None
    pre, post = prep[f"{p}.pre"], prep[f"{p}.post"]
    ins = [prep[f"{p}.enc.in_layers.{j}"] for j in range(layers)]
    rss = [prep[f"{p}.enc.res_skip_layers.{j}"] for j in range(layers)]
    c, half = pre.c_out, int(pre.taps.shape[2])
    square = all(cw.taps.shape[2] == c for cw in (post, *rss))
    if (
        not square
        or any(cw.kernel != 1 for cw in (pre, post, *rss))
        or post.c_out != half
        or any(rs.c_out != (2 * c if j < layers - 1 else c) for j, rs in enumerate(rss))
        or any(
            cw.winograd is None
            or (cw.winograd.transform.m, cw.winograd.transform.r) != (M, R)
            or cw.winograd.u.shape != (POINTS, 2 * c, c)
            for cw in ins
        )
    ):
        return None
    rs_w = np.zeros((layers, 2 * c, c), np.float32)
    rs_b = np.zeros((layers, 2 * c), np.float32)
    for j, rs in enumerate(rss):
        rs_w[j, : rs.c_out] = rs.taps[0]
        rs_b[j, : rs.c_out] = rs.bias.reshape(-1)
    arrays = {
        "pre_w": np.ascontiguousarray(pre.taps[0]),
        "pre_b": pre.bias.reshape(-1).copy(),
        "in_u": np.stack([cw.winograd.u for cw in ins if cw.winograd is not None]),
        "in_b": np.stack([cw.bias.reshape(-1) for cw in ins]),
        "rs_w": rs_w,
        "rs_b": rs_b,
        "post_w": np.ascontiguousarray(post.taps[0]),
        "post_b": post.bias.reshape(-1).copy(),
    }
    for a in arrays.values():
        a.setflags(write=False)
    return Packed(**arrays)


def share_weights(packed: Packed, prep: dict[str, ConvWeights], p: str, layers: int) -> None:
    """Replaces coupling ``p``'s in-layers and res/skip convs in ``prep`` (those :func:`pack`
    packed) by the same convs whose Winograd filters and taps are views of ``packed``'s, so
    a model holds one copy of them (the Python paths read the same numbers)."""
    for j in range(layers):
        name = f"{p}.enc.in_layers.{j}"
        cw = prep[name]
        assert cw.winograd is not None
        prep[name] = attrs.evolve(cw, winograd=attrs.evolve(cw.winograd, u=packed.in_u[j]))
        name = f"{p}.enc.res_skip_layers.{j}"
        rows = prep[name].c_out
        prep[name] = attrs.evolve(prep[name], taps=packed.rs_w[j, :rows].reshape(1, rows, -1))


def run(
    z: np.ndarray, packed: Packed, out: np.ndarray, gaps: np.ndarray, tile: int, counter: np.ndarray
) -> int:
    """The coupling's output tiles claimed from ``counter`` (int64 [1], shared by the cores:
    the next tile's index) until none is left, with this call's own buffers; returns how
    many it ran. ``z`` and ``out [2 half, T]`` C-contiguous float32, not overlapping;
    ``out[:half] = z[:half]``, ``out[half:] = z[half:] - post(WN(pre(z[:half])))``;
    ``gaps`` int64 [g, 2] column ranges inside ``[0, T)`` (ValueError for anything else)."""
    half, c = packed.half, packed.hidden
    t = z.shape[1]
    if (
        z.dtype != np.float32
        or out.dtype != np.float32
        or z.shape != (2 * half, t)
        or out.shape != z.shape
        or not (z.flags.c_contiguous and out.flags.c_contiguous)
        or tile < 1
        or t < 1
        or not counter_and_gaps_fit(counter, gaps, t)
    ):
        raise ValueError("coupling_tiles.run: operands of the wrong shape, dtype or layout")
    if np.may_share_memory(z, out):
        raise ValueError("coupling_tiles.run: out overlaps z")
    width = min(tile, t) + 2 * packed.halo
    blocks = -(-(width - (R - 1)) // M)
    buffers = (
        np.empty((half, width), np.float32),  # z[:half] over the tile and its halo
        np.empty((c, width), np.float32),  # the WaveNet's residual stream
        np.empty((2 * c, width), np.float32),  # an in-layer's output
        np.empty((2 * c, width), np.float32),  # a res/skip conv's output
        np.empty((c, width), np.float32),  # the skip sum
        np.empty((half, width), np.float32),  # the post conv's output
        np.empty(POINTS * c * blocks, np.float32),  # the transformed inputs
        np.empty(POINTS * 2 * c * blocks, np.float32),  # the products
        np.empty(M * (blocks + (POINTS - 1) // M), np.float32),  # the transforms' phases
    )
    return int(
        _tiles(
            z, out, packed.pre_w, packed.pre_b, packed.in_u, packed.in_b, packed.rs_w,
            packed.rs_b, packed.post_w, packed.post_b, gaps, tile, counter, *buffers,
            blas.ADDRESS,
        )
    )  # fmt: skip


@kernels.compiled
def _address(a: Any) -> Any:  # pragma: no cover - compiled
    return np.int64(a.ctypes.data)


@kernels.compiled
def _fill_rows(dst: Any, b: Any, rows: Any, col: Any, n: Any) -> None:  # pragma: no cover
    """``dst[r, col : col + n] = b[r]`` for the first ``rows`` rows (a conv's bias, written
    before its products add into it)."""
    for r in range(rows):
        value = b[r]
        row = dst[r, col : col + n]
        for i in range(n):
            row[i] = value


@kernels.compiled
def _pointwise(
    sgemm: Any, w: Any, b: Any, rows: Any, src: Any, col: Any, dst: Any, dcol: Any, n: Any
) -> None:  # pragma: no cover - compiled
    """``dst[:rows, dcol : dcol + n] = b[:rows] + w[:rows] @ src[:, col : col + n]`` (a 1x1
    conv: the bias written, then one SGEMM adding into it)."""
    _fill_rows(dst, b, rows, dcol, n)
    a, lds, ldd = _address(w), src.shape[1], dst.shape[1]
    p_src, p_dst = _address(src) + 4 * col, _address(dst) + 4 * dcol
    _sgemm(sgemm, rows, n, w.shape[1], a, w.shape[1], p_src, lds, p_dst, ldd)


@kernels.compiled
def _products(
    sgemm: Any,
    u: Any,
    first: Any,
    count: Any,
    v: Any,
    flat: Any,
    at: Any,
    ld: Any,
    n: Any,
    pbuf: Any,
    scratch: Any,
) -> None:  # pragma: no cover - compiled
    """Rows ``first : first + count`` of an ``F(4, 5)`` conv from its input transform ``v``
    ``[POINTS, C_in, blocks]``: one SGEMM a point with those rows of ``u``, then the output
    transform of ``n`` columns added into ``flat[at:]`` (rows ``ld`` apart; ``scratch`` the
    transform's phases)."""
    c_in, blocks = u.shape[2], v.shape[2]
    products = pbuf[: POINTS * count * blocks].reshape((POINTS, count, blocks))
    products[...] = 0
    for i in range(POINTS):
        _sgemm(
            sgemm, count, blocks, c_in, _address(u[i]) + 4 * first * c_in, c_in,
            _address(v[i]), blocks, _address(products[i]), blocks,
        )  # fmt: skip
    output_4_5(products, flat[at:], ld, n, scratch)


@kernels.compiled
def _winograd(
    sgemm: Any,
    u: Any,
    src: Any,
    dst: Any,
    col: Any,
    n: Any,
    vbuf: Any,
    pbuf: Any,
    phases: Any,
) -> None:  # pragma: no cover - compiled
    """``dst[:, col : col + n] += conv(src[:, : n + R - 1])`` by ``F(4, 5)``
    (:func:`backends.piper.winograd.conv_add` with ``start`` 0)."""
    c_out, c_in = u.shape[1], u.shape[2]
    blocks = (n + M - 1) // M
    v = vbuf[: POINTS * c_in * blocks].reshape((POINTS, c_in, blocks))
    ph = phases[: M * (blocks + (POINTS - 1) // M)].reshape((M, blocks + (POINTS - 1) // M))
    input_4_5(src.reshape(-1), src.shape[1], 0, n + R - 1, v, ph)
    _products(sgemm, u, 0, c_out, v, dst.reshape(-1), col, dst.shape[1], n, pbuf, ph)


_IN1, _IN2, _IN3 = (kernels.array_type(n, readonly=True) for n in (1, 2, 3))
_IN4 = kernels.array_type(4, readonly=True)
_OUT1, _OUT2 = kernels.array_type(1), kernels.array_type(2)
_GAPS = kernels.array_type(2, types.int64, readonly=True)
_COUNTER = kernels.array_type(1, types.int64)
_I64 = types.int64
_SIGNATURE = types.int64(
    _IN2, _OUT2, _IN2, _IN1, _IN4, _IN2, _IN3, _IN2, _IN2, _IN1, _GAPS, _I64, _COUNTER,
    _OUT2, _OUT2, _OUT2, _OUT2, _OUT2, _OUT2, _OUT1, _OUT1, _OUT1, _I64,
)  # fmt: skip


@kernels.compiled
def _gated_res_skip(
    sgemm: Any,
    u: Any,
    in_b: Any,
    rs_w: Any,
    rs_b: Any,
    rows: Any,
    x: Any,
    x_in: Any,
    col: Any,
    n: Any,
    rs: Any,
    vbuf: Any,
    pbuf: Any,
    phases: Any,
) -> None:  # pragma: no cover - compiled
    """A WaveNet layer up to its res/skip conv over ``n`` columns: ``x_in[:, col : col + n]`` =
    the in-layer's bias plus its conv of ``x`` (``F(4, 5)``), gated (``tanh`` of the first
    ``C`` rows times ``sigmoid`` of the others, into the first), then ``rs[:rows, col : col +
    n]`` = the res/skip 1x1 conv of the gated rows."""
    c = rs_w.shape[1]
    _fill_rows(x_in, in_b, 2 * c, col, n)
    _winograd(sgemm, u, x, x_in, col, n, vbuf, pbuf, phases)
    flat = x_in.reshape(-1)
    ld = x_in.shape[1]
    kernels.gate_rows(flat[col:], ld, flat[c * ld + col :], ld, c, n)
    _pointwise(sgemm, rs_w, rs_b, rows, x_in[:c], col, rs, col, n)


@kernels.compiled
def _coupling_out(
    z: Any, m: Any, out: Any, h0: Any, h1: Any, a: Any, b: Any, flip: Any
) -> None:  # pragma: no cover - compiled
    """A coupling's output on channels ``[h0, h1)`` of each half over columns ``[a, b)``:
    ``out[r] = z[r]``, ``out[half + r] = z[half + r] - m[r - h0, : b - a]``, the rows
    reversed when ``flip``."""
    half = z.shape[0] // 2
    for r in range(h0, h1):
        lo = 2 * half - 1 - r if flip else r
        hi = half - 1 - r if flip else half + r
        out[lo, a:b] = z[r, a:b]
        zr, mr, orow = z[half + r, a:b], m[r - h0, : b - a], out[hi, a:b]
        for q in range(b - a):
            orow[q] = zr[q] - mr[q]


@kernels.kernel(_SIGNATURE)
def _tiles(
    z: Any,
    out: Any,
    pre_w: Any,
    pre_b: Any,
    in_u: Any,
    in_b: Any,
    rs_w: Any,
    rs_b: Any,
    post_w: Any,
    post_b: Any,
    gaps: Any,
    tile: Any,
    counter: Any,
    x0: Any,
    x: Any,
    x_in: Any,
    rs: Any,
    skip: Any,
    m: Any,
    vbuf: Any,
    pbuf: Any,
    phases: Any,
    sgemm: Any,
) -> Any:  # pragma: no cover - compiled
    """:func:`run`'s loop: the steps of :meth:`backends.piper.flow._CouplingTiles.run`."""
    half, t = pre_w.shape[1], z.shape[1]
    c, layers = pre_w.shape[0], in_u.shape[0]
    halo = layers * (R - 1) // 2
    pad = (R - 1) // 2
    tiles = (t - 1) // tile + 1  # t >= 1; no overflow for any tile
    done = 0
    while True:
        i = _atomic_add(_address(counter), 1)
        if i >= tiles:
            return done
        t0 = i * tile
        n = min(tile, t - t0)
        w, e0 = n + 2 * halo, t0 - halo
        for r in range(half):  # z[:half] over the tile and its halo, zero outside [0, T)
            row = x0[r, :w]
            for q in range(w):
                at = e0 + q
                row[q] = z[r, at] if 0 <= at < t else np.float32(0.0)
        _pointwise(sgemm, pre_w, pre_b, c, x0, 0, x, 0, w)
        skip[:, :w] = 0
        for j in range(layers):
            zero_outside(x, w, e0, t, gaps)
            rows = 2 * c if j < layers - 1 else c
            _gated_res_skip(
                sgemm, in_u[j], in_b[j], rs_w[j], rs_b[j], rows, x, x_in, pad, w - 2 * pad,
                rs, vbuf, pbuf, phases,
            )  # fmt: skip
            for r in range(c):
                if j < layers - 1:
                    accumulate_row(rs[r, pad : w - pad], x[r, pad : w - pad])
                    accumulate_row(rs[c + r, pad : w - pad], skip[r, pad : w - pad])
                else:
                    accumulate_row(rs[r, pad : w - pad], skip[r, pad : w - pad])
        _pointwise(sgemm, post_w, post_b, half, skip, halo, m, 0, n)
        _coupling_out(z, m, out, 0, half, t0, t0 + n, False)
        done += 1


@attrs.frozen(eq=False)
class Flow:
    """A flow's couplings packed end to end, in the order they run (the reverse flow's), each
    kind of weight one array with the coupling first (:meth:`stack`); each coupling's
    :class:`Packed` is a view of it (:meth:`coupling`)."""

    pre_w: np.ndarray
    pre_b: np.ndarray
    in_u: np.ndarray
    in_b: np.ndarray
    rs_w: np.ndarray
    rs_b: np.ndarray
    post_w: np.ndarray
    post_b: np.ndarray

    def __attrs_post_init__(self) -> None:
        """Refuses arrays :func:`run_flow`'s compiled loop would read out of bounds: ``K``
        couplings of ``L`` layers, ``C`` hidden and ``half`` channels, float32, C-contiguous."""
        k, c, half = self.pre_w.shape if self.pre_w.ndim == 3 else (0, 0, 0)
        layers = self.in_u.shape[1] if self.in_u.ndim == 5 else 0
        shapes = {
            "pre_w": (k, c, half), "pre_b": (k, c), "in_u": (k, layers, POINTS, 2 * c, c),
            "in_b": (k, layers, 2 * c), "rs_w": (k, layers, 2 * c, c), "rs_b": (k, layers, 2 * c),
            "post_w": (k, half, c), "post_b": (k, half),
        }  # fmt: skip
        for name, shape in shapes.items():
            a = getattr(self, name)
            if a.shape != shape or a.dtype != np.float32 or not a.flags.c_contiguous or 0 in shape:
                raise ValueError(
                    f"coupling_tiles.Flow: {name} must be C-contiguous float32 {shape}"
                )

    @staticmethod
    def stack(couplings: Sequence[Packed]) -> Flow | None:
        """The couplings in one :class:`Flow` (None when there are none or their shapes differ)."""
        fields = [f.name for f in attrs.fields(Packed)]
        if not couplings or any(
            getattr(p, f).shape != getattr(couplings[0], f).shape for p in couplings for f in fields
        ):
            return None
        arrays = {f: np.stack([getattr(p, f) for p in couplings]) for f in fields}
        for a in arrays.values():
            a.setflags(write=False)
        return Flow(**arrays)

    @property
    def couplings(self) -> int:
        return int(self.pre_w.shape[0])

    def coupling(self, k: int) -> Packed:
        """Coupling ``k``'s weights (views)."""
        return Packed(**{f.name: getattr(self, f.name)[k] for f in attrs.fields(Packed)})


_SYNC_WORDS = 16
"""A step's two counters (claimed pieces, done pieces) each on its own cache line."""


@kernels.compiled
def _wait_done(sync: Any, at: Any, pieces: Any, yield_fn: Any) -> None:  # pragma: no cover
    """Spins (:func:`backends.handoff.spin`) until ``sync[at]`` (done pieces) reaches
    ``pieces``."""
    address = _address(sync) + 8 * at
    spins = 0
    while _load(address) < pieces:
        spins = spin(yield_fn, spins)


_IN5 = kernels.array_type(5, readonly=True)
_BOUNDS = kernels.array_type(1, types.int64, readonly=True)
_OUT3 = kernels.array_type(3)


@kernels.compiled
def _in_layer_rows(
    sgemm: Any,
    u: Any,
    in_b: Any,
    v: Any,
    n: Any,
    r0: Any,
    r1: Any,
    x_in: Any,
    pbuf: Any,
    scratch: Any,
) -> None:  # pragma: no cover - compiled
    """Channels ``[r0, r1)`` of a WaveNet in-layer's gate over ``n`` columns: rows ``h C + r``
    (``h`` 0 and 1) of ``x_in`` = the bias plus the ``F(4, 5)`` products of the input
    transform ``v`` with those rows of ``u`` (one SGEMM a point and half), then
    ``x_in[r0:r1] = tanh(x_in[r0:r1]) * sigmoid(x_in[C + r0 : C + r1])``."""
    c, count, ld = u.shape[1] // 2, r1 - r0, x_in.shape[1]
    flat = x_in.reshape(-1)
    for h in range(2):
        first = h * c + r0
        _fill_rows(x_in[first:], in_b[first:], count, 0, n)
        _products(sgemm, u, first, count, v, flat, first * ld, ld, n, pbuf, scratch)
    kernels.gate_rows(flat[r0 * ld :], ld, flat[(c + r0) * ld :], ld, count, n)


@kernels.compiled
def _res_skip_rows(
    sgemm: Any,
    rs_w: Any,
    rs_b: Any,
    acts: Any,
    r0: Any,
    r1: Any,
    last: Any,
    x: Any,
    x_next: Any,
    skip: Any,
    rs: Any,
    gaps: Any,
) -> None:  # pragma: no cover - compiled
    """Channels ``[r0, r1)`` of a WaveNet layer's res/skip conv of the gated ``acts [C, T]``:
    ``x_next = x + res`` and ``skip += skip part`` on those rows, the gaps' columns of
    ``x_next`` zeroed (the last layer: its ``C`` rows all skip)."""
    c, t = rs_w.shape[1], acts.shape[1]
    count, pad = r1 - r0, (R - 1) // 2
    _pointwise(sgemm, rs_w[r0:r1], rs_b[r0:r1], count, acts, 0, rs, 0, t)
    if last:
        for r in range(count):
            accumulate_row(rs[r, :t], skip[r0 + r])
        return
    _pointwise(
        sgemm, rs_w[c + r0 : c + r1], rs_b[c + r0 : c + r1], count, acts, 0, rs[count:], 0, t
    )
    for r in range(count):
        src, dst, res = x[r0 + r, pad : pad + t], x_next[r0 + r, pad : pad + t], rs[r, :t]
        for q in range(t):
            dst[q] = src[q] + res[q]
        accumulate_row(rs[count + r, :t], skip[r0 + r])
    zero_outside(x_next[r0:r1, pad:], t, 0, t, gaps)


_FLOW = types.void(
    _IN2, _OUT3, _IN3, _IN2, _IN5, _IN3, _IN4, _IN3, _IN3, _IN2, _GAPS, _BOUNDS, _BOUNDS,
    _COUNTER, _OUT3, _OUT2, _OUT2, _OUT2, _OUT2, _OUT1, _OUT1, _OUT1, _I64, _I64,
)  # fmt: skip


@kernels.kernel(_FLOW)
def _flow_steps(
    first: Any,
    outs: Any,
    pre_w: Any,
    pre_b: Any,
    in_u: Any,
    in_b: Any,
    rs_w: Any,
    rs_b: Any,
    post_w: Any,
    post_b: Any,
    gaps: Any,
    rows: Any,
    halves: Any,
    sync: Any,
    streams: Any,
    skip: Any,
    x_in: Any,
    rs: Any,
    m: Any,
    vbuf: Any,
    pbuf: Any,
    phases: Any,
    sgemm: Any,
    yield_fn: Any,
) -> None:  # pragma: no cover - compiled
    """:func:`run_flow`'s lane: every step's pieces (channel ranges, ``rows`` of the hidden
    channels, ``halves`` of a half's) it claims, in step order, with its own buffers (``rs``,
    ``m`` and the transforms'); ``outs``, the residual streams, ``x_in``, ``skip`` and
    ``sync`` shared. A lane's first piece of a layer's gate transforms the whole stream
    (each lane its own copy: a core's products read every channel)."""
    couplings, layers = in_u.shape[0], in_u.shape[1]
    c, t = pre_w.shape[1], first.shape[1]
    pad = (R - 1) // 2
    blocks = (t + M - 1) // M
    v = vbuf[: POINTS * c * blocks].reshape((POINTS, c, blocks))
    ph = phases[: M * (blocks + (POINTS - 1) // M)].reshape((M, blocks + (POINTS - 1) // M))
    steps = 2 * layers + 2
    for k in range(couplings):
        z = first if k == 0 else outs[(k - 1) % 2]
        out = outs[k % 2]
        flip = k < couplings - 1  # the next coupling's input: channels reversed
        for s in range(steps):
            at = (k * steps + s) * _SYNC_WORDS
            bounds = halves if s == steps - 1 else rows
            layer, gate = (s - 1) // 2, s % 2 == 1
            transformed = False
            while True:
                p = _atomic_add(_address(sync) + 8 * at, 1)
                if p >= bounds.shape[0] - 1:
                    break
                r0, r1 = bounds[p], bounds[p + 1]
                if s == 0:  # the pre conv of z[:half] into the first stream; skip zeroed
                    x0 = streams[0]
                    _pointwise(
                        sgemm, pre_w[k, r0:r1], pre_b[k, r0:r1], r1 - r0, z, 0, x0[r0:r1], pad, t
                    )
                    zero_outside(x0[r0:r1, pad:], t, 0, t, gaps)
                    skip[r0:r1] = 0
                elif s == steps - 1:  # the post conv and the output
                    _pointwise(sgemm, post_w[k, r0:r1], post_b[k, r0:r1], r1 - r0, skip, 0, m, 0, t)
                    _coupling_out(z, m, out, r0, r1, 0, t, flip)
                elif gate:
                    if not transformed:
                        x = streams[layer % 2]
                        input_4_5(x.reshape(-1), x.shape[1], 0, t + R - 1, v, ph)
                        transformed = True
                    _in_layer_rows(
                        sgemm, in_u[k, layer], in_b[k, layer], v, t, r0, r1, x_in, pbuf, ph
                    )
                else:
                    _res_skip_rows(
                        sgemm, rs_w[k, layer], rs_b[k, layer], x_in[:c], r0, r1,
                        layer == layers - 1, streams[layer % 2], streams[(layer + 1) % 2],
                        skip, rs, gaps,
                    )  # fmt: skip
                _atomic_add(_address(sync) + 8 * (at + _SYNC_WORDS // 2), 1)
            _wait_done(sync, at + _SYNC_WORDS // 2, bounds.shape[0] - 1, yield_fn)


def _cut(n: int, pieces: int) -> np.ndarray:
    """``pieces`` ranges of ``[0, n)`` (``1 <= pieces <= n``), none empty: bounds [pieces + 1]
    int64."""
    return np.array([i * n // pieces for i in range(pieces + 1)], np.int64)


def run_flow(z: np.ndarray, flow: Flow, gaps: np.ndarray, lanes: int) -> np.ndarray:
    """The reverse flow's couplings (each: flip the channels, then :func:`run`'s coupling) on
    ``z [2 half, T]`` (float32; ``gaps`` as :func:`run`'s), returned as a new array, up to
    float32 summation order the couplings' tiles' result, on up to ``lanes`` cores at once.

    Each step of a coupling (its pre conv; per WaveNet layer its in-layer conv and gate, then
    its res/skip conv and adds; its post conv and output) is cut in one piece a core by
    **channels**: a piece computes its rows of the step's products over every column, so
    each core reads its share of the weights, not all of them, and no column is computed
    twice. No piece of a step starts before every piece of the step before it is done (the
    residual stream is kept whole in two buffers, one read and one written; the gated
    activations and the skip sum are shared). Pieces are claimed from a shared counter a
    step, so a core that joins late takes fewer or none, one core alone runs them all, and
    a core waits only for pieces a running core claimed; the pieces (one a lane, so as many
    as ``lanes``, at most one a channel) fix the products, so for a given ``lanes`` the
    result is the same bits whichever cores ran them. The four couplings are one split
    over the cores (one hand-over of the thread pool, not four), a coupling writing its
    output with the channels flipped for the next.

    The flow's packed weights (43 MB for the bundled voice) are more than the cache holds,
    and a short sentence's products are narrow: cut by columns, each core streamed all of
    them (a short sentence's flow took 7.5 ms at two cores; by channels 5.9). Tiles with a
    halo computed 102 columns of a 171-frame coupling on each of two cores."""
    half, c, layers = flow.pre_w.shape[2], flow.pre_w.shape[1], flow.in_u.shape[1]
    t = z.shape[1]
    if (
        z.dtype != np.float32
        or z.shape != (2 * half, t)
        or t < 1
        or lanes < 1
        or not gaps_fit(gaps, t)
    ):
        raise ValueError("coupling_tiles.run_flow: operands of the wrong shape, dtype or layout")
    pieces = max(1, min(lanes, half, c))
    rows, halves = _cut(c, pieces), _cut(half, pieces)
    most, most_half = int(np.diff(rows).max()), int(np.diff(halves).max())
    pad = (R - 1) // 2
    blocks = -(-t // M)
    first = np.ascontiguousarray(z[::-1])  # the first coupling's flip
    outs = np.empty((2, 2 * half, t), np.float32)
    streams = np.zeros((2, c, t + 2 * pad), np.float32)  # zero columns outside [0, T)
    skip = np.empty((c, t), np.float32)
    x_in = np.empty((2 * c, t), np.float32)
    sync = np.zeros(flow.couplings * (2 * layers + 2) * _SYNC_WORDS, np.int64)

    def lane() -> None:
        _flow_steps(
            first, outs, flow.pre_w, flow.pre_b, flow.in_u, flow.in_b, flow.rs_w, flow.rs_b,
            flow.post_w, flow.post_b, gaps, rows, halves, sync, streams, skip, x_in,
            np.empty((2 * most, t), np.float32), np.empty((most_half, t), np.float32),
            np.empty(POINTS * c * blocks, np.float32),
            np.empty(POINTS * most * blocks, np.float32),
            np.empty(M * (blocks + (POINTS - 1) // M), np.float32), blas.ADDRESS, SCHED_YIELD,
        )  # fmt: skip

    parallel.on_lanes(lane, pieces)
    result: np.ndarray = outs[(flow.couplings - 1) % 2]
    return result
