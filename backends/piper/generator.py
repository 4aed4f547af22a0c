"""HiFi-GAN generator (ResBlock2 variant of Piper's medium voices): latent frames -> audio."""

from __future__ import annotations

from backends.base import Array, ArrayBackend
from backends.piper.layers import Weights, conv
from backends.piper.loader import Hyper

_SLOPE = 0.1


def generate(be: ArrayBackend, w: Weights, h: Hyper, z: Array) -> Array:
    """z [1, inter, T'] -> audio [1, 1, T' * hop]."""
    x = conv(be, w, "dec.conv_pre", z, padding=3)
    n_k = len(h.resblock_kernels)
    for i, (u, k) in enumerate(zip(h.upsample_rates, h.upsample_kernels, strict=True)):
        x = be.leaky_relu(x, _SLOPE)
        x = be.conv_transpose1d(
            x, w[f"dec.ups.{i}.weight"], w[f"dec.ups.{i}.bias"], u, (k - u) // 2
        )
        # every resblock starts with leaky_relu(x): compute it once (the ONNX graph does too)
        x_act = be.leaky_relu(x, _SLOPE)
        xs: Array | None = None
        for j, (rk, dil) in enumerate(zip(h.resblock_kernels, h.resblock_dilations, strict=True)):
            y = _resblock(be, w, f"dec.resblocks.{i * n_k + j}", x, x_act, rk, dil)
            xs = y if xs is None else be.add(xs, y)
        assert xs is not None
        x = be.scale(xs, 1.0 / n_k)
    x = conv(be, w, "dec.conv_post", be.leaky_relu(x, 0.01), padding=3)
    return be.tanh(x)


def _resblock(
    be: ArrayBackend,
    w: Weights,
    p: str,
    x: Array,
    x_act: Array,
    kernel: int,
    dilations: tuple[int, ...],
) -> Array:
    for m, d in enumerate(dilations):
        xt = x_act if m == 0 else be.leaky_relu(x, _SLOPE)
        xt = conv(be, w, f"{p}.convs.{m}", xt, padding=d * (kernel - 1) // 2, dilation=d)
        x = be.add(xt, x)
    return x
