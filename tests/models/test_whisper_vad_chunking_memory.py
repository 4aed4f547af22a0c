"""Memory of VAD-chunked Whisper requests (issue #14), measured with tracemalloc.

What a chunked request takes over plain long-form decoding is bounded by its pieces in flight
(at most 8), not by the file's length (docs/server.md, "Memory per request"); a batching
model's engine keeps nothing of a chunked member once it has left: the decoder states of its
further pieces are its own, not a pool the engine grows.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.whisper import WhisperFactory, WhisperRequest, WhisperResult, batched
from backends.whisper.batched import WhisperEngine
from backends.whisper.pieces import PIECE_BATCH
from core.engine import Member
from tests.models.memory import held_and_grown, peak_of
from tests.models.whisper_audio import load_wav

MIB = 1 << 20

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(engine: WhisperEngine, request: WhisperRequest) -> WhisperResult:
    """``request`` alone through ``engine``, from join to leave."""
    (emitted,) = engine.join([Member(0, request, False)])
    while not emitted.done:
        assert emitted.error is None, emitted.error
        (emitted,) = engine.step([0])
    engine.leave(0)
    (result,) = emitted.chunks
    assert isinstance(result, WhisperResult)
    return result


def test_a_chunked_member_leaves_nothing_behind_in_the_engine(
    whisper_factory: WhisperFactory,
) -> None:
    """The story's second piece decodes on a state of its own, gone when the member leaves
    (the engine used to pool such states: 5.5 MB of self-attention cache kept for every piece
    beyond a slot's that chunked members ever had in flight at once)."""
    story = WhisperRequest(load_wav("story.wav"), vad_chunking=True)
    whisper_factory.create().run(story)  # warm-up: the VAD's weights, lazy imports
    engine = whisper_factory.engine(1)
    result, held, _ = held_and_grown(lambda: _run(engine, story))
    assert len(result.pieces) == 2
    print(f"whisper vad_chunking: the engine holds {held / MIB:.2f} MiB more after the member")
    assert held < MIB  # the result itself (segments, tokens) is a few kB


PIECE_BYTES = 64 * MIB
"""What a piece in flight may take (docs/server.md, "Memory per request")."""
WHISPER_BYTES_PER_S = 1 * MIB
"""The Whisper term's bytes a second of input (docs/server.md, "Memory per request")."""


def test_the_extra_memory_is_bounded_by_the_pieces_in_flight(
    whisper_factory: WhisperFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunked request's peak against plain long-form decoding of the longest fixture
    (story, 54.7 s, two pieces), of story twice (110.5 s, four pieces) and four times
    (222.0 s, eight pieces), files joined by 1 s of silence:

    * one piece at a time, the chunked request takes no more than plain decoding (which
      holds the log-mel of the whole input: about 1 MiB a second at its peak);
    * each more piece in flight adds at most :data:`PIECE_BYTES` (its decoder state, its
      window's cross K/V, its share of one encoder pass), and with
      :data:`~backends.whisper.pieces.PIECE_BATCH` (8) in flight the whole request takes
      at most that many times :data:`PIECE_BYTES`;
    * at the same pieces in flight, a longer file adds at most :data:`WHISPER_BYTES_PER_S`
      a second, the per-second term the request's bound already has for plain decoding's
      log-mel (measured about 0.6 MiB a second: the VAD pass over the whole input, 0.3,
      and the copies of the input audio; before each window was encoded on its own, a
      two-window encoder pass peaked above all of it and hid it).
    """
    session = whisper_factory.create()
    story = load_wav("story.wav")
    gap = np.zeros(16000, np.float32)
    twice = np.concatenate([story, gap, story])
    four_times = np.concatenate([twice, gap, twice])
    session.run(WhisperRequest(story[: 16000 * 5], vad_chunking=True))  # warm-up

    def peak(audio: np.ndarray, pieces: int, in_flight: int = PIECE_BATCH) -> int:
        """The peak of ``audio`` (plain decoding if ``pieces`` is 0)."""
        monkeypatch.setattr(batched, "PIECE_BATCH", in_flight)
        request = WhisperRequest(audio, vad_chunking=pieces > 0)
        result, peak = peak_of(lambda: session.run(request))
        assert len(result.pieces) == pieces
        return peak

    plain = peak(story, 0)
    one, two = peak(story, 2, 1), peak(story, 2, 2)
    longer = peak(twice, 4, 2)
    eight = peak(four_times, 8)
    print(
        f"whisper vad_chunking peaks (tracemalloc): story ({len(story) / 16000:.1f} s) plain "
        f"{plain / MIB:.1f} MiB, chunked one piece at a time {one / MIB:.1f} MiB, two "
        f"{two / MIB:.1f} MiB; twice ({len(twice) / 16000:.1f} s) two at a time "
        f"{longer / MIB:.1f} MiB; four times ({len(four_times) / 16000:.1f} s) eight at a "
        f"time {eight / MIB:.1f} MiB"
    )
    assert one <= plain
    assert two - one <= PIECE_BYTES
    assert longer - two <= WHISPER_BYTES_PER_S * (len(twice) - len(story)) / 16000
    assert eight <= PIECE_BATCH * PIECE_BYTES
