"""The duration predictor's DDS layers in compiled passes give the op-by-op path's bits."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.numpy_backend import NumpyBackend
from backends.piper import PiperModel, duration, load_model
from backends.piper import model as piper_model
from backends.piper.loader import Hyper
from backends.piper.phonemize import phoneme_ids, phonemize

BE = NumpyBackend()


pytestmark = pytest.mark.usefixtures("one_blas_thread")


def _weights(rng: np.random.Generator, c: int, k: int, layers: int) -> dict[str, np.ndarray]:
    w: dict[str, np.ndarray] = {}
    for j in range(layers):
        p = f"s.convs_sep.{j}"
        w[f"{p}.weight"] = rng.standard_normal((c, 1, k), dtype=np.float32)
        w[f"{p}.bias"] = rng.standard_normal(c, dtype=np.float32)
        w[f"s.convs_1x1.{j}.weight"] = rng.standard_normal((c, c, 1), dtype=np.float32) * 0.3
        w[f"s.convs_1x1.{j}.bias"] = rng.standard_normal(c, dtype=np.float32)
        for n in (f"s.norms_1.{j}", f"s.norms_2.{j}"):
            w[f"{n}.gamma"] = rng.standard_normal(c, dtype=np.float32)
            w[f"{n}.beta"] = rng.standard_normal(c, dtype=np.float32)
    return w


def _both(w: dict[str, np.ndarray], h: Hyper, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for compiled in (False, True):
        duration.USE_COMPILED_LAYERS = compiled
        try:
            out.append(np.asarray(duration._dds_conv(BE, w, h, "s", x.copy())))
        finally:
            duration.USE_COMPILED_LAYERS = True
    return out[0], out[1]


@settings(max_examples=40, deadline=None)
@given(
    c=st.integers(1, 40),
    t=st.integers(1, 30),
    k=st.sampled_from([1, 3, 5]),
    layers=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_compiled_layers_give_the_bits_of_the_numpy_ops(
    c: int, t: int, k: int, layers: int, seed: int
) -> None:
    """Any channel count (a multiple of eight or not: the norm's partial sums), any length
    (shorter than a dilated kernel's reach too), dilations 1, k, k^2."""
    rng = np.random.default_rng(seed)
    h = attrs.evolve(Hyper(), dp_layers=layers, dp_kernel=k)
    x = rng.standard_normal((1, c, t), dtype=np.float32) * 2
    ops, compiled = _both(_weights(rng, c, k, layers), h, x)
    assert compiled.shape == (1, c, t) and compiled.dtype == np.float32
    np.testing.assert_array_equal(compiled, ops)


@pytest.mark.parametrize("shape", [(2, 6, 9), (1, 6, 0), (1, 0, 9)])
def test_what_the_compiled_layers_do_not_take_goes_op_by_op(shape: tuple[int, int, int]) -> None:
    """A batch of two, or an empty input, keeps the numpy ops' result (a batch's every member,
    an empty array), as a float64 input keeps float64."""
    rng = np.random.default_rng(1)
    h = attrs.evolve(Hyper(), dp_layers=2, dp_kernel=3)
    w = _weights(rng, shape[1], 3, 2)
    x = rng.standard_normal(shape, dtype=np.float32)
    if 0 in shape:
        with pytest.raises(ValueError):
            duration._dds_conv(BE, w, h, "s", x)
        return
    ops, compiled = _both(w, h, x)
    assert compiled.shape == shape
    np.testing.assert_array_equal(compiled, ops)
    wide = np.asarray(duration._dds_conv(BE, w, h, "s", x[:1].astype(np.float64)))
    assert wide.dtype == np.float64


def test_compiled_layers_refuse_operands_of_the_wrong_shape() -> None:
    x = np.zeros((4, 6), np.float32)
    eps = np.float32(1e-5)
    v = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="taps"):
        duration._depthwise_norm_gelu(
            x, np.zeros((4, 2), np.float32), v, 1, v, v, eps, x.copy(), x.copy(),
            np.zeros((10, 6), np.float32),
        )  # fmt: skip
    with pytest.raises(ValueError, match="sums"):
        duration._norm_gelu_add(
            x.copy(), v, v, eps, x.copy(), x.copy(), np.zeros((9, 6), np.float32)
        )


@functools.cache
def _model() -> PiperModel:
    return load_model()


@pytest.mark.parametrize(
    "text",
    [
        "Yes.",
        "Hello world, this is a test.",
        "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
        "A much longer sentence, with commas, numbers like 42, and more words, so that its "
        "phonemes outnumber the predictor's one hundred and ninety two channels.",
    ],
)
def test_the_voices_log_durations_are_the_same_bits(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real predictor's inputs (the encoder's output on a sentence, noise drawn at
    noise_w 0.8) through both paths: the same log durations, bit for bit."""
    model = _model()
    seen: list[tuple[Any, ...]] = []
    original = piper_model.log_durations

    def capture(*args: Any) -> np.ndarray:
        seen.append(args)
        return original(*args)

    monkeypatch.setattr(piper_model, "log_durations", capture)
    ids = np.array(phoneme_ids(phonemize(text, model.config)[0], model.config), np.int64)
    model.synthesize_ids(ids, 0.667, 1.0, 0.8, np.random.default_rng(5))
    (args,) = seen
    assert args[3].shape[2] == ids.size
    got = []
    for compiled in (False, True):
        monkeypatch.setattr(duration, "USE_COMPILED_LAYERS", compiled)
        got.append(original(*args))
    np.testing.assert_array_equal(got[1], got[0])
