"""VAD-chunked long audio (issue #14): Silero VAD cuts a file at silences into pieces of at most
30 s, decoded as one batch (real tiny.en and Silero weights on numpy, one thread).

The long input is every fixture of tests/data/whisper, story (54.7 s) included, joined by
1 s of silence (93 s). The pieces stay inside the file, in order, each at most 30 s;
segment and word times are the file's, in order, inside their piece; the option off is
today's transcription; a silent file has an empty transcript; the session (a model without
batching) and the batched engine give identical tokens; with one piece at a time, a chunked
transcript is the session's transcript of each piece, moved to the piece's start. On a batching
model's engine the VAD pass holds up no other member (a pass held by the test, the others join
and decode), a member may leave during it, and its failure is the member's.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from backends.base import ArrayBackend
from backends.silero_vad.types import SpeechSegment
from backends.whisper import (
    Segment,
    WhisperFactory,
    WhisperRequest,
    WhisperResult,
    Window,
    batched,
    model,
)
from backends.whisper.decoding import WindowResult
from backends.whisper.pieces import (
    MAX_PIECE_SAMPLES,
    MAX_PIECE_SECONDS,
    Chunked,
    Span,
    SpeechFinder,
    merge,
)
from core.engine import Emitted, Member
from tests.models.test_whisper_batched import _drive, _matches, _result, _segment_view
from tests.models.whisper_audio import FIXTURES, load_wav, word_error_rate

pytestmark = pytest.mark.usefixtures("one_thread")

SR = 16000
GAP_S = 1.0


def _audio(name: str) -> np.ndarray:
    return load_wav(next(str(f["file"]) for f in FIXTURES if f["name"] == name))


@pytest.fixture(scope="module")
def long_audio() -> np.ndarray:
    gap = np.zeros(int(GAP_S * SR), np.float32)
    parts = [p for f in FIXTURES for p in (load_wav(str(f["file"])), gap)]
    return np.concatenate(parts[:-1])


@pytest.fixture(scope="module")
def long_reference() -> str:
    return " ".join(str(f["text"]) for f in FIXTURES)


@pytest.fixture(scope="module")
def chunked(whisper_factory: WhisperFactory, long_audio: np.ndarray) -> WhisperResult:
    return whisper_factory.create().run(WhisperRequest(long_audio, vad_chunking=True))


# ---- merging speech segments into pieces (no model) ---------------------------------------


def _segs(*pairs: tuple[float, float]) -> list[SpeechSegment]:
    return [SpeechSegment(round(a * SR), round(b * SR)) for a, b in pairs]


def test_segments_merge_into_pieces_of_at_most_30_s() -> None:
    segs = _segs((0.5, 10.0), (10.0, 25.0), (25.0, 31.0), (32.0, 40.0), (70.0, 71.0))
    spans = merge(segs, 80 * SR)
    assert spans == (Span(8000, 400000), Span(400000, 640000), Span(1120000, 1136000))


def test_bounds_are_whole_frames_inside_the_audio() -> None:
    segs = [SpeechSegment(100, 5000), SpeechSegment(5000, 9999)]
    assert merge(segs, 9999) == (Span(0, 9999),)  # rounded out, clamped to the audio
    assert merge([], 5 * SR) == ()


def test_a_piece_never_exceeds_30_s_nor_overlaps_the_previous_one() -> None:
    """Rounding out to frames may take a 30 s VAD segment past 30 s: it is split; a piece
    starting inside the previous one (rounded down) starts at its end instead."""
    segs = [SpeechSegment(50, 50 + MAX_PIECE_SAMPLES), SpeechSegment(MAX_PIECE_SAMPLES + 50, 10**6)]
    spans = merge(segs, 10**6)
    assert all(0 < s.end - s.start <= MAX_PIECE_SAMPLES for s in spans)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    assert spans[0] == Span(0, MAX_PIECE_SAMPLES)
    assert spans[-1].end == 10**6 and all(s.start % 160 == 0 for s in spans)


# ---- the long file ----------------------------------------------------------------------


def _frame(seconds: float) -> int:
    return round(seconds * 100)


def _check_times(result: WhisperResult, duration: float) -> None:
    pieces = result.pieces
    assert pieces and all(0 < end - start <= MAX_PIECE_SECONDS for start, end in pieces)
    assert pieces[0][0] >= 0 and pieces[-1][1] <= duration
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(pieces))
    assert result.duration == duration
    segs = result.segments
    assert segs
    for seg in segs:
        (piece,) = [p for p in pieces if _frame(p[0]) <= seg.seek < _frame(p[1])]
        assert piece[0] <= seg.start <= seg.end <= piece[1]
        for word in seg.words or ():
            assert piece[0] <= word.start <= word.end <= piece[1]
    starts = [s.start for s in segs]
    ends = [s.end for s in segs]
    assert starts == sorted(starts) and ends == sorted(ends)
    if segs[0].words is not None:
        word_starts = [w.start for s in segs for w in s.words or ()]
        assert word_starts == sorted(word_starts)


def test_long_file_pieces_and_segment_times(chunked: WhisperResult, long_audio: np.ndarray) -> None:
    _check_times(chunked, len(long_audio) / SR)
    assert len(chunked.pieces) >= 3  # 93 s: at least four pieces of at most 30 s
    assert chunked.text == "".join(s.text for s in chunked.segments)
    # a window's seek is in the file's frames, at or after its piece's start
    for window in chunked.windows:
        assert any(_frame(p[0]) <= window.seek < _frame(p[1]) for p in chunked.pieces)


def test_long_file_transcript_is_close_to_the_reference(
    chunked: WhisperResult, long_reference: str
) -> None:
    assert word_error_rate(long_reference, chunked.text) < 0.1


@pytest.fixture(scope="module")
def story_words(whisper_factory: WhisperFactory) -> WhisperResult:
    request = WhisperRequest(_audio("story"), vad_chunking=True, word_timestamps=True)
    return whisper_factory.create().run(request)


def test_word_times_are_the_files(story_words: WhisperResult) -> None:
    _check_times(story_words, len(_audio("story")) / SR)
    assert len(story_words.pieces) == 2 and all(s.words for s in story_words.segments)


def test_option_off_is_todays_transcription(whisper_factory: WhisperFactory) -> None:
    audio = _audio("meeting")
    session = whisper_factory.create()
    default = session.run(WhisperRequest(audio))
    assert session.run(WhisperRequest(audio, vad_chunking=False)) == default
    assert default.pieces == ()


def test_silent_file_gives_an_empty_transcript(whisper_factory: WhisperFactory) -> None:
    silence = np.zeros(40 * SR, np.float32)
    request = WhisperRequest(silence, vad_chunking=True)
    session = whisper_factory.create()
    result = session.run(request)
    assert (result.text, result.segments, result.windows, result.pieces) == ("", (), (), ())
    assert result.duration == 40.0
    assert list(session.stream(request)) == []
    run, stream = _drive(whisper_factory.engine(2), [(request, False), (request, True)])
    assert _result(run) == result  # done at the step after its VAD pass
    assert stream[-1].done and not any(e.chunks or e.error for e in stream)


# ---- the batching and non-batching paths ------------------------------------------------


def _tokens(result: WhisperResult) -> list[tuple[int, list[int]]]:
    return [(w.seek, list(w.result.tokens)) for w in result.windows]


def test_session_and_batched_engine_give_identical_tokens(
    whisper_factory: WhisperFactory, chunked: WhisperResult, long_audio: np.ndarray
) -> None:
    """A model without batching runs the pieces through an engine of one member: a batching
    model's engine, this request alone in it, decodes the same batches."""
    request = WhisperRequest(long_audio, vad_chunking=True)
    (seen,) = _drive(whisper_factory.engine(4), [(request, False)])
    ours = _result(seen)
    assert _tokens(ours) == _tokens(chunked)
    assert _segment_view(ours.segments) == _segment_view(chunked.segments)
    assert ours == chunked


def test_stream_yields_the_run_segments_piece_by_piece(
    whisper_factory: WhisperFactory, story_words: WhisperResult
) -> None:
    request = WhisperRequest(_audio("story"), vad_chunking=True, word_timestamps=True)
    streamed = list(whisper_factory.create().stream(request))
    assert _segment_view(streamed) == _segment_view(story_words.segments)
    (entries,) = _drive(whisper_factory.engine(2), [(request, True)])
    assert all(e.error is None for e in entries) and entries[-1].done
    assert _segment_view([c for e in entries for c in e.chunks]) == _segment_view(streamed)


def _window(seek: int, *times: tuple[float, float]) -> Window:
    result = WindowResult([], 0.0, 0.0)
    segments = tuple(Segment(a, b, f"{a}", (), seek, 0.0, 0.0, 0) for a, b in times)
    return Window(seek, result, segments)


def test_pieces_stream_in_order_as_they_finish() -> None:
    """A piece's segments go out once every piece before it has; times move to the file's."""
    request = WhisperRequest(np.zeros(60 * SR, np.float32), vad_chunking=True)
    pieces = Chunked(request, [Span(0, 20 * SR), Span(25 * SR, 50 * SR), Span(50 * SR, 60 * SR)])
    assert [pieces.next_piece() is not None for _ in range(4)] == [True, True, True, False]
    pieces.finish(1, [_window(0, (0.0, 4.0), (4.0, 30.0))])  # 30 s: past the piece's end
    assert pieces.take_segments() == () and not pieces.done
    pieces.finish(0, [_window(0, (1.0, 2.0))])
    got = pieces.take_segments()
    assert [(s.start, s.end, s.seek) for s in got] == [(1, 2, 0), (25, 29, 2500), (29, 50, 2500)]
    pieces.finish(2, [])
    assert pieces.take_segments() == () and pieces.done
    assert pieces.result().pieces == ((0, 20), (25, 50), (50, 60))


def test_one_piece_at_a_time_is_the_session_on_each_piece(
    whisper_factory: WhisperFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a batch of one piece (bit for bit the session on numpy), each piece's windows are
    the session's transcript of the piece's audio, at the piece's start; no text carries over."""
    monkeypatch.setattr(batched, "PIECE_BATCH", 1)
    story = _audio("story")
    result = whisper_factory.create().run(WhisperRequest(story, vad_chunking=True))
    session = whisper_factory.create()
    assert len(result.pieces) == 2
    for start, end in result.pieces:
        alone = session.run(WhisperRequest(story[round(start * SR) : round(end * SR)]))
        first = _frame(start)
        mine = [w for w in result.windows if first <= w.seek < _frame(end)]
        assert [(w.seek - first, w.result) for w in mine] == [
            (w.seek, w.result) for w in alone.windows
        ]
        got = [s for w in mine for s in w.segments]
        assert [(s.tokens, s.text, s.seek - first) for s in got] == [
            (s.tokens, s.text, s.seek) for s in alone.segments
        ]
        for ours, theirs in zip(got, alone.segments, strict=True):
            assert ours.start == pytest.approx(min(start + theirs.start, end), abs=1e-9)
            assert ours.end == pytest.approx(min(start + theirs.end, end), abs=1e-9)


def test_chunked_member_among_other_members(whisper_factory: WhisperFactory) -> None:
    """A chunked request shares the engine's steps with whole requests; every result is what
    it is alone, up to a near tie (batched products round differently)."""
    requests = [
        WhisperRequest(_audio("short"), record_top2=True),
        WhisperRequest(_audio("story"), vad_chunking=True, record_top2=True),
        WhisperRequest(_audio("weather"), record_top2=True),
    ]
    seen = _drive(whisper_factory.engine(3), [(r, False) for r in requests])
    session = whisper_factory.create()
    for entries, request in zip(seen, requests, strict=True):
        assert _matches(_result(entries), session.run(request)) in ("identical", "near tie")


def test_a_chunked_member_that_cannot_start_a_piece_fails_alone(
    whisper_factory: WhisperFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A piece whose decoder state cannot be had (the device out of memory) fails its request
    only, as any member's failure: the member that joined with it decodes as if alone."""
    short = WhisperRequest(_audio("short"))
    expected = whisper_factory.create().run(short)
    engine = whisper_factory.engine(2)

    def out_of_memory(*args: object) -> model.DecoderState:
        raise MemoryError("no room for a decoder state")

    monkeypatch.setattr(model, "DecoderState", out_of_memory)  # the story's second piece needs one
    story = WhisperRequest(_audio("story"), vad_chunking=True)
    chunked, whole = _drive(engine, [(story, False), (short, False)])
    *before, failed = chunked  # it failed when its pieces started, after its VAD pass
    assert not any(e.chunks or e.done or e.error for e in before)
    assert isinstance(failed.error, MemoryError) and not failed.chunks and not failed.done
    assert _result(whole) == expected


# ---- the VAD pass on a batching model ---------------------------------------------------


class _HeldSpeech:
    """The factory's VAD, each pass of it held until the test lets it go (``go``)."""

    def __init__(self, speech: SpeechFinder, error: Exception | None = None) -> None:
        self._speech = speech
        self._error = error
        self.go = threading.Event()
        self.finished = threading.Event()

    def spans(self, audio: np.ndarray, backend: ArrayBackend) -> tuple[Span, ...]:
        if not self.go.wait(timeout=120):  # a guard against a deadlock, not a timing
            raise TimeoutError("the VAD pass was never let go")
        try:
            if self._error is not None:
                raise self._error
            return self._speech.spans(audio, backend)
        finally:
            self.finished.set()


def _engine(factory: WhisperFactory, max_batch: int, speech: object) -> batched.WhisperEngine:
    """The factory's batched engine (a batching model's) with ``speech`` as its VAD."""
    return batched.WhisperEngine(
        factory.backend,
        factory.weights,
        factory.tokenizer,
        factory.config,
        factory.alignment_heads,
        max_batch,
        speech,  # type: ignore[arg-type]
    )


def _until_done(engine: batched.WhisperEngine, key: int, first: Emitted) -> list[Emitted]:
    entries = [first]
    while not entries[-1].done and entries[-1].error is None:
        (entry,) = engine.step([key])
        entries.append(entry)
    return entries


def test_the_vad_pass_holds_up_no_other_member(whisper_factory: WhisperFactory) -> None:
    """A chunked member's VAD pass runs off the engine's steps: while it is held, join returns,
    a step with nothing else to decode returns, and another member joins, steps to its end and
    decodes as it does alone; let go, the pieces decode as on a model without batching."""
    short = WhisperRequest(_audio("short"))
    story = WhisperRequest(_audio("story"), vad_chunking=True)
    session = whisper_factory.create()
    expected_short, expected_story = session.run(short), session.run(story)
    held = _HeldSpeech(whisper_factory.speech)
    engine = _engine(whisper_factory, 2, held)
    (first,) = engine.join([Member(0, story, False)])
    assert first.error is None and not first.done and not first.chunks
    (waiting,) = engine.step([0])
    assert waiting.error is None and not waiting.done and not waiting.chunks
    (second,) = engine.join([Member(1, short, False)])
    entries = [second]
    while not entries[-1].done:
        pending, entry = engine.step([0, 1])
        assert pending.error is None and not pending.done and not pending.chunks
        entries.append(entry)
    assert not held.finished.is_set()  # all of it while the VAD pass was held
    assert _result(entries) == expected_short
    engine.leave(1)
    held.go.set()
    assert _result([first, *_until_done(engine, 0, waiting)]) == expected_story
    engine.close()


def test_a_member_may_leave_during_its_vad_pass(whisper_factory: WhisperFactory) -> None:
    """Leaving does not wait for the pass; the slot takes another member at once; closing the
    engine waits for the pass, which then uses the weights no more."""
    short = WhisperRequest(_audio("short"))
    expected = whisper_factory.create().run(short)
    held = _HeldSpeech(whisper_factory.speech)
    engine = _engine(whisper_factory, 1, held)
    engine.join([Member(0, WhisperRequest(_audio("story"), vad_chunking=True), False)])
    engine.leave(0)
    (joined,) = engine.join([Member(0, short, False)])
    assert _result(_until_done(engine, 0, joined)) == expected
    assert not held.finished.is_set()
    engine.leave(0)
    held.go.set()
    engine.close()
    assert held.finished.is_set()


def test_a_failing_vad_pass_fails_its_member(whisper_factory: WhisperFactory) -> None:
    broken = _HeldSpeech(whisper_factory.speech, RuntimeError("no VAD today"))
    broken.go.set()
    request = WhisperRequest(_audio("short"), vad_chunking=True)
    engine = _engine(whisper_factory, 1, broken)
    (joined,) = engine.join([Member(0, request, True)])
    assert joined.error is None
    failed = _until_done(engine, 0, joined)[-1]
    assert isinstance(failed.error, RuntimeError) and str(failed.error) == "no VAD today"
    engine.close()
    session = whisper_factory.create()
    session._speech = broken  # type: ignore[assignment]  # a model without batching
    with pytest.raises(RuntimeError, match="no VAD today"):
        session.run(request)


def test_a_chunked_member_that_leaves_mid_decode_frees_its_slot(
    whisper_factory: WhisperFactory,
) -> None:
    """Aborted with its two pieces in flight (a client gone), the member leaves; the next
    member on its key, chunked too, decodes exactly as on a fresh engine."""
    story = WhisperRequest(_audio("story"), vad_chunking=True)
    expected = whisper_factory.create().run(story)
    engine = whisper_factory.engine(1)
    (joined,) = engine.join([Member(0, story, True)])
    entries = [joined]
    while len(entries) < 20:  # the VAD pass (a few steps), then tokens of both pieces
        (entry,) = engine.step([0])
        assert entry.error is None and not entry.done
        entries.append(entry)
    engine.leave(0)
    (again,) = engine.join([Member(0, story, False)])
    assert _result(_until_done(engine, 0, again)) == expected
    engine.close()
