"""Long-form transcription: faster-whisper's ``generate_segments`` seek loop.

The whole input is featurised once; a 30 s window starts at ``seek`` (in 10 ms
frames). After decoding it, the window's tokens are split into segments at
consecutive timestamp pairs. If the window ended on a single timestamp, the next
window starts after this one; otherwise it starts at the last timestamp (the
unfinished segment is decoded again). With ``condition_on_previous_text`` (the
default) the text tokens of every emitted segment become the prompt of the next
window (the last 223). A window whose no-speech probability exceeds
``no_speech_threshold`` while its average log-probability is not above
``log_prob_threshold`` is skipped. Only temperature 0 is implemented, so there is
no fallback and the prompt is never reset by temperature.

Floats are computed with the same expressions as faster-whisper so segment
start/end times compare exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import attrs
import numpy as np

from backends.whisper.decoding import WindowResult, build_prompt
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


@attrs.frozen
class Window:
    """One decoded 30 s window: where it started, the raw decoding result, its segments."""

    seek: int
    result: WindowResult
    segments: tuple[Segment, ...]


@attrs.frozen
class LongformOptions:
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float | None = -1.0


class WindowDecoder(Protocol):
    def __call__(self, mel: np.ndarray, prompt: list[int]) -> WindowResult:
        """Encode one [80, 3000] window and greedily decode it after ``prompt``."""
        ...


def _split(
    tok: WhisperTokenizer,
    tokens: Sequence[int],
    time_offset: float,
    segment_size: int,
    segment_duration: float,
    seek: int,
) -> tuple[list[tuple[float, float, list[int], int]], int]:
    """faster-whisper's ``_split_segments_by_timestamps``: (start, end, tokens, offset) and next seek."""
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


def transcribe_features(
    features: np.ndarray,
    tok: WhisperTokenizer,
    decode_window: WindowDecoder,
    options: LongformOptions,
) -> Iterator[Window]:
    """Yield each decoded window with its segments, in order (none for a skipped window)."""
    content_frames = features.shape[-1] - 1
    seek = 0
    all_tokens: list[int] = []
    if options.initial_prompt is not None:
        all_tokens.extend(tok.encode(" " + options.initial_prompt.strip()))
    prompt_reset_since = 0
    while seek < content_frames:
        time_offset = seek * TIME_PER_FRAME
        segment_size = min(CHUNK_FRAMES, content_frames - seek)
        segment_duration = segment_size * TIME_PER_FRAME
        window = pad_or_trim(features[:, seek : seek + segment_size])
        prompt = build_prompt(tok, all_tokens[prompt_reset_since:])
        result = decode_window(window, prompt)
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
        pieces, seek = _split(tok, result.tokens, time_offset, segment_size, segment_duration, seek)
        emitted: list[Segment] = []
        for start, end, tokens, offset in pieces:
            text = tok.decode(tokens)
            if start == end or not text.strip():
                continue
            all_tokens.extend(tokens)
            emitted.append(
                Segment(
                    start=start,
                    end=end,
                    text=text,
                    tokens=tuple(tokens),
                    seek=previous_seek,
                    avg_logprob=result.avg_logprob,
                    no_speech_prob=result.no_speech_prob,
                    step_offset=offset,
                )
            )
        if not options.condition_on_previous_text:
            prompt_reset_since = len(all_tokens)
        yield Window(previous_seek, result, tuple(emitted))
