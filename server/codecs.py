"""Compressed audio in and out, through PyAV (FFmpeg's libraries, bundled in its wheels).

Decoding (:func:`decode`) takes every upload format but WAV, which keeps its own
exact reader in :mod:`server.audio`: the format is recognised from the first
bytes (never from a file name), the demuxer is named explicitly and limited to
:data:`DEMUXERS`, so FFmpeg never probes for playlist or concat formats that
could open other files. The first audio stream is decoded packet by packet and
resampled (FFmpeg's swresample) frame by frame to the model's rate; channels
are averaged, as the WAV reader does. The container's duration is checked
before the first packet, the decoded duration after every frame, so no input
decodes past ``max_seconds``.

Encoding (:func:`encode_speech`, :class:`StreamEncoder`) writes a mono 16-bit
signal, the same samples as the WAV answer, as MP3, Ogg Opus, AAC (ADTS) or
FLAC; WAV and PCM are written directly. A stream encoder gives bytes as they
are produced, in a container that can be played while it arrives.

Every function here blocks: call them in a worker thread.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Iterator
from typing import Any

import attrs
import av
import av.error
import numpy as np

from backends.wav import pcm16_bytes as pcm16
from backends.wav import wav_bytes
from server.audio_errors import MAX_CHANNELS, RATES, AudioError, AudioLimitError

DEMUXERS = ("mp3", "aac", "flac", "ogg", "mov", "matroska", "aiff")
"""FFmpeg demuxers an upload may use (``mov`` reads MP4/M4A, ``matroska`` WebM)."""
DECODERS = frozenset(
    {"mp3", "mp3float", "mp2", "mp2float", "mp1", "mp1float", "aac", "aac_fixed", "aac_latm"}
    | {"opus", "libopus", "vorbis", "libvorbis", "flac", "alac"}
)
"""Audio decoders an upload may need, besides FFmpeg's PCM ones (``pcm_*``)."""
INPUT_FORMATS = "WAV, FLAC, MP3, AAC (ADTS), Ogg (Opus, Vorbis, FLAC), MP4/M4A, WebM/Matroska, AIFF"
ESTIMATED = frozenset({"mp3", "aac"})
"""Demuxers whose duration FFmpeg may estimate from the bit rate (no Xing/VBRI header, ADTS)."""
ESTIMATE_SLACK = 1.25
"""An estimated duration refuses a file up front only this far past the limit; the
decoded duration decides the rest."""
MIN_CAPACITY_S = 30.0
"""Seconds of output allocated at first when the container does not say its duration."""
MAX_CAPACITY_S = 600.0
"""At most this many seconds allocated at first, whatever the container says (it may lie)."""


def _mpeg_kind(head: bytes) -> str | None:
    """``mp3`` for an MPEG audio frame sync, ``aac`` for an ADTS one, else None."""
    if len(head) < 2 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    if head[1] & 0xF6 == 0xF0:  # MPEG-2/4 sync (12 bits) with layer 00: ADTS
        return "aac"
    if (head[1] >> 1) & 3 and (head[1] >> 3) & 3 != 1:  # a layer, and a defined version
        return "mp3"
    return None


def sniff(data: bytes) -> str | None:
    """The demuxer for ``data`` from its first bytes.

    None when it is none of :data:`DEMUXERS`.
    """
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if data[:4] == b"FORM" and data[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if len(data) >= 12 and data[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        return "mov"
    if data[:3] == b"ID3":  # an ID3v2 tag, then (usually) MPEG audio
        if len(data) < 10:
            return "mp3"
        size = (
            (data[6] & 0x7F) << 21 | (data[7] & 0x7F) << 14 | (data[8] & 0x7F) << 7 | data[9] & 0x7F
        )
        after = 10 + size + (10 if data[5] & 0x10 else 0)
        return _mpeg_kind(data[after : after + 2]) or "mp3"
    return _mpeg_kind(data[:2])


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "strerror", None) or exc)
    return text.strip().rstrip(".")[:160]


def _reported_seconds(container: Any, stream: Any) -> float | None:
    """The duration the container states (None when it does not)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / av.time_base
    return None


def _check_stream(stream: Any) -> None:
    if stream.codec_context is None:  # FFmpeg has no decoder for it (or the id is garbage)
        raise AudioError("the file's audio codec is not supported")
    name = stream.codec_context.name
    if name not in DECODERS and not name.startswith("pcm_"):
        raise AudioError(f"audio codec {name!r} is not supported")
    channels = stream.codec_context.channels
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"audio channel count {channels} is not supported (1..{MAX_CHANNELS})")
    rate = stream.codec_context.sample_rate
    if not RATES[0] <= rate <= RATES[1]:
        raise AudioError(f"audio sample rate {rate} is out of range ({RATES[0]}..{RATES[1]})")


def _frames(container: Any, stream: Any) -> Iterator[Any]:
    for packet in container.demux(stream):
        yield from packet.decode()


def decode(data: bytes, rate: int, max_seconds: float | None = None) -> np.ndarray:
    """A compressed (or AIFF) file as mono float32 at ``rate``, decoded in bounded steps.

    Memory: the output (``4 * rate`` bytes a second, allocated from the
    container's stated duration and doubled when that runs out) plus one
    decoded frame. ``max_seconds`` refuses the file from its stated duration
    before decoding, and stops the decoding as soon as the output passes it.
    Raises :class:`AudioError` (or :class:`AudioLimitError`) with a message fit
    for a 400.
    """
    demuxer = sniff(data)
    if demuxer is None:
        raise AudioError(f"audio is not a WAV file or any other supported format ({INPUT_FORMATS})")
    limit = None if max_seconds is None else math.floor(max_seconds * rate)
    try:
        container = av.open(
            io.BytesIO(data),
            mode="r",
            format=demuxer,
            container_options={"format_whitelist": ",".join(DEMUXERS)},
        )
    except (av.error.FFmpegError, ValueError) as exc:
        raise AudioError(f"audio could not be read as {demuxer}: {_reason(exc)}") from None
    with container:
        if not container.streams.audio:
            raise AudioError("audio file has no audio stream")
        stream = container.streams.audio[0]
        _check_stream(stream)
        reported = _reported_seconds(container, stream)
        if max_seconds is not None and reported is not None:
            slack = ESTIMATE_SLACK if demuxer in ESTIMATED else 1.0
            if reported > max_seconds * slack:
                raise AudioLimitError(reported, max_seconds)
        guess = reported if reported is not None and reported > 0 else MIN_CAPACITY_S
        capacity = math.ceil(rate * min(guess, MAX_CAPACITY_S)) + rate
        if limit is not None:
            capacity = min(capacity, limit + 1)
        out = np.empty(max(capacity, 1), dtype=np.float32)
        n = 0
        resampler = av.AudioResampler(format="flt", rate=rate)
        try:
            for frame in _frames(container, stream):
                for block in resampler.resample(frame):
                    out, n = _append(out, n, block, limit, max_seconds)
            for block in resampler.resample(None):
                out, n = _append(out, n, block, limit, max_seconds)
        except (av.error.FFmpegError, ValueError) as exc:
            if isinstance(exc, AudioError):
                raise
            raise AudioError(f"audio could not be decoded ({demuxer}): {_reason(exc)}") from None
    if n == 0:
        raise AudioError("audio is empty")
    return out[:n]


def _append(
    out: np.ndarray, n: int, block: Any, limit: int | None, max_seconds: float | None
) -> tuple[np.ndarray, int]:
    """``block`` (packed float, any channel count) averaged to mono and written at ``out[n:]``."""
    channels = block.layout.nb_channels
    samples = block.to_ndarray().reshape(-1, channels)
    mono = samples.mean(axis=1, dtype=np.float32) if channels > 1 else samples[:, 0]
    if not np.isfinite(mono).all():
        raise AudioError("audio contains NaN or infinite samples")
    end = n + mono.size
    if limit is not None and end > limit:
        assert max_seconds is not None
        raise AudioLimitError(end / block.sample_rate, max_seconds, at_least=True)
    if end > out.size:
        size = max(end, 2 * out.size)
        grown = np.empty(size if limit is None else min(size, limit + 1), dtype=np.float32)
        grown[:n] = out[:n]
        out = grown
    out[n:end] = mono
    return out, end


@attrs.frozen
class SpeechFormat:
    """One ``response_format`` of speech: its media type and how it is encoded and streamed."""

    name: str
    content_type: str
    muxer: str | None = None
    codec: str | None = None
    rate: int | None = None
    """The encoder's sample rate (None: the synthesized rate)."""
    bit_rate: int | None = None
    options: tuple[tuple[str, str], ...] = ()
    stream_options: tuple[tuple[str, str], ...] = ()
    """Muxer options of a stream (a short Ogg page, so each sentence leaves promptly)."""


SPEECH_AUDIO: dict[str, SpeechFormat] = {
    "mp3": SpeechFormat("mp3", "audio/mpeg", "mp3", "libmp3lame", bit_rate=64000),
    "opus": SpeechFormat(
        "opus",
        "audio/ogg",
        "ogg",
        "libopus",
        rate=48000,
        bit_rate=32000,
        stream_options=(("page_duration", "60000"),),
    ),
    "aac": SpeechFormat("aac", "audio/aac", "adts", "aac", bit_rate=64000),
    "flac": SpeechFormat("flac", "audio/flac", "flac", "flac"),
    "wav": SpeechFormat("wav", "audio/wav"),
    "pcm": SpeechFormat("pcm", "audio/pcm"),
}
"""The audio ``response_format`` values of speech (docs/server.md, "Text to speech")."""
BLOCK_SAMPLES = 65536
"""Samples handed to an encoder at a time."""


class _Sink:
    """A write-only file for a muxer: non-seekable (a stream) unless it is a BytesIO."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Any) -> int:
        self.chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self.chunks)
        self.chunks.clear()
        return out


class _AvEncoder:
    """A muxer and encoder over a file object.

    Feed it 16-bit samples, collect the container's bytes.
    """

    def __init__(self, spec: SpeechFormat, rate: int, target: Any, stream: bool) -> None:
        assert spec.muxer is not None and spec.codec is not None
        # bitexact: the same samples give the same bytes (no random Ogg serial, no version tags)
        options = {"fflags": "+bitexact", **dict(spec.options)}
        if stream:
            options.update(spec.stream_options)
            options["flush_packets"] = "1"  # every packet leaves as it is muxed
        self.rate = rate
        self.pts = 0
        self.container: Any = av.open(target, mode="w", format=spec.muxer, options=options)
        self.stream: Any = self.container.add_stream(
            spec.codec, rate=output_rate(spec.name, rate), layout="mono"
        )
        if spec.bit_rate is not None:
            self.stream.codec_context.bit_rate = spec.bit_rate

    def feed(self, samples: np.ndarray) -> None:
        """Encode 16-bit mono ``samples`` (in blocks) and mux the packets."""
        for lo in range(0, samples.size, BLOCK_SAMPLES):
            part = samples[lo : lo + BLOCK_SAMPLES]
            frame = av.AudioFrame.from_ndarray(part.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self.pts
            self.pts += part.size
            self.container.mux(self.stream.encode(frame))

    def finish(self) -> None:
        self.container.mux(self.stream.encode(None))
        self.container.close()

    def close(self) -> None:
        self.container.close()


def _supported_rate(codec: str, rate: int) -> int:
    """``rate`` if the encoder takes it.

    Else the nearest rate above it that it takes (or its highest).
    """
    rates = av.codec.Codec(codec, "w").audio_rates
    if not rates or rate in rates:
        return rate
    above = sorted(r for r in rates if r >= rate)
    return above[0] if above else max(rates)


def streaming_wav_header(rate: int) -> bytes:
    """A mono 16-bit WAV header for a stream of unknown length (sizes set to the maximum)."""
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


def output_rate(fmt: str, rate: int) -> int:
    """The sample rate of ``fmt``'s audio for speech synthesized at ``rate``."""
    spec = SPEECH_AUDIO[fmt]
    if spec.codec is None:
        return rate
    return spec.rate or _supported_rate(spec.codec, rate)


def _int16(audio: np.ndarray) -> np.ndarray:
    """The WAV answer's samples: float [-1, 1] to int16 as :func:`server.audio.pcm16` converts."""
    return np.frombuffer(pcm16(np.asarray(audio, dtype=np.float32).reshape(-1)), dtype="<i2")


def encode_speech(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """Mono float audio at ``rate`` as one file in ``fmt`` (a key of :data:`SPEECH_AUDIO`).

    WAV and PCM are the bytes they always were. MP3, FLAC and Ogg go to a
    seekable buffer, so the muxer writes its finishing touches (MP3's Xing/LAME
    header, for exact length and gapless decoding; FLAC's total sample count and
    MD5).
    """
    if fmt == "wav":
        return wav_bytes(audio, rate)
    if fmt == "pcm":
        return pcm16(audio)
    buf = io.BytesIO()
    try:
        encoder = _AvEncoder(SPEECH_AUDIO[fmt], rate, buf, stream=False)
        encoder.feed(_int16(audio))
        encoder.finish()
    except av.error.FFmpegError as exc:  # an encoder failing on valid samples is a bug: a 500
        raise RuntimeError(f"encoding {fmt} failed: {exc}") from exc
    return buf.getvalue()


class StreamEncoder:
    """One streamed answer in ``fmt``: :meth:`encode` each chunk, then :meth:`finish`.

    The concatenated bytes form one playable stream: MP3 frames (after an ID3v2
    tag), AAC in ADTS frames, Ogg Opus pages (at most 60 ms each), a FLAC stream
    whose STREAMINFO leaves the length unknown, a WAV header with maximal sizes
    then PCM, or bare PCM. Codecs work in frames, so up to a frame of a chunk
    (and the encoder's look-ahead) leaves with the next chunk or with
    :meth:`finish`. Call :meth:`close` if the stream is abandoned.
    """

    def __init__(self, fmt: str, rate: int) -> None:
        self.fmt = fmt
        self.rate = rate
        self.started = False
        self.sink = _Sink()
        self.encoder: _AvEncoder | None = None
        if fmt not in ("wav", "pcm"):
            self.encoder = _AvEncoder(SPEECH_AUDIO[fmt], rate, self.sink, stream=True)

    def encode(self, audio: np.ndarray) -> bytes:
        if self.encoder is None:
            head = b""
            if self.fmt == "wav" and not self.started:
                head = streaming_wav_header(self.rate)
            self.started = True
            return head + pcm16(audio)
        self.encoder.feed(_int16(audio))
        return self.sink.take()

    def finish(self) -> bytes:
        if self.encoder is None:
            return b""
        self.encoder.finish()
        self.encoder = None
        return self.sink.take()

    def close(self) -> None:
        if self.encoder is not None:
            encoder, self.encoder = self.encoder, None
            encoder.close()


__all__ = [
    "DEMUXERS",
    "INPUT_FORMATS",
    "SPEECH_AUDIO",
    "SpeechFormat",
    "StreamEncoder",
    "decode",
    "encode_speech",
    "output_rate",
    "sniff",
    "streaming_wav_header",
]
