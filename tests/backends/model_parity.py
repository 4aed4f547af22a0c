"""Model-level parity checks of an array backend against the numpy reference.

Shared by the OpenCL (PoCL in CI) and CUDA (GPU machines) model tests. Tolerances,
declared before comparing: Silero VAD probabilities within 1e-4; Whisper tiny.en
identical tokens and text; Piper with zero noise identical durations and audio
within 1e-3 per sample. Inputs are short to keep the checks fast.
"""

from __future__ import annotations

import functools
import json
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

VAD_ATOL = 1e-4
PIPER_ATOL = 1e-3
DATA = Path(__file__).parents[1] / "data"


@functools.cache
def vad_audio() -> np.ndarray:
    from tests.models.silero_vad_reference import fixture

    audio, _ = fixture()
    return audio[: 16000 * 3 + 200]  # 3 s, not a multiple of the 512-sample chunk


def check_silero_vad(backend: Any) -> float:
    """Offline and streamed probabilities vs numpy; returns the max abs error."""
    from backends.silero_vad import VadRequest, load_factory

    audio = vad_audio()
    ref = load_factory().create().run(VadRequest(audio)).probabilities
    factory = load_factory(backend)
    session = factory.create()
    got = session.run(VadRequest(audio)).probabilities
    assert got.shape == ref.shape and got.dtype == np.float32
    assert (ref > 0.5).any() and (ref < 0.5).any()  # speech and silence both present
    streamed = np.array([c.probability for c in factory.clone(session).stream(VadRequest(audio))])
    err = max(float(np.max(np.abs(got - ref))), float(np.max(np.abs(streamed - ref))))
    assert err < VAD_ATOL, err
    return err


def check_silero_vad_forks(backend: Any, fork: Callable[[], Any]) -> None:
    """Sessions on forked views (own queue/stream) share the weights and agree bit for bit."""
    from backends.silero_vad import VadRequest, load_factory
    from backends.silero_vad.session import SileroVadFactory

    factory = load_factory(backend)
    audio = vad_audio()[:16000]
    expected = factory.create().run(VadRequest(audio)).probabilities
    for _ in range(3):
        view = fork()
        forked = SileroVadFactory(view, factory.weights, factory.mode)
        assert forked.weights is factory.weights
        assert np.array_equal(forked.create().run(VadRequest(audio)).probabilities, expected)


def check_whisper(backend: Any) -> str:
    """short.wav: identical tokens and text; returns the text."""
    from backends.whisper import WhisperRequest, load_factory

    with wave.open(str(DATA / "whisper" / "short.wav")) as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").copy()
    ref = load_factory().create().run(WhisperRequest(pcm))
    got = load_factory(backend).create().run(WhisperRequest(pcm))
    assert [w.result.tokens for w in got.windows] == [w.result.tokens for w in ref.windows]
    assert got.text == ref.text
    assert "kitchen" in got.text
    return got.text


def check_piper(backend: Any) -> float:
    """A 31-id sentence with zero noise: same durations, audio within 1e-3; returns the error."""
    from backends.piper import load_model

    cases = json.loads((DATA / "piper" / "phoneme_ids.json").read_text(encoding="utf-8"))["cases"]
    ids = np.array(cases[0]["ids"][0])
    ref = load_model().synthesize_ids(ids, 0.0, 1.0, 0.0, np.random.default_rng(7))
    got = load_model(backend).synthesize_ids(ids, 0.0, 1.0, 0.0, np.random.default_rng(7))
    np.testing.assert_array_equal(got.durations, ref.durations)
    assert got.audio.shape == ref.audio.shape
    assert float(np.max(np.abs(ref.audio))) > 0.05  # real speech, not a silent pass
    err = float(np.max(np.abs(got.audio - ref.audio)))
    assert err <= PIPER_ATOL, err
    return err
