"""Whisper sessions follow the pool contract and keep their state private."""

from __future__ import annotations

import numpy as np
import pytest

from backends.whisper import Segment, WhisperFactory, WhisperRequest, WhisperResult
from core.pool import MAX_PARALLEL_SESSIONS, Interface, Session, SessionFactory

SILENCE = np.zeros(16000 * 3, np.float32)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def baseline(whisper_factory: WhisperFactory, whisper_pcm: np.ndarray) -> WhisperResult:
    """The clip transcribed by a fresh (cold) session."""
    return whisper_factory.create().run(WhisperRequest(whisper_pcm))


def test_protocols_and_capacity(whisper_factory: WhisperFactory) -> None:
    assert isinstance(whisper_factory, SessionFactory)
    assert whisper_factory.capacity() == MAX_PARALLEL_SESSIONS == 16
    primary = whisper_factory.create()
    clone = whisper_factory.clone(primary)
    for session in (primary, clone):
        assert isinstance(session, Session)
        assert (session.family, session.task, session.mode) == (
            whisper_factory.family,
            whisper_factory.task,
            whisper_factory.mode,
        )
        assert session.interfaces == frozenset(
            {Interface.OFFLINE, Interface.STREAMING, Interface.BATCH}
        )
    assert clone.weights is primary.weights
    assert clone.state is not primary.state
    assert clone.state.self_k[0] is not primary.state.self_k[0]


def test_transcript_and_segments(baseline: WhisperResult) -> None:
    assert "lights" in baseline.text and "kitchen" in baseline.text
    assert baseline.text == "".join(s.text for s in baseline.segments)
    assert all(isinstance(s, Segment) and 0 <= s.start < s.end <= 3.6 for s in baseline.segments)
    assert baseline.duration == pytest.approx(3.518, abs=1e-3)


def test_results_do_not_depend_on_session_or_history(
    whisper_factory: WhisperFactory, whisper_pcm: np.ndarray, baseline: WhisperResult
) -> None:
    primary = whisper_factory.create()
    clone = whisper_factory.clone(primary)
    silent = clone.run(WhisperRequest(SILENCE))  # the clone is warm with another input
    assert silent.segments == () and silent.text == "" and len(silent.windows) == 1
    assert clone.run(WhisperRequest(whisper_pcm)) == baseline
    assert (
        clone.run(WhisperRequest(whisper_pcm.astype(np.float32) / np.float32(32768.0))) == baseline
    )


def test_stream_and_batch_agree_with_run(
    whisper_factory: WhisperFactory, whisper_pcm: np.ndarray, baseline: WhisperResult
) -> None:
    session = whisper_factory.create()
    streamed = session.stream(WhisperRequest(whisper_pcm))
    first = next(streamed)  # pulled before the rest of the request is decoded
    assert (first, *streamed) == baseline.segments
    results = session.batch([WhisperRequest(whisper_pcm), WhisperRequest(SILENCE)])
    assert results[0] == baseline
    assert results[1].segments == ()


def test_invalid_requests_and_closed_session(whisper_factory: WhisperFactory) -> None:
    with pytest.raises(ValueError):
        WhisperRequest(np.zeros(16000, np.float32), sample_rate=22050)
    with pytest.raises(ValueError):
        WhisperRequest(np.zeros((2, 16000), np.float32))
    session = whisper_factory.create()
    session.reset()
    session.close()
    with pytest.raises(RuntimeError):
        session.run(WhisperRequest(np.zeros(16000, np.float32)))
