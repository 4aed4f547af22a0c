"""Long-form transcription: faster-whisper's ``generate_segments`` seek loop.

The whole input is featurised once; a 30 s window starts at ``seek`` (in 10 ms
frames). Each window is encoded once, then decoded with temperature fallback
(:mod:`backends.whisper.fallback`). The window's tokens are split into segments
at consecutive timestamp pairs. If the window ended on a single timestamp, the
next window starts after this one; otherwise it starts at the last timestamp (the
unfinished segment is decoded again). With ``condition_on_previous_text`` (the
default) the text tokens of every emitted segment become the prompt of the next
window (the last 223), unless the window needed a temperature above
``prompt_reset_on_temperature`` (0.5), which drops the history. ``initial_prompt``
text (OpenAI's ``prompt``) is the history before the first window. A window whose
no-speech probability exceeds ``no_speech_threshold`` while its average
log-probability is not above ``log_prob_threshold`` is skipped.

With ``word_timestamps`` each window's segments get words from cross-attention
alignment (:mod:`backends.whisper.alignment`), segment times move to their words,
and a window that did not end on a single timestamp is followed by one starting
at its last word's end, as in faster-whisper.

The loop is written as a program (:func:`transcribe_steps`, a generator yielding
model operations and windows) so that one session (:func:`transcribe_features`
over a :class:`WindowModel`) and a batched engine advancing many requests
together run the same rules.

Floats are computed with the same expressions as faster-whisper so segment
start/end times compare exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from backends.whisper.alignment import (
    APPEND_PUNCTUATIONS,
    FRAMES_PER_SECOND,
    PREPEND_PUNCTUATIONS,
    Piece,
    TokenAlignment,
    Word,
    last_word_end,
    place_words,
    window_text_tokens,
)
from backends.whisper.decoding import WindowResult, build_prompt
from backends.whisper.fallback import FallbackOptions, fallback_steps, now
from backends.whisper.frontend import CHUNK_FRAMES, TIME_PER_FRAME, pad_or_trim
from backends.whisper.tokenizer import TIME_PRECISION, WhisperTokenizer

INPUT_STRIDE = 2  # encoder frames per timestamp step / mel frames per encoder frame


@attrs.frozen
class Segment:
    """One transcribed segment: times in seconds, text and its token ids (timestamps included)."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    seek: int
    avg_logprob: float
    no_speech_prob: float
    step_offset: int  # decoding step of its first token within its window
    temperature: float = 0.0  # the window's (final) decoding temperature
    compression_ratio: float = 0.0  # of the window's text
    words: tuple[Word, ...] | None = None  # with word_timestamps only


@attrs.frozen
class Window:
    """One decoded 30 s window: where it started, the raw decoding result, its segments."""

    seek: int
    result: WindowResult
    segments: tuple[Segment, ...]


@attrs.frozen
class LongformOptions:
    condition_on_previous_text: bool = True
    initial_prompt: str | Sequence[int] | None = None
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float | None = -1.0
    fallback: FallbackOptions = attrs.field(factory=FallbackOptions)
    prompt_reset_on_temperature: float = 0.5
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS


class WindowModel(Protocol):
    """The model side of the loop, one window at a time."""

    def set_window(self, mel: np.ndarray) -> None:
        """Encode one [80, 3000] window; later calls decode against it."""
        ...

    def generate(self, prompt: list[int], temperature: float) -> WindowResult:
        """Decode the current window after ``prompt`` (greedy at 0, else sampled)."""
        ...

    def align(self, text_tokens: list[int], num_frames: int) -> TokenAlignment:
        """Align text tokens to the current window's first ``num_frames`` mel frames."""
        ...


def _split(
    tok: WhisperTokenizer,
    tokens: Sequence[int],
    time_offset: float,
    segment_size: int,
    segment_duration: float,
    seek: int,
) -> tuple[list[tuple[float, float, list[int], int]], int]:
    """faster-whisper's ``_split_segments_by_timestamps``.

    Returns the (start, end, tokens, offset) pieces and the next seek.
    """
    begin = tok.timestamp_begin
    pieces: list[tuple[float, float, list[int], int]] = []
    single_ending = len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
    consecutive = [
        i for i in range(1, len(tokens)) if tokens[i] >= begin and tokens[i - 1] >= begin
    ]
    if consecutive:
        slices = list(consecutive)
        if single_ending:
            slices.append(len(tokens))
        last = 0
        for current in slices:
            part = list(tokens[last:current])
            start = time_offset + (part[0] - begin) * TIME_PRECISION
            end = time_offset + (part[-1] - begin) * TIME_PRECISION
            pieces.append((start, end, part, last))
            last = current
        if single_ending:
            seek += segment_size
        else:
            seek += (tokens[last - 1] - begin) * INPUT_STRIDE
    else:
        duration = segment_duration
        stamps = [t for t in tokens if t >= begin]
        if stamps and stamps[-1] != begin:
            duration = (stamps[-1] - begin) * TIME_PRECISION
        pieces.append((time_offset, time_offset + duration, list(tokens), 0))
        seek += segment_size
    return pieces, seek


def _initial_tokens(tok: WhisperTokenizer, prompt: str | Sequence[int] | None) -> list[int]:
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return tok.encode(" " + prompt.strip())
    return [int(t) for t in prompt]


@attrs.frozen
class SetWindow:
    """Encode one ``[80, 3000]`` mel window; later operations decode against it."""

    mel: np.ndarray


@attrs.frozen
class Align:
    """Align ``text_tokens`` to the current window's first ``num_frames`` mel frames.

    The answer is a :class:`~backends.whisper.alignment.TokenAlignment`.
    """

    text_tokens: list[int]
    num_frames: int


GenerateSteps = Callable[[list[int], float], Generator[Any, Any, WindowResult]]
"""Decode the current window after ``prompt`` at one temperature, as a program."""

TranscribeSteps = Generator[Any, Any, None]
"""The seek loop as a program: yields :class:`SetWindow`, :class:`Align` and the
generator's own operations (answered by the driver), and each decoded :class:`Window`
(answered with ``None``)."""


def transcribe_features(
    features: np.ndarray,
    tok: WhisperTokenizer,
    model: WindowModel,
    options: LongformOptions,
) -> Iterator[Window]:
    """Yield each decoded window with its segments, in order (none for a skipped window)."""

    def generate(prompt: list[int], temperature: float) -> Generator[Any, Any, WindowResult]:
        return now(model.generate(prompt, temperature))

    program = transcribe_steps(features, tok, generate, options)
    answer: Any = None
    while True:
        try:
            item = program.send(answer)
        except StopIteration:
            return
        answer = None
        if isinstance(item, Window):
            yield item
        elif isinstance(item, SetWindow):
            model.set_window(item.mel)
        elif isinstance(item, Align):
            answer = model.align(item.text_tokens, item.num_frames)
        else:
            raise TypeError(f"unexpected operation {item!r}")


def transcribe_steps(
    features: np.ndarray,
    tok: WhisperTokenizer,
    generate: GenerateSteps,
    options: LongformOptions,
) -> TranscribeSteps:
    """:func:`transcribe_features` as a program (see :data:`TranscribeSteps`)."""
    content_frames = features.shape[-1] - 1
    seek = 0
    all_tokens = _initial_tokens(tok, options.initial_prompt)
    prompt_reset_since = 0
    last_speech_timestamp = 0.0
    fallback = attrs.evolve(
        options.fallback,
        log_prob_threshold=options.log_prob_threshold,
        no_speech_threshold=options.no_speech_threshold,
    )
    while seek < content_frames:
        time_offset = seek * TIME_PER_FRAME
        segment_size = min(CHUNK_FRAMES, content_frames - seek)
        segment_duration = segment_size * TIME_PER_FRAME
        yield SetWindow(pad_or_trim(features[:, seek : seek + segment_size]))
        prompt = build_prompt(tok, all_tokens[prompt_reset_since:])

        def attempt(
            temperature: float, prompt: list[int] = prompt
        ) -> Generator[Any, Any, WindowResult]:
            return generate(prompt, temperature)

        result = yield from fallback_steps(attempt, tok, fallback)
        if options.no_speech_threshold is not None:
            skip = result.no_speech_prob > options.no_speech_threshold
            if (
                options.log_prob_threshold is not None
                and result.avg_logprob > options.log_prob_threshold
            ):
                skip = False
            if skip:
                yield Window(seek, result, ())
                seek += segment_size
                continue
        previous_seek = seek
        raw_pieces, seek = _split(
            tok, result.tokens, time_offset, segment_size, segment_duration, seek
        )
        pieces = [Piece(start, end, tokens, offset) for start, end, tokens, offset in raw_pieces]
        if options.word_timestamps:
            tokens = result.tokens
            single_ending = len(tokens) >= 2 and tokens[-2] < tok.timestamp_begin <= tokens[-1]
            text_tokens = window_text_tokens(pieces, tok)
            aligned = (yield Align(text_tokens, segment_size)) if text_tokens else None
            place_words(
                pieces,
                tok,
                aligned,
                previous_seek,
                last_speech_timestamp,
                options.prepend_punctuations,
                options.append_punctuations,
            )
            if not single_ending:
                end = last_word_end(pieces)
                if end is not None and end > time_offset:
                    seek = round(end * FRAMES_PER_SECOND)
            end = last_word_end(pieces)
            if end is not None:
                last_speech_timestamp = end
        emitted: list[Segment] = []
        for piece in pieces:
            text = tok.decode(piece.tokens)
            if piece.start == piece.end or not text.strip():
                continue
            all_tokens.extend(piece.tokens)
            emitted.append(
                Segment(
                    start=piece.start,
                    end=piece.end,
                    text=text,
                    tokens=tuple(piece.tokens),
                    seek=previous_seek,
                    avg_logprob=result.avg_logprob,
                    no_speech_prob=result.no_speech_prob,
                    step_offset=piece.offset,
                    temperature=result.temperature,
                    compression_ratio=result.compression_ratio,
                    words=tuple(piece.words) if piece.words is not None else None,
                )
            )
        if (
            not options.condition_on_previous_text
            or result.temperature > options.prompt_reset_on_temperature
        ):
            prompt_reset_since = len(all_tokens)
        yield Window(previous_seek, result, tuple(emitted))
