"""Test inputs in every upload format, made with PyAV from a WAV (tests/data), as clients make them.

``encode_as(wav, "webm")`` is what a browser's MediaRecorder sends (Opus in WebM,
written as a stream, so the file states no duration); ``m4a`` is what phones
record (AAC in an MPEG-4 container); ``mp3``, ``mpeg`` and ``mpga`` are MPEG
audio files under OpenAI's three names for them.
"""

from __future__ import annotations

import io
import wave
from typing import Any

import av
import numpy as np

UPLOADS: dict[str, tuple[str, str, int | None, bool]] = {
    # extension: (muxer, encoder, encoder rate (None: the WAV's), written as a stream)
    "flac": ("flac", "flac", None, False),
    "mp3": ("mp3", "libmp3lame", None, False),
    "mp4": ("mp4", "aac", None, False),
    "mpeg": ("mp3", "libmp3lame", None, False),
    "mpga": ("mp3", "libmp3lame", None, False),
    "m4a": ("ipod", "aac", None, False),
    "ogg": ("ogg", "libopus", 48000, False),
    "webm": ("webm", "libopus", 48000, True),
    # beyond OpenAI's list
    "aac": ("adts", "aac", None, True),
    "oga": ("ogg", "vorbis", None, False),  # stereo
    "mkv": ("matroska", "flac", None, False),
    "aiff": ("aiff", "pcm_s16be", None, False),
}
"""Every format :func:`encode_as` writes; OpenAI's upload formats (and ``wav``) first."""
OPENAI_UPLOADS = ("flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm")
"""The formats OpenAI's transcription endpoint takes."""


class _Stream:
    """A write-only file: a muxer writes it as it would a pipe (no seeking back)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, chunk: Any) -> int:
        self.data += bytes(chunk)
        return len(chunk)


def wav_samples(wav_data: bytes) -> tuple[np.ndarray, int, int]:
    """The int16 samples (frames x channels), rate and channel count of a 16-bit WAV."""
    with wave.open(io.BytesIO(wav_data)) as w:
        assert w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())
        return pcm, w.getframerate(), w.getnchannels()


def encode_as(wav_data: bytes, ext: str) -> bytes:
    """A 16-bit PCM WAV re-encoded as a file of ``ext`` (a key of :data:`UPLOADS`, or ``wav``)."""
    if ext == "wav":
        return wav_data
    muxer, codec, rate, streamed = UPLOADS[ext]
    pcm, src_rate, channels = wav_samples(wav_data)
    if codec == "vorbis" and channels == 1:  # FFmpeg's own Vorbis encoder writes stereo only
        pcm, channels = np.repeat(pcm, 2, axis=1), 2
    layout = "mono" if channels == 1 else "stereo"
    target: Any = _Stream() if streamed else io.BytesIO()
    with av.open(target, mode="w", format=muxer) as out:
        options = {"strict": "experimental"} if codec == "vorbis" else {}  # FFmpeg's own
        stream: Any = out.add_stream(codec, rate=rate or src_rate, layout=layout, options=options)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1).copy(), format="s16", layout=layout)
        frame.sample_rate = src_rate
        frame.pts = 0
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return bytes(target.data) if streamed else target.getvalue()
