"""The whisper tests' audio: the fixture clips under tests/data/whisper, read as 16 kHz PCM."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent.parent / "data" / "whisper"
FIXTURES = json.loads((DATA / "fixtures.json").read_text())
"""The parity fixtures: name, file, faster-whisper's transcript."""

CLIP = DATA / "short.wav"
"""The short English clip of the session, fallback and memory tests."""


def read_pcm(path: Path) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV's samples (int16, a writable copy)."""
    with wave.open(str(path)) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (16000, 1, 2)
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").copy()


def load_wav(name: str) -> np.ndarray:
    """The fixture file ``name`` as float32 in [-1, 1)."""
    return read_pcm(DATA / name).astype(np.float32) / np.float32(32768.0)


def words(text: str) -> list[str]:
    """``text`` as words for a word error rate: lower case, punctuation dropped (apostrophes
    kept), hyphens as spaces; no spelling or number normalisation."""
    kept = "".join(c if c.isalnum() or c == "'" else " " for c in text.lower())
    return kept.split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, over :func:`words`."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))  # edit distances of ref[:i] to each prefix of hyp
    for i, r in enumerate(ref, start=1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / max(1, len(ref))
