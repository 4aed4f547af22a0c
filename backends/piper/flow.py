"""VITS residual coupling flow (mean-only, WaveNet-style coupling nets), run in reverse."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from backends import kernels, parallel
from backends.base import Array, ArrayBackend
from backends.piper import blas, coupling_tiles, host
from backends.piper.layers import Weights, conv, split_channels
from backends.piper.loader import Hyper


def flow_reverse(be: ArrayBackend, w: Weights, h: Hyper, z: Array) -> Array:
    """z_p [1, C, T'] -> z [1, C, T']: Flip, coupling 6, Flip, coupling 4, ... coupling 0."""
    flip = np.arange(h.inter)[::-1].copy()
    for i in reversed(range(0, 2 * h.flow_layers, 2)):
        z = be.take(z, flip, 1)
        z = _coupling_reverse(be, w, h, f"flow.flows.{i}", z)
    return z


def _coupling_reverse(be: ArrayBackend, w: Weights, h: Hyper, p: str, z: Array) -> Array:
    x0, x1 = split_channels(be, z, h.inter // 2)
    hh = conv(be, w, f"{p}.pre", x0)
    hh = _wavenet(be, w, h, f"{p}.enc", hh)
    m = conv(be, w, f"{p}.post", hh)
    return be.concat([x0, be.sub(x1, m)], 1)


def _wavenet(be: ArrayBackend, w: Weights, h: Hyper, p: str, x: Array) -> Array:
    """Gated dilated convs (dilation rate 1) with residual and skip outputs."""
    c = h.hidden
    out: Array | None = None
    for j in range(h.flow_wn_layers):
        x_in = conv(be, w, f"{p}.in_layers.{j}", x, padding=(h.flow_kernel - 1) // 2)
        t_act, s_act = split_channels(be, x_in, c)
        acts = be.mul(be.tanh(t_act), be.sigmoid(s_act))
        rs = conv(be, w, f"{p}.res_skip_layers.{j}", acts)
        if j < h.flow_wn_layers - 1:
            res, skip = split_channels(be, rs, c)
            x = be.add(x, res)
        else:
            skip = rs
        out = skip if out is None else be.add(out, skip)
    assert out is not None
    return out


def prepare_flow(w: Weights, h: Hyper) -> dict[str, host.ConvWeights]:
    """The coupling nets' convs as fused-conv operands (host arrays), by module name."""
    out = {}
    for i in range(0, 2 * h.flow_layers, 2):
        p = f"flow.flows.{i}"
        names = [f"{p}.pre", f"{p}.post"]
        for j in range(h.flow_wn_layers):
            names += [f"{p}.enc.in_layers.{j}", f"{p}.enc.res_skip_layers.{j}"]
        for name in names:
            out[name] = host.prepare(w[f"{name}.weight"], w.get(f"{name}.bias"))
    return out


def flow_reverse_host(
    prep: Mapping[str, host.ConvWeights],
    h: Hyper,
    z: np.ndarray,
    gaps: host.Gaps = (),
    packed: Mapping[str, coupling_tiles.Packed | None] | None = None,
    stacked: coupling_tiles.Flow | None = None,
) -> np.ndarray:
    """:func:`flow_reverse` on host arrays with fused convs: z_p [C, T'] -> z [C, T'].

    ``z`` may be a packed batch (``gaps`` zeroed before every conv, see
    :func:`backends.piper.host.zero_gaps`); gap columns of the result are garbage.
    On one core the couplings run conv by conv; on several, each coupling runs depth
    first in column tiles over the cores (:func:`_coupling_tile`). A coupling in
    ``packed`` (:func:`prepare_couplings`) runs in compiled tiles instead, one call per
    core without the GIL (:mod:`backends.piper.coupling_tiles`): the same tiles on several
    cores, one tile as wide as ``z`` on one. With them all ``stacked``
    (:func:`stack_couplings`), several cores run the four couplings in one compiled split,
    step by step, each core its share of every step's channels (:func:`coupling_tiles.run_flow`).
    """
    half = h.inter // 2
    tile = _coupling_tile(z.shape[1])
    at = np.clip(np.array(gaps, np.int64).reshape(-1, 2), 0, z.shape[1])  # as slicing clips
    if stacked is not None and tile is not None and USE_LOCKSTEP and USE_COMPILED_TILES:
        return coupling_tiles.run_flow(z, stacked, at, parallel.SHARE.share())
    for i in reversed(range(0, 2 * h.flow_layers, 2)):
        z = z[::-1]  # Flip (a view; the coupling writes a new array)
        p = f"flow.flows.{i}"
        x0 = z[:half]
        out = np.empty((h.inter, z.shape[1]), np.float32)
        compiled = (packed or {}).get(p) if USE_COMPILED_TILES and host.use_taps() else None
        if compiled is not None:
            _compiled_coupling(compiled, np.ascontiguousarray(z), out, at, tile)
        elif tile is None:
            hh = _conv_host(x0, prep[f"{p}.pre"], gaps)
            m = _conv_host(_wavenet_host(prep, h, f"{p}.enc", hh, gaps), prep[f"{p}.post"], gaps)
            out[:half] = x0
            np.subtract(z[half:], m, out=out[half:])
        else:
            host.split(
                _CouplingTiles(prep, h, p, z, out, gaps, tile).run, range(0, z.shape[1], tile)
            )
        z = out
    return np.ascontiguousarray(z)


USE_LOCKSTEP = True
"""On several cores, the couplings' steps cut in pieces of channels run in step, all four
couplings in one split (:func:`coupling_tiles.run_flow`); False: each coupling in tiles
with a halo (for comparisons)."""

USE_COMPILED_TILES = True
"""Run the couplings :func:`prepare_couplings` packed in compiled tiles (False: from
Python, for comparisons)."""


def prepare_couplings(
    prep: dict[str, host.ConvWeights], h: Hyper
) -> dict[str, coupling_tiles.Packed | None]:
    """Every coupling's convs packed for the compiled tiles (None where they do not apply),
    by the coupling's module name; the packed convs in ``prep`` are replaced by views of
    the packed weights (:func:`coupling_tiles.share_weights`: one copy in the model)."""
    found: dict[str, coupling_tiles.Packed | None] = {}
    for i in range(0, 2 * h.flow_layers, 2):
        p = f"flow.flows.{i}"
        found[p] = packed = coupling_tiles.pack(prep, p, h.flow_wn_layers)
        if packed is not None:
            coupling_tiles.share_weights(packed, prep, p, h.flow_wn_layers)
    return found


def stack_couplings(
    couplings: dict[str, coupling_tiles.Packed | None], prep: dict[str, host.ConvWeights], h: Hyper
) -> coupling_tiles.Flow | None:
    """The couplings :func:`prepare_couplings` packed, stacked in the order the reverse flow
    runs them (:class:`coupling_tiles.Flow`, for :func:`coupling_tiles.run_flow`; None when
    one of them was not packed). ``couplings`` and the convs in ``prep`` are then replaced
    by views of the stack, so a model still holds one copy of the weights."""
    names = [f"flow.flows.{i}" for i in reversed(range(0, 2 * h.flow_layers, 2))]
    packs = [couplings.get(p) for p in names]
    flow = coupling_tiles.Flow.stack([p for p in packs if p is not None])
    if flow is None or len(packs) != flow.couplings:
        return None
    for k, p in enumerate(names):
        couplings[p] = packed = flow.coupling(k)
        coupling_tiles.share_weights(packed, prep, p, h.flow_wn_layers)
    return flow


def _compiled_coupling(
    packed: coupling_tiles.Packed,
    z: np.ndarray,
    out: np.ndarray,
    gaps: np.ndarray,
    tile: int | None,
) -> None:
    """One coupling in compiled tiles: ``tile`` columns on the caller's cores, or (None: one
    core) one tile over all of ``z``."""
    t = z.shape[1]
    if t == 0:
        return
    width = t if tile is None else tile
    counter = np.zeros(1, np.int64)

    def lane() -> None:
        coupling_tiles.run(z, packed, out, gaps, width, counter)

    parallel.on_lanes(lane, -(-t // width))


COUPLING_TILE = 128
"""About how many output columns one tile of a coupling run depth first covers
(:class:`_CouplingTiles`); inputs shorter than this keep the conv-by-conv path."""


def _coupling_tile(t: int) -> int | None:
    """Columns of a coupling's tiles over ``t`` frames when the caller has several cores:
    ``t`` cut into an even number of tiles of about :data:`COUPLING_TILE` columns, of
    equal width (the last may be narrower), whatever the number of cores, so the values
    never depend on it (:func:`host.split` hands the tiles out to the cores; an even
    count keeps two and four cores evenly loaded: 600 frames on two cores took 92-93 ms
    as five tiles, more than conv by conv, 83-86, and 76-77 as four); None (each conv on
    its own, split by :func:`host.conv_same`) on one core, for an input shorter than
    :data:`COUPLING_TILE` or without numpy's BLAS (:mod:`backends.piper.blas`). A
    coupling's convs are small (255 frames of a sentence: 1-2 ms a conv), so splitting
    each one over the cores costs a hand-over per conv (about 40 a coupling), more than
    it saves: the flow at two threads took as long as at one. Tiles run the whole
    coupling instead, one hand-over per coupling, for a halo of
    ``layers * (kernel - 1) / 2`` columns computed twice."""
    if parallel.SHARE.share() <= 1 or t < COUPLING_TILE or not host.use_taps():
        return None
    tiles = 2 * max(1, round(t / (2 * COUPLING_TILE)))
    return -(-t // tiles)


class _CouplingTiles:
    """One coupling (reverse, mean-only) over output tiles, depth first: ``out[:half] = x0``
    and ``out[half:] = x1 - post(WN(pre(x0)))``, every conv and gate of a tile over its
    columns plus a halo, with buffers per core. The halo columns that fall outside
    ``[0, T)`` or in ``gaps`` are zeroed before every kernel-``k`` conv (the zero padding
    and packed-batch masking :func:`host.conv_same` applies); a layer's output is valid
    ``(k - 1) / 2`` columns further in than its input, so after the last layer the
    tile's own columns are. Values equal the conv-by-conv path's up to the GEMMs'
    summation order over a different column count (the thread-count tolerance)."""

    def __init__(
        self,
        prep: Mapping[str, host.ConvWeights],
        h: Hyper,
        p: str,
        z: np.ndarray,
        out: np.ndarray,
        gaps: host.Gaps,
        tile: int,
    ) -> None:
        self.pre, self.post = prep[f"{p}.pre"], prep[f"{p}.post"]
        self.layers = [
            (prep[f"{p}.enc.in_layers.{j}"], prep[f"{p}.enc.res_skip_layers.{j}"])
            for j in range(h.flow_wn_layers)
        ]
        self.h, self.z, self.out, self.gaps, self.tile = h, z, out, gaps, tile
        self.halo = sum(cw.padding for cw, _ in self.layers)
        if any(cw.kernel != 1 for cw in (self.pre, self.post, *(rs for _, rs in self.layers))):
            raise ValueError(f"{p}: pre, post and res_skip must be kernel-1 convs")

    def run(self, starts: Iterator[int]) -> None:
        """The tiles at ``starts`` (one core's share of them)."""
        h, z, halo, tile = self.h, self.z, self.halo, self.tile
        half, c, t = h.inter // 2, h.hidden, z.shape[1]
        width = min(tile, t) + 2 * halo
        x0 = np.empty((half, width), np.float32)
        x = np.empty((c, width), np.float32)
        x_in = np.empty((2 * c, width), np.float32)
        rs = np.empty((2 * c, width), np.float32)
        skip = np.empty((c, width), np.float32)
        m = np.empty((half, width), np.float32)
        for t0 in starts:
            n = min(tile, t - t0)
            w, e0 = n + 2 * halo, t0 - halo
            host.take_columns(z[:half], e0, x0[:, :w])
            _pointwise(self.pre, x0[:, :w], x[:, :w])
            skip[:, :w] = 0
            for j, (cw_in, cw_rs) in enumerate(self.layers):
                host.zero_outside(x[:, :w], e0, t, self.gaps)
                pad = cw_in.padding
                xi = x_in[:, pad : w - pad]
                xi[...] = cw_in.bias
                host.add_conv(xi, cw_in, x[:, :w], 0)
                _gate(xi[:c], xi[c:])
                r = rs[: cw_rs.c_out, pad : w - pad]
                _pointwise(cw_rs, xi[:c], r)
                if j < len(self.layers) - 1:
                    x[:, pad : w - pad] += r[:c]
                    skip[:, pad : w - pad] += r[c:]
                else:
                    skip[:, pad : w - pad] += r
            _pointwise(self.post, skip[:, halo : halo + n], m[:, :n])
            self.out[:half, t0 : t0 + n] = z[:half, t0 : t0 + n]
            np.subtract(z[half:, t0 : t0 + n], m[:, :n], out=self.out[half:, t0 : t0 + n])


def _pointwise(cw: host.ConvWeights, src: np.ndarray, out: np.ndarray) -> None:
    """``out = cw(src)`` for a kernel-1 conv (checked by :class:`_CouplingTiles`): bias, then
    the one tap's GEMM added in."""
    out[...] = cw.bias
    blas.conv_taps(out, cw.taps, src, 0, 1)


def _gate(t_act: np.ndarray, s_act: np.ndarray) -> None:
    """``t_act = tanh(t_act) * sigmoid(s_act)`` in place (``s_act`` left as it is), in one
    compiled pass (:func:`backends.kernels.gate_rows`: within about 2.4e-7 of the backend's
    numpy formulas; six numpy passes took 630-700 us at 192 x 300, the kernel about 200)."""
    if t_act.shape != s_act.shape:
        raise ValueError("gate: the two halves must have one shape")
    if np.may_share_memory(t_act, s_act):
        raise ValueError("gate: the two halves overlap")
    rows, n = t_act.shape
    if rows == 0 or n == 0:
        return
    a, lda = kernels.flat_rows(t_act, writeable=True)
    b, ldb = kernels.flat_rows(s_act, writeable=False)
    kernels.gate_rows(a, lda, b, ldb, rows, n)


def _conv_host(x: np.ndarray, cw: host.ConvWeights, gaps: host.Gaps) -> np.ndarray:
    out = np.empty((cw.c_out, x.shape[1]), np.float32)
    host.conv_same(x, cw, out, gaps=gaps)
    return out


def _wavenet_host(
    prep: Mapping[str, host.ConvWeights], h: Hyper, p: str, x: np.ndarray, gaps: host.Gaps
) -> np.ndarray:
    """:func:`_wavenet` with the gate computed in place: tanh(a) * sigmoid(b)."""
    c = h.hidden
    x = x.copy()
    out: np.ndarray | None = None
    for j in range(h.flow_wn_layers):
        x_in = _conv_host(x, prep[f"{p}.in_layers.{j}"], gaps)
        t_act, s_act = x_in[:c], x_in[c:]
        _gate(t_act, s_act)
        rs = _conv_host(t_act, prep[f"{p}.res_skip_layers.{j}"], gaps)
        if j < h.flow_wn_layers - 1:
            x += rs[:c]
            skip = rs[c:]
        else:
            skip = rs
        if out is None:
            out = skip.copy()
        else:
            out += skip
    assert out is not None
    return out
