"""HiFi-GAN generator (ResBlock2 variant of Piper's medium voices): latent frames -> audio.

:func:`generate` runs on any array backend. On the numpy backend,
:func:`generate_host` runs the same layers with :mod:`backends.piper.host`'s fused
convolutions (activation, conv, bias, residual, resblock sum and scale in one pass
over cache-sized tiles) over weights prepared once per model
(:func:`prepare_generator`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from backends.base import Array, ArrayBackend
from backends.piper import host, resblock_tiles
from backends.piper.layers import Weights, conv
from backends.piper.loader import Hyper
from backends.workspace import Workspace

_SLOPE = 0.1
_POST_SLOPE = 0.01

PACK_GAP = 8
"""Frames between the members of a packed batch: the widest conv padding of any stage
(conv_pre 3 frames; a resblock's 36 samples at 8 samples a frame) fits in it."""


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
    x = conv(be, w, "dec.conv_post", be.leaky_relu(x, _POST_SLOPE), padding=3)
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


def prepare_generator(
    w: Weights, h: Hyper
) -> tuple[dict[str, host.ConvWeights], dict[str, host.UpWeights]]:
    """The generator's convs and transposed convs as fast-path operands, by module name."""
    ups = {
        f"dec.ups.{i}": host.prepare_up(
            w[f"dec.ups.{i}.weight"], w[f"dec.ups.{i}.bias"], u, (k - u) // 2
        )
        for i, (u, k) in enumerate(zip(h.upsample_rates, h.upsample_kernels, strict=True))
    }
    out = {
        name: host.prepare(w[f"{name}.weight"], w.get(f"{name}.bias"))
        for name in ("dec.conv_pre", "dec.conv_post")
    }
    n_k = len(h.resblock_kernels)
    for i in range(len(h.upsample_rates)):
        for j, dil in enumerate(h.resblock_dilations):
            p = f"dec.resblocks.{i * n_k + j}"
            for m, d in enumerate(dil):
                name = f"{p}.convs.{m}"
                out[name] = host.prepare(w[f"{name}.weight"], w.get(f"{name}.bias"), d)
    return out, ups


def prepare_stages(
    convs: dict[str, host.ConvWeights], h: Hyper
) -> dict[int, resblock_tiles.Packed | None]:
    """Each stage's ResBlock2s packed for the compiled tiles (:func:`resblock_tiles.pack`;
    None where they do not apply), by stage index; empty for other resblocks. The packed
    convs in ``convs`` are replaced by the same convs whose taps are views of the packed
    ones (:func:`resblock_tiles.share_taps`: one copy in the model)."""
    if not all(len(dil) == 2 for dil in h.resblock_dilations):
        return {}
    n_k = len(h.resblock_kernels)
    stages: dict[int, resblock_tiles.Packed | None] = {}
    for i in range(len(h.upsample_rates)):
        names = [f"dec.resblocks.{i * n_k + j}" for j in range(n_k)]
        pairs = [(convs[f"{p}.convs.0"], convs[f"{p}.convs.1"]) for p in names]
        stages[i] = packed = resblock_tiles.pack(pairs)
        if packed is not None:
            for p, (cw1, cw2) in zip(names, resblock_tiles.share_taps(packed, pairs), strict=True):
                convs[f"{p}.convs.0"], convs[f"{p}.convs.1"] = cw1, cw2
    return stages


def generate_host(
    prepared: host.Prepared,
    h: Hyper,
    z: np.ndarray,
    gaps: host.Gaps = (),
    work: Workspace | None = None,
) -> np.ndarray:
    """:func:`generate` on host arrays with the fused paths: z [inter, T'] -> audio [T' * hop].

    ``z`` may be a packed batch: ``gaps`` (in frames) between its members, each at
    least :data:`PACK_GAP` frames wide, are zeroed before every conv (and ``z``'s
    own gap columns with them); the members' samples are then each exactly their
    own (frame ``f`` is samples ``f * hop`` to ``(f + 1) * hop``). The stages' arrays
    are ``work``'s buffers (two slots, in turn; default: new arrays); the audio is a
    new array.
    """
    work = work or Workspace(0)
    prep = prepared.convs
    x = work.take("stage", (prep["dec.conv_pre"].c_out, z.shape[1]))
    host.conv_same(z, prep["dec.conv_pre"], x, post_slope=_SLOPE, gaps=gaps)
    n_k = len(h.resblock_kernels)
    stages = len(h.upsample_rates)
    rate = 1
    for i in range(stages):
        up = prepared.ups[f"dec.ups.{i}"]
        ups = work.take("ups", (up.c_out, host.transposed_length(up, x.shape[1])))
        x = host.conv_transpose(x, up, _scaled(gaps, rate), out=ups)
        rate *= h.upsample_rates[i]
        at = _scaled(gaps, rate)
        acc = work.take("stage", x.shape)  # the stage's activated output
        post = _SLOPE if i < stages - 1 else _POST_SLOPE
        names = [f"dec.resblocks.{i * n_k + j}" for j in range(n_k)]
        if all(len(dil) == 2 for dil in h.resblock_dilations):  # Piper's ResBlock2
            blocks = [(prep[f"{p}.convs.0"], prep[f"{p}.convs.1"]) for p in names]
            packed = prepared.stages.get(i)
            host.resblocks(x, blocks, acc, slope=_SLOPE, post_slope=post, gaps=at, packed=packed)
        else:
            _resblocks_by_conv(prep, h, names, x, acc, post, at)
        x = acc
    audio = np.empty((1, x.shape[1]), np.float32)
    host.conv_same(x, prep["dec.conv_post"], audio, gaps=_scaled(gaps, rate))
    np.tanh(audio, out=audio)
    return audio.reshape(-1)


def _resblocks_by_conv(
    prep: Mapping[str, host.ConvWeights],
    h: Hyper,
    names: list[str],
    x: np.ndarray,
    acc: np.ndarray,
    post: float,
    at: host.Gaps,
) -> None:
    """A stage's resblocks of any depth, one fused conv over the whole stage at a time."""
    inner = max(len(dil) for dil in h.resblock_dilations) - 1
    bufs = [np.empty_like(x) for _ in range(min(inner, 2))]  # inner outputs, reused
    for j, (p, dil) in enumerate(zip(names, h.resblock_dilations, strict=True)):
        last = j == len(names) - 1
        src = x
        for m in range(len(dil) - 1):
            cw = prep[f"{p}.convs.{m}"]
            host.conv_same(src, cw, bufs[m % 2], slope=_SLOPE, residual=True, gaps=at)
            src = bufs[m % 2]
        host.conv_same(
            src,
            prep[f"{p}.convs.{len(dil) - 1}"],
            acc,
            slope=_SLOPE,
            residual=True,
            add_to=j > 0,
            scale=1.0 / len(names) if last else None,
            post_slope=post if last else None,
            gaps=at,
        )


def _scaled(gaps: host.Gaps, rate: int) -> list[tuple[int, int]]:
    """Frame gaps as sample ranges at ``rate`` samples per frame."""
    return [(a * rate, b * rate) for a, b in gaps]
