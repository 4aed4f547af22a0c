"""The fixtures families' validation plans and bench workloads read, and their hashes."""

from __future__ import annotations

import hashlib
import wave
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
"""The checkout's test fixtures (``tests/data/<family>/...``)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fixture_audio(path: Path) -> np.ndarray:
    """A fixture decoded for a 16 kHz model (the server's own decoder); a clear error when the
    checkout does not have it."""
    from server.audio import load_for_model

    if not path.exists():
        raise FileNotFoundError(
            f"validation fixture {path} is missing (run from a voxpool checkout)"
        )
    return load_for_model(path.read_bytes(), 16000)


def audio_meta(audio: np.ndarray, **options: Any) -> dict[str, Any]:
    """What identifies an audio input in the validation record."""
    return {
        "samples": int(audio.size),
        "sha256": sha256(audio.astype(np.float32).tobytes()),
        **options,
    }


def read_wav(path: Path) -> np.ndarray:
    """16-bit mono WAV as float32 in [-1, 1] (the benches' reader)."""
    with wave.open(str(path)) as f:
        if f.getsampwidth() != 2 or f.getnchannels() != 1:
            raise ValueError(f"{path}: expected 16-bit mono")
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32768.0).copy()
