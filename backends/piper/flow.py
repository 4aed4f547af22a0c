"""VITS residual coupling flow (mean-only, WaveNet-style coupling nets), run in reverse."""

from __future__ import annotations

import numpy as np

from backends.base import Array, ArrayBackend
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
