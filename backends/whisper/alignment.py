"""Word-level timestamps from cross-attention alignment (faster-whisper's ``word_timestamps``).

For one decoded 30 s window, the text tokens of all its segments are re-run
through the decoder as ``[<|startoftranscript|>, <|notimestamps|>, text...,
<|endoftext|>]`` (one pass). The cross-attention scores of the model's
*alignment heads* (``config.json``'s ``alignment_heads``; openai-whisper's
published mask for tiny.en as a fallback) are turned into a token-by-frame
matrix exactly as CTranslate2's ``WhisperReplica::align`` does:

* keep the window's ``num_frames // 2`` encoder frames, softmax over frames;
* normalise each frame column over the tokens (mean 0, variance 1, no epsilon);
* median filter of width 7 along the frames (reflected edges);
* average the heads, keep the rows from ``<|notimestamps|>`` to the last text
  token, and run dynamic time warping over the negated weights.

The token probabilities are the softmax over the text vocabulary (ids below
``<|endoftext|>``) of the same pass. Words come from the tokenizer (a new word
at a space, a punctuation mark or a special token); a word starts at the frame
where the path first enters its first token and ends where the next word's
starts (50 frames per second). Then faster-whisper's clean-ups: words at
sentence ends longer than twice the median word duration are cut, leading
punctuation (``prepend_punctuations``) joins the next word and trailing
punctuation (``append_punctuations``) the previous one, over-long first/last
words of a segment after a pause are clipped, and the segment's start/end move
to its first/last word (or the word to the segment) by the same rules.
"""

from __future__ import annotations

import base64
import gzip
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from backends.whisper.tokenizer import WhisperTokenizer

MEDIAN_FILTER_WIDTH = 7
FRAMES_PER_SECOND = 100  # mel frames
TOKENS_PER_SECOND = 50  # encoder frames (the second convolution has stride 2)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"

OPENAI_TINY_EN_ALIGNMENT_HEADS = b"ABzY8J1N>@0{>%R00Bk>$p{7v037`oCl~+#00"
"""openai-whisper's ``_ALIGNMENT_HEADS["tiny.en"]``.

Base85 of a gzipped bool mask [4 layers, 6 heads].
"""


@attrs.frozen
class Word:
    """One word of a segment: text (with its leading space), seconds, mean token probability."""

    start: float
    end: float
    word: str
    probability: float


@attrs.frozen
class TokenAlignment:
    """What the aligning decoder pass yields for one window's text tokens."""

    text_indices: np.ndarray  # DTW path from (0, 0): token row of each step ...
    time_indices: np.ndarray  # ... and its encoder frame
    token_probs: list[float]  # probability of each text token


Aligner = Callable[[list[int], int], TokenAlignment]
"""``align(text_tokens, num_frames)`` for the window currently held by the decoder."""


def decode_alignment_mask(blob: bytes, layers: int, heads: int) -> tuple[tuple[int, int], ...]:
    """(layer, head) pairs of an openai-whisper ``_ALIGNMENT_HEADS`` entry."""
    mask = np.frombuffer(gzip.decompress(base64.b85decode(blob)), dtype=bool)
    if mask.size != layers * heads:
        raise ValueError(f"alignment mask has {mask.size} entries, expected {layers}x{heads}")
    return tuple((int(i), int(j)) for i, j in np.argwhere(mask.reshape(layers, heads)))


def alignment_heads(
    config: Mapping[str, Any], layers: int, heads: int
) -> tuple[tuple[int, int], ...]:
    """The model's alignment heads: ``config.json``'s list, else openai's tiny.en mask."""
    listed = config.get("alignment_heads")
    if listed:
        return tuple((int(layer), int(head)) for layer, head in listed)
    return decode_alignment_mask(OPENAI_TINY_EN_ALIGNMENT_HEADS, layers, heads)


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a sliding window along the last axis, edges reflected (``a b c | b a``).

    Like CTranslate2's ``MedianFilter``, an axis no longer than ``width // 2`` is returned as is.
    """
    rank = width // 2
    if x.shape[-1] <= rank:
        return x.copy()
    pad = [(0, 0)] * (x.ndim - 1) + [(rank, rank)]
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, pad, mode="reflect"), width, -1)
    out: np.ndarray = np.median(windows, axis=-1).astype(x.dtype)
    return out


def negative_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CTranslate2's ``negative_dtw``: the cheapest monotonic path through ``-x`` (float32 costs).

    Returns the path's (row, column) indices, from (0, 0) to the last cell. Cells on
    one anti-diagonal are independent, so each diagonal is computed at once; ties
    go to the left move, then up, as in the reference.
    """
    n, m = x.shape
    inf = np.float32(np.inf)
    cost = np.full((n + 1, m + 1), inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    values = np.asarray(x, dtype=np.float32)
    for diagonal in range(2, n + m + 1):
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        c0 = cost[i - 1, j - 1]
        c1 = cost[i - 1, j]
        c2 = cost[i, j - 1]
        pick0 = (c0 < c1) & (c0 < c2)
        pick1 = ~pick0 & (c1 < c0) & (c1 < c2)
        best = np.where(pick0, c0, np.where(pick1, c1, c2))
        cost[i, j] = -values[i - 1, j - 1] + best
        trace[i, j] = np.where(pick0, 0, np.where(pick1, 1, 2))
    trace[0, :] = 2
    trace[:, 0] = 1
    rows: list[int] = []
    cols: list[int] = []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    return np.asarray(rows[::-1], dtype=np.int64), np.asarray(cols[::-1], dtype=np.int64)


def alignment_matrix(
    scores: np.ndarray, num_frames: int, sot_length: int, text_length: int
) -> np.ndarray:
    """Token-by-frame weights [text_length + 1, frames] from alignment-head scores [H, T, 1500]."""
    frames = num_frames // 2
    if frames < scores.shape[-1]:
        scores = scores[..., :frames]
    shifted = scores - np.max(scores, axis=-1, keepdims=True)
    probs = np.exp(shifted)
    probs /= np.sum(probs, axis=-1, keepdims=True)
    mean = np.mean(probs, axis=-2, keepdims=True)
    variance = np.mean(np.square(probs - mean), axis=-2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        normalised = np.nan_to_num((probs - mean) / np.sqrt(variance))
    weights = np.mean(median_filter(normalised, MEDIAN_FILTER_WIDTH), axis=0)
    out: np.ndarray = weights[sot_length : sot_length + text_length + 1].astype(np.float32)
    return out


@attrs.define
class _Timing:
    """faster-whisper's per-word alignment dict (mutable while punctuation is merged)."""

    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def find_alignment(
    tok: WhisperTokenizer, text_tokens: Sequence[int], aligned: TokenAlignment
) -> list[_Timing]:
    """faster-whisper's ``find_alignment`` after ``model.align``: one timing per word."""
    if not text_tokens:
        return []
    words, word_tokens = tok.split_to_word_tokens([*text_tokens, tok.eot])
    if len(word_tokens) <= 1 or aligned.text_indices.size == 0:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    if len(boundaries) <= 1:
        return []
    jumps = np.pad(np.diff(aligned.text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = aligned.time_indices[jumps] / TOKENS_PER_SECOND
    starts = jump_times[boundaries[:-1]]
    ends = jump_times[boundaries[1:]]
    probs = [np.mean(aligned.token_probs[i:j]) for i, j in itertools.pairwise(boundaries)]
    return [
        _Timing(word, list(ids), start, end, float(p))
        for word, ids, start, end, p in zip(words, word_tokens, starts, ends, probs, strict=False)
    ]


def merge_punctuations(alignment: list[_Timing], prepended: str, appended: str) -> None:
    """Join leading punctuation to the next word and trailing punctuation to the previous one."""
    i = len(alignment) - 2
    j = len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word = ""
            previous.tokens = []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word = ""
            following.tokens = []
        else:
            i = j
        j += 1


@attrs.define
class Piece:
    """One segment of a window while its times may still move (``start``/``end`` in seconds)."""

    start: float
    end: float
    tokens: list[int]
    offset: int  # decoding step of its first token within the window
    words: list[Word] | None = None


@attrs.define
class _Draft:
    word: str
    start: float
    end: float
    probability: float


def _round2(value: float) -> float:
    """``round(x, 2)`` as faster-whisper gets it on a numpy float (``np.round``)."""
    return float(np.round(np.float64(value), 2))


def add_word_timestamps(
    pieces: list[Piece],
    tok: WhisperTokenizer,
    align: Aligner,
    num_frames: int,
    seek: int,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> float:
    """Give each piece of one window its words (faster-whisper's ``add_word_timestamps``).

    Moves the pieces' start/end to their words by its rules; returns the new last speech time.
    """
    text_tokens = window_text_tokens(pieces, tok)
    aligned = align(text_tokens, num_frames) if text_tokens else None
    return place_words(
        pieces, tok, aligned, seek, last_speech_timestamp, prepend_punctuations, append_punctuations
    )


def window_text_tokens(pieces: Sequence[Piece], tok: WhisperTokenizer) -> list[int]:
    """The text tokens of one window's pieces, in order: what the aligning pass aligns."""
    return [t for piece in pieces for t in piece.tokens if t < tok.eot]


def place_words(
    pieces: list[Piece],
    tok: WhisperTokenizer,
    aligned: TokenAlignment | None,
    seek: int,
    last_speech_timestamp: float,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
) -> float:
    """:func:`add_word_timestamps` given the aligning pass's output for
    :func:`window_text_tokens` (``None`` when there is no text token)."""
    if not pieces:
        return last_speech_timestamp
    per_piece = [[t for t in piece.tokens if t < tok.eot] for piece in pieces]
    text_tokens = [t for tokens in per_piece for t in tokens]
    alignment = (
        find_alignment(tok, text_tokens, aligned) if text_tokens and aligned is not None else []
    )
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations) if len(durations) > 0 else 0.0))
    max_duration = median_duration * 2
    if len(durations) > 0:
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    time_offset = seek / FRAMES_PER_SECOND
    word_index = 0
    for piece, tokens in zip(pieces, per_piece, strict=True):
        saved_tokens = 0
        words: list[_Draft] = []
        while word_index < len(alignment) and saved_tokens < len(tokens):
            timing = alignment[word_index]
            if timing.word:
                words.append(
                    _Draft(
                        timing.word,
                        _round2(time_offset + timing.start),
                        _round2(time_offset + timing.end),
                        timing.probability,
                    )
                )
            saved_tokens += len(timing.tokens)
            word_index += 1
        if words:
            first, last = words[0], words[-1]
            if first.end - last_speech_timestamp > median_duration * 4 and (
                first.end - first.start > max_duration
                or (len(words) > 1 and words[1].end - first.start > max_duration * 2)
            ):
                if len(words) > 1 and words[1].end - words[1].start > max_duration:
                    boundary = max(words[1].end / 2, words[1].end - max_duration)
                    first.end = words[1].start = boundary
                first.start = max(0, first.end - max_duration)
            if piece.start < first.end and piece.start - 0.5 > first.start:
                first.start = max(0, min(first.end - median_duration, piece.start))
            else:
                piece.start = first.start
            if piece.end > last.start and piece.end + 0.5 < last.end:
                last.end = max(last.start + median_duration, piece.end)
            else:
                piece.end = last.end
            last_speech_timestamp = piece.end
        piece.words = [Word(float(w.start), float(w.end), w.word, w.probability) for w in words]
    return last_speech_timestamp


def last_word_end(pieces: Sequence[Piece]) -> float | None:
    """faster-whisper's ``get_end``: the last word's end, else the last piece's end."""
    for piece in reversed(pieces):
        for word in reversed(piece.words or []):
            return word.end
    return pieces[-1].end if pieces else None
