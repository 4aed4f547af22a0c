"""VITS's channel norm over columns (backends.piper.column_norm): the numpy backend's row
kernel's bits, without its transposed copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.numpy_backend import NumpyBackend
from backends.piper import column_norm
from backends.piper.layers import channel_norm


def _by_rows(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """What the text encoder ran until session 24: the backend's channel norm (transposed rows)."""
    w = {"n.gamma": gamma, "n.beta": beta}
    return np.asarray(channel_norm(NumpyBackend(), w, "n", x[None]))[0]


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    c=st.integers(1, 40),
    t=st.integers(1, 30),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    shift=st.sampled_from([0.0, 3.0, -1e3]),
)
def test_the_norm_over_columns_has_the_row_kernels_bits(
    seed: int, c: int, t: int, scale: float, shift: float
) -> None:
    """Channels under eight, eight, more and not a multiple of eight (the row kernel's eight
    partial sums), any length, values far from zero."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((c, t)) * scale + shift).astype(np.float32)
    gamma, beta = (rng.standard_normal(c).astype(np.float32) for _ in range(2))
    out = np.empty_like(x)
    column_norm.channel_norm(x, gamma, beta, np.float32(1e-5), out, np.empty((10, t), np.float32))
    np.testing.assert_array_equal(out, _by_rows(x, gamma, beta))


def test_the_voices_encoder_norms_are_unchanged() -> None:
    """The bundled voice's text encoder (192 channels) on a sentence's length: the same bits."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((192, 57)).astype(np.float32) * 4
    gamma, beta = (rng.standard_normal(192).astype(np.float32) for _ in range(2))
    out = np.empty_like(x)
    column_norm.channel_norm(x, gamma, beta, np.float32(1e-5), out, np.empty((10, 57), np.float32))
    np.testing.assert_array_equal(out, _by_rows(x, gamma, beta))


@pytest.mark.parametrize(
    ("out", "gamma", "sums"),
    [
        ((4, 6), (4,), (10, 5)),
        ((4, 5), (3,), (10, 5)),
        ((4, 5), (4,), (9, 5)),
        ((5, 5), (4,), (10, 5)),
    ],
)
def test_inconsistent_shapes_are_refused(
    out: tuple[int, int], gamma: tuple[int], sums: tuple[int, int]
) -> None:
    x = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match="channel_norm"):
        column_norm.channel_norm(
            x, np.ones(gamma, np.float32), np.zeros(gamma, np.float32), np.float32(1e-5),
            np.empty(out, np.float32), np.empty(sums, np.float32),
        )  # fmt: skip
