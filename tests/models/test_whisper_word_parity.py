"""Word timestamps and the initial prompt against faster-whisper on the TTS fixtures.

faster-whisper runs the same model files (float32, beam 1, temperature 0,
``word_timestamps=True``). On every fixture the words must be the same, in order,
and the median absolute difference of their start and of their end times must be
under :data:`MEDIAN_TOLERANCE_S`. The measured figures are printed (``-s``) and
recorded in docs/performance.md ("Whisper word timestamps").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from backends.whisper import WhisperFactory, WhisperRequest, WhisperResult
from backends.whisper.session import default_model_dir
from tests.models.whisper_audio import FIXTURES, load_wav

MEDIAN_TOLERANCE_S = 0.1
"""Largest accepted median |ours - faster-whisper| of word starts, and of word ends (seconds)."""
PROBABILITY_TOLERANCE = 1e-3
"""Largest accepted |difference| of a word's mean token probability."""

PROMPTED = ("weather", "Forecast: 22°C, sunny, light west wind.")
"""A fixture and a prompt that changes its transcript ("22 degrees" becomes "22°C")."""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference() -> Any:
    faster_whisper = pytest.importorskip("faster_whisper")
    return faster_whisper.WhisperModel(
        str(default_model_dir()), device="cpu", compute_type="float32", cpu_threads=1
    )


def _reference_segments(reference: Any, audio: np.ndarray, **options: Any) -> list[Any]:
    segments, _ = reference.transcribe(
        audio,
        beam_size=1,
        temperature=[0.0],
        vad_filter=False,
        condition_on_previous_text=True,
        **options,
    )
    return list(segments)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_word_timestamps_match_faster_whisper(
    whisper_factory: WhisperFactory, reference: Any, fixture: dict[str, Any]
) -> None:
    audio = load_wav(str(fixture["file"]))
    ours: WhisperResult = whisper_factory.create().run(
        WhisperRequest(audio, temperature=0.0, word_timestamps=True)
    )
    theirs = _reference_segments(reference, audio, word_timestamps=True)
    our_words = [w for s in ours.segments for w in (s.words or ())]
    their_words = [w for s in theirs for w in s.words]
    assert [w.word for w in our_words] == [w.word for w in their_words]
    assert [s.text for s in ours.segments] == [s.text for s in theirs]
    starts = np.abs([a.start - b.start for a, b in zip(our_words, their_words, strict=True)])
    ends = np.abs([a.end - b.end for a, b in zip(our_words, their_words, strict=True)])
    probs = np.abs(
        [a.probability - b.probability for a, b in zip(our_words, their_words, strict=True)]
    )
    print(
        f"{fixture['name']}: {len(our_words)} words, start median {np.median(starts):.3f} s "
        f"max {starts.max():.3f} s, end median {np.median(ends):.3f} s max {ends.max():.3f} s, "
        f"probability max diff {probs.max():.1e}"
    )
    assert np.median(starts) < MEDIAN_TOLERANCE_S
    assert np.median(ends) < MEDIAN_TOLERANCE_S
    assert probs.max() < PROBABILITY_TOLERANCE
    for segment in ours.segments:  # a segment spans its words (times moved to them)
        assert segment.words
        assert segment.start <= segment.words[0].end and segment.words[-1].start <= segment.end
        assert all(w.start <= w.end for w in segment.words)


def test_words_only_when_asked(whisper_factory: WhisperFactory) -> None:
    result = whisper_factory.create().run(WhisperRequest(load_wav("short.wav")))
    assert result.segments and all(s.words is None for s in result.segments)


def test_prompt_matches_faster_whisper_initial_prompt(
    whisper_factory: WhisperFactory, reference: Any
) -> None:
    name, prompt = PROMPTED
    audio = load_wav(f"{name}.wav")
    session = whisper_factory.create()
    plain = session.run(WhisperRequest(audio, temperature=0.0))
    prompted = session.run(WhisperRequest(audio, temperature=0.0, initial_prompt=prompt))
    theirs = _reference_segments(reference, audio, initial_prompt=prompt)
    our_tokens = [t for s in prompted.segments for t in s.tokens]
    assert our_tokens == [t for s in theirs for t in s.tokens]
    assert prompted.text == "".join(s.text for s in theirs)
    assert our_tokens != [t for s in plain.segments for t in s.tokens]
    assert "22°C" in prompted.text and "22°C" not in plain.text
    ids = whisper_factory.tokenizer.encode(" " + prompt)
    as_ids = session.run(WhisperRequest(audio, temperature=0.0, initial_prompt=ids))
    assert [t for s in as_ids.segments for t in s.tokens] == our_tokens
