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


POISON = 0.123456
"""A sample value :func:`poisoned_forward` makes Silero VAD's forward fail on."""


@pytest.fixture
def poisoned_forward(monkeypatch: pytest.MonkeyPatch) -> float:
    """Silero VAD's encoders (the GEMM path and the exact row path) raise on any window
    holding :data:`POISON`; returns that value (as float32) for the test to plant."""
    from backends.silero_vad import model

    real_host, real_rows = model.host_encode, model.encode_all
    poison = np.float32(POISON)

    def host_encode(weights: Any, windows: np.ndarray) -> np.ndarray:
        if (np.asarray(windows) == poison).any():
            raise FloatingPointError("a poisoned window")
        return real_host(weights, windows)

    def encode_all(be: Any, weights: Any, windows: np.ndarray) -> Any:
        host_encode(weights, windows)  # the same test, for the exact path
        return real_rows(be, weights, windows)

    monkeypatch.setattr(model, "host_encode", host_encode)
    monkeypatch.setattr(model, "encode_all", encode_all)
    return float(poison)
