"""Decoding rules and long-form bookkeeping against faster-whisper's own functions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import tokenizers

from backends.whisper.decoding import TimestampRules, _log_softmax, build_prompt
from backends.whisper.longform import _split
from backends.whisper.session import default_model_dir
from backends.whisper.tokenizer import WhisperTokenizer

fw_transcribe = pytest.importorskip("faster_whisper.transcribe")
fw_tokenizer = pytest.importorskip("faster_whisper.tokenizer")

TOK = WhisperTokenizer(default_model_dir() / "tokenizer.json")
REF = fw_tokenizer.Tokenizer(
    tokenizers.Tokenizer.from_file(str(default_model_dir() / "tokenizer.json")), False
)
FW = SimpleNamespace(time_precision=0.02, input_stride=2, max_length=448)
VOCAB = 51864
TS = TOK.timestamp_begin


def test_special_ids_and_suppression_sets() -> None:
    assert (TOK.eot, TOK.sot, TOK.sot_prev, TOK.no_timestamps, TOK.no_speech) == (
        REF.eot,
        REF.sot,
        REF.sot_prev,
        REF.no_timestamps,
        REF.no_speech,
    )
    ours = TOK.suppressed_tokens([-1])
    assert ours == fw_transcribe.get_suppressed_tokens(REF, [-1])
    config = json.loads((default_model_dir() / "config.json").read_text())
    assert set(ours) == set(config["suppress_ids"])
    assert TOK.suppressed_tokens([5, 7]) == fw_transcribe.get_suppressed_tokens(REF, [5, 7])
    assert TOK.decode([*TOK.encode(" Hello there."), TS + 3, TOK.eot]) == " Hello there."


@pytest.mark.parametrize(
    "tokens",
    [
        [TS, 100, 200, TS + 50, TS + 50, 300, TS + 120],  # single timestamp ending
        [TS, 100, 200, TS + 50, TS + 50, 300, 400],  # unfinished last segment
        [TS, 100, TS + 10, TS + 10, 200, TS + 20, TS + 20],  # pairs only
        [TS + 5, 100, 200, TS + 60],  # one segment, no consecutive timestamps
        [100, 200],  # no timestamps at all
        [TS, 100, TS],  # ends on the initial timestamp value
    ],
)
def test_split_matches_faster_whisper(tokens: list[int]) -> None:
    for seek, size in ((0, 3000), (2460, 3000), (4100, 1374)):
        offset = seek * 0.01
        ours, next_seek = _split(TOK, tokens, offset, size, size * 0.01, seek)
        ref, ref_seek, _ = fw_transcribe.WhisperModel._split_segments_by_timestamps(
            FW, REF, tokens, offset, size, size * 0.01, seek
        )
        assert next_seek == ref_seek
        assert [(s, e, t) for s, e, t, _ in ours] == [
            (r["start"], r["end"], r["tokens"]) for r in ref
        ]
        for *_, part, at in ours:
            assert tokens[at : at + len(part)] == part


@pytest.mark.parametrize("previous", [[], [11, 12, 13], list(range(1, 400))])
def test_prompt_matches_faster_whisper(previous: list[int]) -> None:
    assert build_prompt(TOK, previous) == fw_transcribe.WhisperModel.get_prompt(FW, REF, previous)


def _rules() -> TimestampRules:
    return TimestampRules(TOK, VOCAB, max_initial_index=50)


def test_first_step_must_be_an_early_timestamp() -> None:
    logits = np.zeros(VOCAB, np.float32)
    _rules().apply(0, logits, [])
    allowed = np.flatnonzero(np.isfinite(logits))
    assert allowed.tolist() == list(range(TS, TS + 51))


def test_timestamps_pair_up_and_never_decrease() -> None:
    rules = _rules()
    after_pair = np.zeros(VOCAB, np.float32)
    rules.apply(3, after_pair, [TS, 100, TS + 20])  # text then a timestamp: close or pair it
    assert np.all(np.isneginf(after_pair[: TOK.eot]))  # no text right after a lone timestamp
    assert np.all(np.isneginf(after_pair[TS : TS + 20])) and np.isfinite(after_pair[TS + 20])
    closed = np.zeros(VOCAB, np.float32)
    rules.apply(4, closed, [TS, 100, TS + 20, TS + 20])  # a pair: next must not be a timestamp
    assert np.all(np.isneginf(closed[TS:])) and np.isfinite(closed[100])
    assert np.isneginf(closed[TOK.no_timestamps])


def test_timestamp_forced_when_their_total_probability_wins() -> None:
    logits = np.full(VOCAB, -20.0, np.float32)
    logits[100] = 2.0  # best single token is text...
    logits[TS + 30 : TS + 60] = 0.5  # ...but the 30 timestamps together are likelier
    assert _rules().apply(2, logits, [TS, 100]) is None  # masked after its softmax
    assert np.all(np.isneginf(logits[:TS]))
    kept = np.full(VOCAB, -20.0, np.float32)
    kept[100] = 6.0
    kept[TS + 30 : TS + 60] = 0.5
    log_probs = _rules().apply(2, kept, [TS, 100])
    assert kept[100] == 6.0
    # unmasked by the logprob rule: its softmax is handed back, the very values of the
    # masked logits' log-softmax (the decoder uses them instead of computing them again)
    assert log_probs is not None
    assert np.array_equal(log_probs, _log_softmax(kept))
