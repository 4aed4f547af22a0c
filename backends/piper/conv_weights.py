"""A Conv1d's weights as Piper's numpy fast paths take them (:func:`backends.piper.host.prepare`
builds them): per-tap matrices, the bias, and where they apply Winograd's filters or the
output rows' pieces. Its own module so that the compiled tiles
(:mod:`backends.piper.resblock_tiles`, :mod:`backends.piper.coupling_tiles`) can take them
without importing :mod:`backends.piper.host`, which runs them."""

from __future__ import annotations

import functools

import attrs
import numpy as np

from backends.piper import winograd


@attrs.frozen(eq=False, slots=False)
class ConvWeights:
    """A Conv1d prepared for :func:`conv_same`: per-tap matrices ``[K, C_out, C_in]`` and the
    bias ``[C_out, 1]``; the im2col operand (:attr:`matrix`) is built when first needed."""

    taps: np.ndarray
    bias: np.ndarray
    dilation: int
    winograd: winograd.Filters | None = None
    """The taps transformed for Winograd's minimal filtering, where it applies
    (:func:`backends.piper.winograd.prepare`): :func:`add_conv` then uses them."""
    rows: np.ndarray | None = None
    """Where the conv's per-tap GEMMs are cut into pieces of output rows (int64 [pieces, 2]:
    first row, end row) that :func:`add_conv` hands to the caller's lanes
    (:func:`blas.conv_rows`); None: one piece."""

    @property
    def kernel(self) -> int:
        return int(self.taps.shape[0])

    @property
    def c_out(self) -> int:
        return int(self.taps.shape[1])

    @property
    def padding(self) -> int:
        """The "same" padding at each end."""
        return self.dilation * (self.kernel - 1) // 2

    @functools.cached_property
    def matrix(self) -> np.ndarray:
        """``[C_out, C_in * K + 1]``: rows (channel, tap), bias last (the im2col GEMM's operand)."""
        k, c_out, c_in = self.taps.shape
        w = self.taps.transpose(1, 2, 0).reshape(c_out, c_in * k)
        return np.ascontiguousarray(np.concatenate([w, self.bias], axis=1), dtype=np.float32)
