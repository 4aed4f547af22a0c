"""16-bit PCM and WAV encoding of float audio, shared by the families, server and CLI."""

from __future__ import annotations

import io
import wave

import numpy as np

_MAX_WAV_VALUE = 32767.0


def pcm16_bytes(audio: np.ndarray) -> bytes:
    """float [-1, 1] -> little-endian int16 PCM, converted as piper does (clip, truncate)."""
    scaled = np.clip(audio * _MAX_WAV_VALUE, -_MAX_WAV_VALUE, _MAX_WAV_VALUE)
    return scaled.astype("<i2").tobytes()


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """A mono 16-bit WAV file of ``audio``."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm16_bytes(audio))
    return buf.getvalue()
