"""Word-alignment building blocks against CTranslate2's and faster-whisper's own rules.

DTW and the median filter are checked against direct transcriptions of
CTranslate2's C++ loops (``src/dtw.cc``, ``src/ops/median_filter_cpu.cc``); the word
splitting, punctuation merging and the whole ``add_word_timestamps`` post-processing
against faster-whisper's functions, fed the same alignment.
"""

from __future__ import annotations

import copy
import itertools
import json
from types import SimpleNamespace
from typing import Any

import attrs
import numpy as np
import pytest

from backends.whisper.alignment import (
    OPENAI_TINY_EN_ALIGNMENT_HEADS,
    Piece,
    TokenAlignment,
    _Timing,
    add_word_timestamps,
    alignment_heads,
    alignment_matrix,
    decode_alignment_mask,
    last_word_end,
    median_filter,
    merge_punctuations,
    negative_dtw,
)
from backends.whisper.session import default_model_dir
from tests.models.whisper_tokens import REF, TOK, TS, fw_transcribe


def reference_dtw(x: np.ndarray) -> tuple[list[int], list[int]]:
    """CTranslate2's ``negative_dtw``, loop for loop (float32 costs)."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int64)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, choice = c0, 0
            elif c1 < c0 and c1 < c2:
                c, choice = c1, 1
            else:
                c, choice = c2, 2
            cost[i, j] = np.float32(-x[i - 1, j - 1]) + c
            trace[i, j] = choice
    trace[0, :] = 2
    trace[:, 0] = 1
    rows: list[int] = []
    cols: list[int] = []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        move = int(trace[i, j])
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
    return rows[::-1], cols[::-1]


def reference_median(x: np.ndarray, width: int) -> np.ndarray:
    """CTranslate2's CPU ``MedianFilter`` over the last axis."""
    depth = x.shape[-1]
    rank = width // 2
    if depth <= rank:
        return x.copy()
    flat = x.reshape(-1, depth)
    out = np.empty_like(flat)
    for row in range(flat.shape[0]):
        for j in range(depth):
            window = []
            for k in range(-rank, rank + 1):
                read = abs(j + k)
                if read >= depth:
                    read = depth - (read - depth) - 2
                window.append(flat[row, read])
            out[row, j] = sorted(window)[rank]
    return out.reshape(x.shape)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (5, 9), (12, 40), (30, 17)])
def test_dtw_matches_ctranslate2_loops(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    for values in (
        rng.normal(size=shape).astype(np.float32),
        rng.integers(-2, 3, size=shape).astype(np.float32),  # many ties
    ):
        rows, cols = negative_dtw(values)
        ref_rows, ref_cols = reference_dtw(values)
        assert rows.tolist() == ref_rows and cols.tolist() == ref_cols


def test_dtw_path_is_monotonic_and_collects_every_strong_cell() -> None:
    x = np.zeros((4, 8), np.float32)
    for i, j in enumerate((0, 2, 4, 6)):
        x[i, j : j + 2] = 5.0
    rows, cols = negative_dtw(x)
    path = list(zip(rows.tolist(), cols.tolist(), strict=True))
    assert path[0] == (0, 0) and path[-1] == (3, 7)
    steps = {(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(path)}
    assert steps <= {(1, 0), (0, 1), (1, 1)}
    assert {(int(i), int(j)) for i, j in np.argwhere(x > 0)} <= set(path)


@pytest.mark.parametrize("depth", [1, 3, 4, 7, 8, 50])
def test_median_filter_matches_ctranslate2(depth: int) -> None:
    rng = np.random.default_rng(depth)
    x = rng.normal(size=(2, 3, depth)).astype(np.float32)
    ours = median_filter(x, 7)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, reference_median(x, 7))


def test_alignment_heads_from_config_equal_openai_tiny_en_mask() -> None:
    config = json.loads((default_model_dir() / "config.json").read_text())
    from_config = alignment_heads(config, 4, 6)
    assert from_config == tuple(tuple(pair) for pair in config["alignment_heads"])
    assert decode_alignment_mask(OPENAI_TINY_EN_ALIGNMENT_HEADS, 4, 6) == from_config
    assert alignment_heads({}, 4, 6) == from_config  # the fallback
    with pytest.raises(ValueError, match="expected 2x6"):
        decode_alignment_mask(OPENAI_TINY_EN_ALIGNMENT_HEADS, 2, 6)


def test_alignment_matrix_keeps_text_rows_and_content_frames() -> None:
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(2, 9, 1500)).astype(np.float32)  # sot, notimestamps, 6 text, eot
    matrix = alignment_matrix(scores, num_frames=101, sot_length=1, text_length=6)
    assert matrix.shape == (7, 50) and matrix.dtype == np.float32
    probs = np.exp(scores[..., :50]) / np.exp(scores[..., :50]).sum(-1, keepdims=True)
    normed = (probs - probs.mean(-2, keepdims=True)) / probs.std(-2, keepdims=True)
    expected = reference_median(normed, 7).mean(0)[1:8]
    np.testing.assert_allclose(matrix, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "text",
    [
        " Hello, world! It's 22°C -- isn't it?",
        ' "Quoted" (bracketed) words... and ¿questions?',
        " naïve café résumé 日本語 ♪",
    ],
)
def test_word_split_matches_faster_whisper(text: str) -> None:
    tokens = [*TOK.encode(text), TOK.eot]
    assert TOK.split_to_word_tokens(tokens) == REF.split_to_word_tokens(tokens)
    with_timestamps = [TS + 3, *tokens[:-1], TS + 40, TOK.eot]
    assert TOK.decode_with_timestamps(with_timestamps) == REF.decode_with_timestamps(
        with_timestamps
    )


def _timings(words: list[tuple[str, list[int]]]) -> list[_Timing]:
    return [_Timing(w, list(t), float(i), float(i) + 0.5, 0.9) for i, (w, t) in enumerate(words)]


@pytest.mark.parametrize(
    "words",
    [
        [(" (", [1]), ("hello", [2]), (",", [3]), (" world", [4]), (".", [5]), ('"', [6])],
        [(' "', [1]), (" ¿", [2]), (" what", [3]), ("?", [4]), ("?", [5]), ("", [])],
        [(" -", [1]), (" a", [2]), (" b", [3]), ("!", [4])],
    ],
)
def test_merge_punctuations_matches_faster_whisper(words: list[tuple[str, list[int]]]) -> None:
    ours = _timings(words)
    theirs = [
        {"word": t.word, "tokens": list(t.tokens), "start": t.start, "end": t.end} for t in ours
    ]
    prepend, append = "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、"
    merge_punctuations(ours, prepend, append)
    fw_transcribe.merge_punctuations(theirs, prepend, append)
    assert [(t.word, t.tokens) for t in ours] == [(t["word"], t["tokens"]) for t in theirs]


TEXTS = (
    " Good morning, everyone. Let's start.",  # rows 0-8: Good morning , everyone . Let 's start .
    " The weekly meeting (quickly).",  # rows 9-15
    " Maria finished the budget report!",  # rows 16-21; row 22 is <|endoftext|>
)
APPEND = "\"'.。,，!！?？:：”)]}、"


@attrs.frozen
class Case:
    """A synthetic window: frames per DTW row (default 10), segment stamps, history."""

    spans: dict[int, int]
    stamps: tuple[tuple[int, int], ...] = ((0, 60), (60, 150), (150, 250))
    last_speech: float = 0.0
    seek: int = 0
    append: str = APPEND


CASES = {
    "plain": Case({}),
    "word_after_sentence_end_too_long": Case({5: 80}),  # "Let's" starts late
    "sentence_end_too_long": Case({4: 80}, append=""),  # an unmerged "." is cut
    "long_first_word_after_a_pause": Case({0: 150}),
    "two_long_words_after_a_pause": Case({0: 150, 1: 150}),
    "segment_start_preferred": Case({0: 150}, stamps=((145, 250),), last_speech=99.0),
    "segment_end_preferred": Case({7: 200}, stamps=((0, 75),), last_speech=99.0),
    "later_window": Case({}, stamps=((10, 90), (90, 200)), last_speech=20.0, seek=1873),
}


def _alignment(case: Case, rows: int, probs: list[float]) -> TokenAlignment:
    """A DTW path from (0, 0) giving row ``r`` ``case.spans.get(r, 10)`` consecutive frames."""
    text_indices: list[int] = []
    time_indices: list[int] = []
    frame = 0
    for row in range(rows):
        for _ in range(case.spans.get(row, 10)):
            text_indices.append(row)
            time_indices.append(frame)
            frame += 1
    return TokenAlignment(np.asarray(text_indices), np.asarray(time_indices), probs)


@pytest.mark.parametrize("name", list(CASES))
def test_add_word_timestamps_matches_faster_whisper(name: str) -> None:
    case = CASES[name]
    offset = case.seek / 100
    pieces = [
        Piece(
            offset + start * 0.02,
            offset + end * 0.02,
            [TS + start, *TOK.encode(text), TS + end],
            0,
        )
        for (start, end), text in zip(case.stamps, TEXTS, strict=False)
    ]
    text_tokens = [t for p in pieces for t in p.tokens if t < TOK.eot]
    probs = [float(p) for p in np.random.default_rng(len(name)).uniform(0.05, 1, len(text_tokens))]
    aligned = _alignment(case, len(text_tokens) + 1, probs)
    reference_segments: list[dict[str, Any]] = [
        {"seek": case.seek, "start": p.start, "end": p.end, "tokens": list(p.tokens)}
        for p in pieces
    ]

    def fake_align(*args: Any, **kwargs: Any) -> list[Any]:
        pairs = list(zip(aligned.text_indices.tolist(), aligned.time_indices.tolist(), strict=True))
        return [SimpleNamespace(alignments=pairs, text_token_probs=list(aligned.token_probs))]

    fake = SimpleNamespace(
        model=SimpleNamespace(align=fake_align), frames_per_second=100, tokens_per_second=50
    )
    fake.find_alignment = lambda *a, **k: fw_transcribe.WhisperModel.find_alignment(fake, *a, **k)
    theirs = copy.deepcopy(reference_segments)
    their_last = fw_transcribe.WhisperModel.add_word_timestamps(
        fake, [theirs], REF, None, 3000, "\"'“¿([{-", case.append, case.last_speech
    )
    seen: list[tuple[list[int], int]] = []

    def align(tokens: list[int], frames: int) -> TokenAlignment:
        seen.append((tokens, frames))
        return aligned

    our_last = add_word_timestamps(
        pieces, TOK, align, 3000, case.seek, case.last_speech, append_punctuations=case.append
    )
    assert seen == [(text_tokens, 3000)]
    assert our_last == their_last
    for piece, ref in zip(pieces, theirs, strict=True):
        assert (piece.start, piece.end) == (ref["start"], ref["end"])
        assert piece.words is not None
        assert [(w.word, w.start, w.end, w.probability) for w in piece.words] == [
            (w["word"], w["start"], w["end"], w["probability"]) for w in ref["words"]
        ]
    ends = [w["end"] for s in theirs for w in s["words"]]
    assert last_word_end(pieces) == (ends[-1] if ends else theirs[-1]["end"])


def test_no_pieces_and_no_text() -> None:
    def never(tokens: list[int], frames: int) -> TokenAlignment:
        raise AssertionError("nothing to align")

    assert add_word_timestamps([], TOK, never, 3000, 0, 1.5) == 1.5
    only_stamps = [Piece(0.0, 1.0, [TS, TS + 50], 0)]
    assert add_word_timestamps(only_stamps, TOK, never, 3000, 0, 1.5) == 1.5
    assert only_stamps[0].words == [] and last_word_end(only_stamps) == 1.0
    assert last_word_end([]) is None
