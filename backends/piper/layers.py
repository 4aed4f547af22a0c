"""Small VITS building blocks on the array backend, over ``[batch, channels, time]``."""

from __future__ import annotations

from collections.abc import Mapping

from backends.base import Array, ArrayBackend

Weights = Mapping[str, Array]
"""Device weights by PyTorch name (see :mod:`backends.piper.loader`)."""


def conv(
    be: ArrayBackend,
    w: Weights,
    name: str,
    x: Array,
    *,
    padding: int = 0,
    dilation: int = 1,
    groups: int = 1,
) -> Array:
    """The Conv1d module ``name`` (bias optional, as in the checkpoint)."""
    return be.conv1d(x, w[f"{name}.weight"], w.get(f"{name}.bias"), 1, padding, dilation, groups)


def channel_norm(be: ArrayBackend, w: Weights, name: str, x: Array) -> Array:
    """VITS LayerNorm: normalise over channels of a channels-first tensor (eps 1e-5)."""
    y = be.layer_norm(be.transpose(x, (0, 2, 1)), w[f"{name}.gamma"], w[f"{name}.beta"], 1e-5)
    return be.transpose(y, (0, 2, 1))


def split_channels(be: ArrayBackend, x: Array, at: int) -> tuple[Array, Array]:
    c = x.shape[1]
    return be.slice(x, 1, 0, at), be.slice(x, 1, at, c)
