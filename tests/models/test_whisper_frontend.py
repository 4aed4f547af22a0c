"""Log-mel features match faster-whisper's FeatureExtractor."""

from __future__ import annotations

import numpy as np
import pytest

from backends.whisper.frontend import log_mel, mel_filters, pad_or_trim

fe_module = pytest.importorskip("faster_whisper.feature_extractor")


@pytest.mark.parametrize("samples", [16000 * 3 + 77, 16000 * 31, 400])
def test_log_mel_matches_faster_whisper(samples: int) -> None:
    rng = np.random.default_rng(samples)
    t = np.arange(samples) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(samples)).astype(
        np.float32
    )
    reference = fe_module.FeatureExtractor()(audio)
    ours = log_mel(audio)
    assert ours.shape == reference.shape == (80, (samples + 160) // 160)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


def test_mel_filters_match() -> None:
    reference = fe_module.FeatureExtractor().mel_filters
    np.testing.assert_allclose(mel_filters(), reference, atol=1e-7, rtol=0)


def test_pad_or_trim() -> None:
    x = np.ones((80, 10), np.float32)
    padded = pad_or_trim(x)
    assert padded.shape == (80, 3000) and padded[:, 10:].sum() == 0 and padded[:, :10].sum() == 800
    assert pad_or_trim(np.ones((80, 3500), np.float32)).shape == (80, 3000)


def test_rejects_stereo() -> None:
    with pytest.raises(ValueError):
        log_mel(np.zeros((2, 1600), np.float32))
