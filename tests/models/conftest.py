"""Fixtures shared by the model tests.

Module-scoped, as each test module had them: a model loads once in every module that
asks for it, and a thread limit holds over the module that asks for it
(``pytestmark = pytest.mark.usefixtures("one_thread")``). The families are imported
inside the fixtures, so a module imports only the family it tests.
"""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

WHISPER_CLIP = Path(__file__).parent.parent / "data" / "whisper" / "short.wav"
"""The short English clip of the whisper session tests (16 kHz mono int16)."""


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One thread in every pool: multi-threaded OpenBLAS GEMVs crawl on a loaded 2-core CI
    machine (the whisper tests)."""
    with threadpool_limits(limits=1):
        yield


@pytest.fixture(scope="module")
def one_blas_thread() -> Iterator[None]:
    """One BLAS thread (the piper tests)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def vad_factory() -> Any:
    """Silero VAD's factory on its default (safetensors) weights."""
    from backends.silero_vad import load_factory

    return load_factory()


@pytest.fixture(scope="module")
def vad_clip() -> np.ndarray:
    """The speech clip of silero's reference fixture."""
    from tests.models.silero_vad_reference import fixture

    return np.array(fixture()[0])


@pytest.fixture(scope="module")
def whisper_factory() -> Any:
    """Whisper's factory (tiny.en)."""
    from backends.whisper import load_factory

    return load_factory()


@pytest.fixture(scope="module")
def whisper_pcm() -> np.ndarray:
    """:data:`WHISPER_CLIP`'s samples (int16)."""
    with wave.open(str(WHISPER_CLIP)) as f:
        return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").copy()
