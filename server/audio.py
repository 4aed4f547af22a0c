"""Audio I/O for the server and CLI: WAV decoding, resampling, encoding, base64.

Clients send WAV files of any common shape (8/16/24/32-bit integer or 32/64-bit
float PCM, any channel count, any rate); models want mono float32 at their own
rate. Malformed input raises :class:`AudioError` with a message fit for a 400.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from functools import lru_cache

import numpy as np

from backends.wav import pcm16_bytes, wav_bytes

MAX_CHANNELS = 16


class AudioError(ValueError):
    """Input audio that cannot be decoded or used."""


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float32 samples in [-1, 1] and the sample rate of a RIFF/WAVE file."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("audio is not a WAV file (RIFF/WAVE header missing)")
    pos = 12
    fmt: tuple[int, int, int, int] | None = None
    payload: bytes | None = None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack("<I", data[pos + 4 : pos + 8])[0]
        body = data[pos + 8 : pos + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise AudioError("WAV fmt chunk is too short")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: subformat's first two bytes
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            payload = data[pos + 8 : pos + 8 + min(size, len(data) - pos - 8)]
            if fmt is not None:
                break
        pos += 8 + size + (size & 1)
    if fmt is None:
        raise AudioError("WAV file has no fmt chunk")
    if payload is None:
        raise AudioError("WAV file has no data chunk")
    tag, channels, rate, bits = fmt
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"WAV channel count {channels} is not supported (1..{MAX_CHANNELS})")
    if not 1000 <= rate <= 384000:
        raise AudioError(f"WAV sample rate {rate} is out of range (1000..384000)")
    width = bits // 8
    usable = len(payload) - len(payload) % (width * channels) if width else 0
    raw = payload[:usable]
    if tag == 1 and bits == 16:
        samples = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif tag == 1 and bits == 8:
        samples = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif tag == 1 and bits == 24:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8
        samples = ints.astype(np.float32) / 8388608.0
    elif tag == 1 and bits == 32:
        samples = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    elif tag == 3 and bits == 32:
        samples = np.frombuffer(raw, "<f4").astype(np.float32)
    elif tag == 3 and bits == 64:
        samples = np.frombuffer(raw, "<f8").astype(np.float32)
    else:
        raise AudioError(f"WAV encoding (format {tag}, {bits} bits) is not supported")
    if not np.isfinite(samples).all():
        raise AudioError("WAV contains NaN or infinite samples")
    mono = samples.reshape(-1, channels).mean(axis=1) if channels > 1 else samples
    return np.ascontiguousarray(mono, dtype=np.float32), rate


@lru_cache(maxsize=16)
def _filter(up: int, down: int, half: int, beta: float) -> np.ndarray:
    cutoff = 0.5 * min(1.0, up / down) * 0.95
    phases = np.arange(up) / up
    taps = np.arange(-half + 1, half + 1)
    t = phases[:, None] - taps[None, :]
    window = np.i0(beta * np.sqrt(np.clip(1.0 - (t / half) ** 2, 0.0, None))) / np.i0(beta)
    h = 2 * cutoff * np.sinc(2 * cutoff * t) * window
    h /= h.sum(axis=1, keepdims=True)
    return h


def resample(audio: np.ndarray, src: int, dst: int, half: int = 16, beta: float = 8.0) -> np.ndarray:
    """Polyphase Kaiser-windowed sinc resampling from ``src`` to ``dst`` Hz (deterministic)."""
    if src == dst:
        return np.ascontiguousarray(audio, dtype=np.float32)
    g = math.gcd(src, dst)
    up, down = dst // g, src // g
    h = _filter(up, down, half, beta)
    taps = np.arange(-half + 1, half + 1)
    padded = np.pad(audio.astype(np.float64), (half, half + 1))
    n_out = (len(audio) * up) // down
    n = np.arange(n_out)
    base = (n * down) // up
    phase = (n * down) % up
    out = np.empty(n_out)
    for lo in range(0, n_out, 65536):
        sl = slice(lo, min(n_out, lo + 65536))
        idx = base[sl, None] + taps[None, :] + half
        out[sl] = np.sum(padded[idx] * h[phase[sl]], axis=1)
    return out.astype(np.float32)


def load_for_model(data: bytes, rate: int) -> np.ndarray:
    """Decode a WAV and bring it to mono float32 at ``rate``."""
    samples, src = decode_wav(data)
    if samples.size == 0:
        raise AudioError("audio is empty")
    return resample(samples, src, rate)


pcm16 = pcm16_bytes
__all__ = ["AudioError", "b64decode", "b64encode", "decode_wav", "load_for_model", "pcm16", "resample", "streaming_wav_header", "wav_bytes"]


def streaming_wav_header(rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes set to the maximum)."""
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


def b64decode(text: str, what: str = "audio_base64") -> bytes:
    """Strict base64 (standard alphabet) with a clear error."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioError(f"{what} is not valid base64") from exc
    if not data:
        raise AudioError(f"{what} is empty")
    return data


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
