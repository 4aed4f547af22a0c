"""VITS's LayerNorm of a channels-first tensor ``[C, T]`` over its channels, compiled.

The numpy backend normalises rows (:func:`backends.kernels.layer_norm`): a channels-first
tensor is transposed, copied, normalised and transposed back. Here each column gets the
float32 operations the row kernel does on it as a row (its eight interleaved partial sums,
in its order), all columns at once, so the loops run along the rows and the results are
the row kernel's bit for bit (a NaN's sign aside). The duration predictor's DDS layers
(:mod:`backends.piper.duration`) and the text encoder (:mod:`backends.piper.text_encoder`)
use it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba.core import types

from backends import kernels

SUMS = 10
"""Rows of a channel norm's scratch: eight partial sums, the mean and the deviation, a column
each."""


@kernels.compiled
def norm_columns(
    x: Any, gamma: Any, beta: Any, eps: Any, out: Any, sums: Any
) -> None:  # pragma: no cover - compiled
    """``out = norm(x)`` over the channels of ``x [C, T]`` (VITS's LayerNorm of a channels-first
    tensor): each column's float32 operations those :func:`backends.kernels.layer_norm` does
    on it as a row (its eight interleaved partial sums, in its order), all columns at once, so
    the loops run along the rows."""
    c, t = x.shape
    size = np.float32(c)
    _column_sums(x, sums, False)
    mean = sums[8]
    for q in range(t):
        mean[q] = _folded(sums, q) / size
    for r in range(c):
        for q in range(t):
            out[r, q] = x[r, q] - mean[q]
    _column_sums(out, sums, True)
    std = sums[9]
    for q in range(t):
        std[q] = np.sqrt(_folded(sums, q) / size + eps)
    for r in range(c):
        g, b = gamma[r], beta[r]
        for q in range(t):
            out[r, q] = out[r, q] / std[q] * g + b


@kernels.compiled
def _folded(sums: Any, q: Any) -> Any:  # pragma: no cover - compiled
    """Column ``q``'s eight partial sums added as :func:`backends.kernels._row_sum` adds them."""
    return ((sums[0, q] + sums[1, q]) + (sums[2, q] + sums[3, q])) + (
        (sums[4, q] + sums[5, q]) + (sums[6, q] + sums[7, q])
    )


@kernels.compiled
def _column_sums(x: Any, sums: Any, squares: Any) -> None:  # pragma: no cover - compiled
    """``sums[k]`` = the sum of rows ``k, k + 8, ...`` of ``x`` (or of ``x * x``, each square
    rounded to float32 first, as the row kernel stores it, when ``squares``; the rows past
    the last full eight added to ``sums[0]``), in row order: a row's partial sums as
    :func:`backends.kernels._row_sum` makes them, for every column."""
    c, t = x.shape
    sums[:8, :t] = 0
    end = c - c % 8
    for r in range(c):
        s, row = sums[r % 8 if r < end else 0], x[r]
        if squares:
            for q in range(t):
                v = row[q] * row[q]
                s[q] += v
        else:
            for q in range(t):
                s[q] += row[q]


_IN1, _IN2, _OUT2 = (
    kernels.array_type(1, readonly=True),
    kernels.array_type(2, readonly=True),
    kernels.array_type(2),
)


@kernels.kernel(types.void(_IN2, _IN1, _IN1, types.float32, _OUT2, _OUT2))
def channel_norm(
    x: Any, gamma: Any, beta: Any, eps: Any, out: Any, sums: Any
) -> None:  # pragma: no cover
    """:func:`norm_columns` for Python callers: ``out = norm(x)`` for ``x, out [C, T]`` (not
    the same array), ``gamma, beta [C]``, ``sums [SUMS, T]`` scratch; other shapes refused."""
    c, t = x.shape
    if (
        out.shape != x.shape or gamma.shape[0] != c or beta.shape[0] != c
        or sums.shape[0] != SUMS or sums.shape[1] != t
    ):  # fmt: skip
        raise ValueError("channel_norm: x, out [C, T], gamma, beta [C], sums [10, T]")
    norm_columns(x, gamma, beta, eps, out, sums)
