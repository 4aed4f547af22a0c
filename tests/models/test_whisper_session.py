"""Whisper sessions follow the pool contract and keep their state private."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from backends.whisper import Segment, WhisperFactory, WhisperRequest, WhisperResult, load_factory
from core.pool import MAX_PARALLEL_SESSIONS, Interface, Session, SessionFactory

CLIP = Path(__file__).parent.parent / "data" / "whisper" / "short.wav"
SILENCE = np.zeros(16000 * 3, np.float32)


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread: multi-threaded OpenBLAS GEMVs crawl on a loaded 2-core CI machine."""
    with threadpool_limits(limits=1):
        yield


@pytest.fixture(scope="module")
def factory() -> WhisperFactory:
    return load_factory()


@pytest.fixture(scope="module")
def pcm() -> np.ndarray:
    with wave.open(str(CLIP)) as f:
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").copy()


@pytest.fixture(scope="module")
def baseline(factory: WhisperFactory, pcm: np.ndarray) -> WhisperResult:
    """The clip transcribed by a fresh (cold) session."""
    return factory.create().run(WhisperRequest(pcm))


def test_protocols_and_capacity(factory: WhisperFactory) -> None:
    assert isinstance(factory, SessionFactory)
    assert factory.capacity() == MAX_PARALLEL_SESSIONS == 16
    primary = factory.create()
    clone = factory.clone(primary)
    for session in (primary, clone):
        assert isinstance(session, Session)
        assert (session.family, session.task, session.mode) == (
            factory.family,
            factory.task,
            factory.mode,
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
    factory: WhisperFactory, pcm: np.ndarray, baseline: WhisperResult
) -> None:
    primary = factory.create()
    clone = factory.clone(primary)
    silent = clone.run(WhisperRequest(SILENCE))  # the clone is warm with another input
    assert silent.segments == () and silent.text == "" and len(silent.windows) == 1
    assert clone.run(WhisperRequest(pcm)) == baseline
    assert clone.run(WhisperRequest(pcm.astype(np.float32) / np.float32(32768.0))) == baseline


def test_stream_and_batch_agree_with_run(
    factory: WhisperFactory, pcm: np.ndarray, baseline: WhisperResult
) -> None:
    session = factory.create()
    streamed = session.stream(WhisperRequest(pcm))
    first = next(streamed)  # pulled before the rest of the request is decoded
    assert (first, *streamed) == baseline.segments
    results = session.batch([WhisperRequest(pcm), WhisperRequest(SILENCE)])
    assert results[0] == baseline
    assert results[1].segments == ()


def test_invalid_requests_and_closed_session(factory: WhisperFactory) -> None:
    with pytest.raises(ValueError):
        WhisperRequest(np.zeros(16000, np.float32), sample_rate=22050)
    with pytest.raises(ValueError):
        WhisperRequest(np.zeros((2, 16000), np.float32))
    session = factory.create()
    session.reset()
    session.close()
    with pytest.raises(RuntimeError):
        session.run(WhisperRequest(np.zeros(16000, np.float32)))
