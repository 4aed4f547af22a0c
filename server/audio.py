"""Audio I/O for the server and CLI: WAV decoding, resampling, encoding, base64.

Clients send WAV files of any common shape (8/16/24/32-bit integer or 32/64-bit
float PCM, any channel count, any rate) or compressed audio (MP3, FLAC, Ogg,
MP4/M4A, WebM...: :mod:`server.codecs`, through PyAV); models want mono
float32 at their own rate. WAV is always read here, exactly; everything else is
decoded by :mod:`server.codecs`. Malformed input raises :class:`AudioError`
with a message fit for a 400.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Callable
from functools import lru_cache

import attrs
import numpy as np

from backends.wav import pcm16_bytes, wav_bytes
from server.audio_errors import MAX_CHANNELS, RATES, AudioError, AudioLimitError

MAX_CHUNKS = 1024
"""RIFF chunks read before ``fmt `` and ``data`` are found; more is not a WAV anyone writes."""
BLOCK = 16384
"""Output samples per resampling block: the working set is about ``BLOCK * 32 * 8 * 4`` bytes."""
_FORMATS = {(1, 8), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64)}


@attrs.frozen
class WavLayout:
    """What a WAV header says: encoding, channels, rate, and where the whole frames are."""

    tag: int
    channels: int
    rate: int
    bits: int
    start: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


def wav_layout(data: bytes) -> WavLayout:
    """Read a RIFF/WAVE header without decoding a sample (:class:`AudioError` if unusable)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise AudioError("audio is not a WAV file (RIFF/WAVE header missing)")
    view = memoryview(data)
    pos = 12
    fmt: tuple[int, int, int, int] | None = None
    payload: tuple[int, int] | None = None
    for _ in range(MAX_CHUNKS):
        if pos + 8 > len(data):
            break
        cid, size = bytes(view[pos : pos + 4]), struct.unpack("<I", view[pos + 4 : pos + 8])[0]
        if cid == b"fmt ":
            body = bytes(view[pos + 8 : pos + 8 + min(size, 64)])
            if len(body) < 16:
                raise AudioError("WAV fmt chunk is too short")
            tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
            if (
                tag == 0xFFFE and len(body) >= 26
            ):  # WAVE_FORMAT_EXTENSIBLE: subformat's first two bytes
                tag = struct.unpack("<H", body[24:26])[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data":
            payload = (pos + 8, min(size, len(data) - pos - 8))
            if fmt is not None:
                break
        pos += 8 + size + (size & 1)
    else:
        raise AudioError(f"WAV file has more than {MAX_CHUNKS} chunks before its audio")
    if fmt is None:
        raise AudioError("WAV file has no fmt chunk")
    if payload is None:
        raise AudioError("WAV file has no data chunk")
    tag, channels, rate, bits = fmt
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"WAV channel count {channels} is not supported (1..{MAX_CHANNELS})")
    if not RATES[0] <= rate <= RATES[1]:
        raise AudioError(f"WAV sample rate {rate} is out of range ({RATES[0]}..{RATES[1]})")
    if (tag, bits) not in _FORMATS:
        raise AudioError(f"WAV encoding (format {tag}, {bits} bits) is not supported")
    start, size = payload
    return WavLayout(tag, channels, rate, bits, start, size // (bits // 8 * channels))


def _frames(data: bytes, layout: WavLayout, lo: int, hi: int) -> np.ndarray:
    """Frames ``[lo, hi)`` as mono float32 in [-1, 1] (channels averaged)."""
    width = layout.bits // 8
    frame = width * layout.channels
    raw = memoryview(data)[layout.start + lo * frame : layout.start + hi * frame]
    tag, bits = layout.tag, layout.bits
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
    else:
        samples = np.frombuffer(raw, "<f8").astype(np.float32)
    if tag == 3 and not np.isfinite(samples).all():
        raise AudioError("WAV contains NaN or infinite samples")
    return samples.reshape(-1, layout.channels).mean(axis=1) if layout.channels > 1 else samples


def decode_wav(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float32 samples in [-1, 1] and the sample rate of a RIFF/WAVE file."""
    layout = wav_layout(data)
    out = np.empty(layout.frames, dtype=np.float32)
    step = BLOCK * 4
    for lo in range(0, layout.frames, step):
        hi = min(layout.frames, lo + step)
        out[lo:hi] = _frames(data, layout, lo, hi)
    return out, layout.rate


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


def _resample_blocks(
    source: Callable[[int, int], np.ndarray], n_in: int, src: int, dst: int, half: int, beta: float
) -> np.ndarray:
    """Polyphase resampling of ``n_in`` samples read block by block from ``source(lo, hi)``.

    Each output block reads only the input samples its taps reach, so the working
    set is bounded by :data:`BLOCK` whatever the length; the arithmetic is the
    same as one pass over the whole signal, so the result is too.
    """
    if src == dst:
        out = np.empty(n_in, dtype=np.float32)
        for lo in range(0, n_in, BLOCK * 4):
            out[lo : min(n_in, lo + BLOCK * 4)] = source(lo, min(n_in, lo + BLOCK * 4))
        return out
    g = math.gcd(src, dst)
    up, down = dst // g, src // g
    h = _filter(up, down, half, beta)
    taps = np.arange(-half + 1, half + 1)
    n_out = (n_in * up) // down
    out = np.empty(n_out, dtype=np.float32)
    for lo in range(0, n_out, BLOCK):
        n = np.arange(lo, min(n_out, lo + BLOCK), dtype=np.int64)
        base = (n * down) // up
        phase = (n * down) % up
        s0, s1 = int(base[0]) - half + 1, int(base[-1]) + half + 1
        segment = np.zeros(s1 - s0, dtype=np.float64)  # zero outside the signal, as padding
        a0, a1 = max(s0, 0), min(s1, n_in)
        if a1 > a0:
            segment[a0 - s0 : a1 - s0] = source(a0, a1)
        idx = (base - s0)[:, None] + taps[None, :]
        out[lo : lo + n.size] = np.sum(segment[idx] * h[phase], axis=1)
    return out


def resample(
    audio: np.ndarray, src: int, dst: int, half: int = 16, beta: float = 8.0
) -> np.ndarray:
    """Polyphase Kaiser-windowed sinc resampling from ``src`` to ``dst`` Hz (deterministic)."""
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    return _resample_blocks(lambda lo, hi: samples[lo:hi], samples.size, src, dst, half, beta)


def is_wav(data: bytes) -> bool:
    """Whether ``data`` is for the WAV reader (a RIFF file; :func:`wav_layout` checks the rest)."""
    return data[:4] == b"RIFF"


def load_for_model(data: bytes, rate: int, max_seconds: float | None = None) -> np.ndarray:
    """Decode audio and bring it to mono float32 at ``rate``, in bounded blocks.

    A WAV (a RIFF file) is read here: ``max_seconds`` is checked from its
    header, before any sample is decoded, and longer audio is an
    :class:`AudioLimitError`. Memory: the output (``4 * rate`` bytes a second)
    plus a fixed working set, whatever the input's rate, width or channel
    count. Anything else goes to :func:`server.codecs.decode` (its stated
    duration checked up front, its decoded duration as it decodes).
    """
    if not is_wav(data):
        try:
            from server.codecs import decode
        except ImportError:  # pragma: no cover - PyAV comes with the server extra
            raise AudioError(
                "compressed audio needs PyAV (pip install 'voxpool[server]'); send a WAV file"
            ) from None
        return decode(data, rate, max_seconds)
    layout = wav_layout(data)
    if layout.frames == 0:
        raise AudioError("audio is empty")
    if max_seconds is not None and layout.seconds > max_seconds:
        raise AudioLimitError(layout.seconds, max_seconds)
    return _resample_blocks(
        lambda lo, hi: _frames(data, layout, lo, hi), layout.frames, layout.rate, rate, 16, 8.0
    )


pcm16 = pcm16_bytes
__all__ = [
    "MAX_CHANNELS",
    "AudioError",
    "AudioLimitError",
    "WavLayout",
    "b64decode",
    "b64encode",
    "decode_wav",
    "is_wav",
    "load_for_model",
    "pcm16",
    "resample",
    "wav_bytes",
    "wav_layout",
]


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
