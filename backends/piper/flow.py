"""VITS residual coupling flow (mean-only, WaveNet-style coupling nets), run in reverse."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from backends.base import Array, ArrayBackend
from backends.piper import host
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
    prep: Mapping[str, host.ConvWeights], h: Hyper, z: np.ndarray, gaps: host.Gaps = ()
) -> np.ndarray:
    """:func:`flow_reverse` on host arrays with fused convs: z_p [C, T'] -> z [C, T'].

    ``z`` may be a packed batch (``gaps`` zeroed before every conv, see
    :func:`backends.piper.host.zero_gaps`); gap columns of the result are garbage.
    """
    half = h.inter // 2
    for i in reversed(range(0, 2 * h.flow_layers, 2)):
        z = z[::-1]  # Flip (a view; the coupling writes a new array)
        p = f"flow.flows.{i}"
        x0 = z[:half]
        hh = _conv_host(x0, prep[f"{p}.pre"], gaps)
        m = _conv_host(_wavenet_host(prep, h, f"{p}.enc", hh, gaps), prep[f"{p}.post"], gaps)
        out = np.empty((h.inter, z.shape[1]), np.float32)
        out[:half] = x0
        np.subtract(z[half:], m, out=out[half:])
        z = out
    return np.ascontiguousarray(z)


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
        np.tanh(t_act, out=t_act)
        s_act *= np.float32(0.5)  # sigmoid(s) = 0.5 * (1 + tanh(s / 2)), the backend's formula
        np.tanh(s_act, out=s_act)
        s_act += np.float32(1.0)
        s_act *= np.float32(0.5)
        t_act *= s_act
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
