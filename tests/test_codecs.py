"""server.codecs: every upload format decodes, every speech format encodes, limits hold while
decoding.

No server here: the decoder and encoders on files made with PyAV from tests/data.
The live round trips (piper -> each format -> whisper and VAD) are in
tests/server/test_formats.py.
"""

from __future__ import annotations

import contextlib
import io
import wave
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest

from server import codecs
from server.audio import (
    AudioError,
    AudioLimitError,
    decode_wav,
    load_for_model,
    pcm16,
    resample,
    wav_bytes,
)
from server.config import ConfigError, default_voice_aliases, parse_config
from tests.audio_files import UPLOADS, encode_as, wav_samples
from tests.server.live import HELLO_WAV

HELLO = HELLO_WAV.read_bytes()
"""0.82 s of "Hello world." at 16 kHz mono 16-bit."""
LOSSLESS = ("flac", "mkv", "aiff")
"""Upload formats that keep the WAV's samples (FLAC in FLAC and Matroska, AIFF PCM)."""
SNIFFED = {
    "flac": "flac",
    "mp3": "mp3",
    "mp4": "mov",
    "mpeg": "mp3",
    "mpga": "mp3",
    "m4a": "mov",
    "ogg": "ogg",
    "webm": "matroska",
    "aac": "aac",
    "oga": "ogg",
    "mkv": "matroska",
    "aiff": "aiff",
}


def reference() -> np.ndarray:
    return load_for_model(HELLO, 16000)


def aligned_error(x: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
    """The lag (0..1200 samples: codec priming) that best aligns ``x`` to ``ref``, and the
    largest difference there."""
    n = min(x.size, ref.size) - 1200
    lag = max(range(1200), key=lambda k: float(np.dot(x[k : k + n], ref[:n])))
    return lag, float(np.abs(x[lag : lag + n] - ref[:n]).max())


@pytest.mark.parametrize("ext", list(UPLOADS))
def test_every_upload_format_decodes_to_the_same_speech(ext: str) -> None:
    data = encode_as(HELLO, ext)
    assert codecs.sniff(data) == SNIFFED[ext]
    ref = reference()
    out = load_for_model(data, 16000, max_seconds=600)
    assert out.dtype == np.float32
    # the codecs' priming and padding add at most a few frames
    assert ref.size <= out.size <= ref.size + 2048, (out.size, ref.size)
    lag, err = aligned_error(out, ref)
    if ext in LOSSLESS:
        assert out.size == ref.size and np.array_equal(out, ref)  # same rate: the same samples
    else:
        assert lag <= 1024 and err < 0.12, (lag, err)


def test_stereo_is_averaged_and_resampled_to_the_model_rate() -> None:
    pcm, rate, _ = wav_samples(HELLO)
    left = pcm[:, 0]
    stereo = np.stack([left, np.zeros_like(left)], axis=1)  # the average is half the signal
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(stereo.astype("<i2").tobytes())
    flac = encode_as(buf.getvalue(), "flac")
    half = load_for_model(flac, 16000)
    assert np.allclose(half, reference() / 2, atol=1e-6)
    up = load_for_model(encode_as(HELLO, "flac"), 22050)  # swresample to another rate
    want = resample(reference(), 16000, 22050)
    assert abs(up.size - want.size) <= 2
    n = min(up.size, want.size)
    assert np.corrcoef(up[:n], want[:n])[0, 1] > 0.999


def test_wav_keeps_its_own_reader() -> None:
    """WAV never goes through PyAV: the exact samples the Whisper parity tests expect."""
    samples, rate = decode_wav(HELLO)
    assert np.array_equal(load_for_model(HELLO, 16000), samples)
    assert np.array_equal(load_for_model(HELLO, 22050), resample(samples, rate, 22050))


def test_wav_never_reaches_pyav(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a WAV was given to PyAV")

    monkeypatch.setattr(codecs, "decode", refuse)
    load_for_model(HELLO, 16000)
    with pytest.raises(AudioError, match="WAV"):  # a broken RIFF stays the WAV reader's error
        load_for_model(b"RIFF\x00\x00garbage" * 7, 16000)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bytes(range(256)), "not a WAV file or any other supported format"),
        (b"just bytes", "not a WAV file or any other supported format"),
        (b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n", "not a WAV file"),  # HLS: never probed
        (b"ffconcat version 1.0\nfile /etc/passwd\n", "not a WAV file"),  # concat demuxer
        (b"ID3\x03\x00fake mp3", "could not be read as mp3"),
        (b"ID3\x03junk", "could not be read as mp3"),  # shorter than an ID3v2 header
        (b"OggS" + b"\0" * 100, "could not be read as ogg"),
        (b"fLaC" + b"\xff" * 50, "could not be read as flac"),
        (b"\x00\x00\x00\x1cftypisom" + b"\0" * 40, "could not be read as mov"),
    ],
)
def test_undecodable_audio_is_an_audio_error(data: bytes, message: str) -> None:
    with pytest.raises(AudioError, match=message):
        load_for_model(data, 16000)


@pytest.mark.parametrize("ext", ["mp3", "ogg", "m4a", "webm"])
def test_truncated_files_fail_cleanly_or_decode_what_is_there(ext: str) -> None:
    data = encode_as(HELLO, ext)
    for cut in (16, len(data) // 3):
        try:
            out = load_for_model(data[:cut], 16000)
        except AudioError as exc:
            assert "audio" in str(exc)
        else:
            assert 0 < out.size < reference().size + 2048


def test_a_file_without_audio_is_refused() -> None:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska") as out:
        stream: Any = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with pytest.raises(AudioError, match="no audio stream"):
        load_for_model(buf.getvalue(), 16000)


def counting_frames(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the frames :func:`server.codecs.decode` decodes."""
    seen = [0]
    real = codecs._frames

    def frames(container: Any, stream: Any) -> Iterator[Any]:
        for frame in real(container, stream):
            seen[0] += 1
            yield frame

    monkeypatch.setattr(codecs, "_frames", frames)
    return seen


def long_wav(seconds: float) -> bytes:
    pcm, rate, _ = wav_samples(HELLO)
    reps = int(np.ceil(seconds * rate / pcm.shape[0]))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.tile(pcm[:, 0], reps)[: int(seconds * rate)].astype("<i2").tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("ext", ["flac", "m4a", "ogg", "mp3"])
def test_a_stated_duration_over_the_limit_is_refused_before_decoding(
    ext: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = encode_as(long_wav(6.0), ext)
    seen = counting_frames(monkeypatch)
    with pytest.raises(AudioLimitError, match=r"the audio is 6\.\d s long; at most 2 s") as info:
        load_for_model(data, 16000, max_seconds=2)
    assert "max_audio_seconds" in str(info.value)
    assert seen[0] == 0


@pytest.mark.parametrize(("ext", "limit"), [("webm", 3), ("aac", 11)])
def test_decoding_stops_once_past_the_limit(
    ext: str, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A browser's WebM states no duration, ADTS only an estimate (within ESTIMATE_SLACK of
    the limit here): the decoded length decides, and decoding stops at the limit rather
    than after the whole file."""
    data = encode_as(long_wav(12.0), ext)
    seen = counting_frames(monkeypatch)
    load_for_model(data, 16000, max_seconds=20)
    total = seen[0]
    seen[0] = 0
    with pytest.raises(AudioLimitError, match=f"more than {limit} s long; at most {limit} s"):
        load_for_model(data, 16000, max_seconds=limit)
    assert 0 < seen[0] <= total * limit / 12 + 2, (seen[0], total)


def test_the_output_buffer_grows_past_its_first_guess() -> None:
    """No stated duration: the buffer starts at MIN_CAPACITY_S and doubles."""
    seconds = codecs.MIN_CAPACITY_S + 8
    data = encode_as(long_wav(seconds), "webm")
    out = load_for_model(data, 8000)
    assert abs(out.size - seconds * 8000) < 2048


# ---- encoding --------------------------------------------------------------------------------

MAGIC = {"mp3": b"ID3", "opus": b"OggS", "aac": b"\xff\xf1", "flac": b"fLaC", "wav": b"RIFF"}


def speech() -> tuple[np.ndarray, int]:
    samples, _ = decode_wav(HELLO)
    return resample(samples, 16000, 22050), 22050


@pytest.mark.parametrize("fmt", list(codecs.SPEECH_AUDIO))
def test_every_speech_format_encodes_and_decodes_back(fmt: str) -> None:
    audio, rate = speech()
    data = codecs.encode_speech(audio, rate, fmt)
    if fmt == "pcm":
        assert data == pcm16(audio)
        return
    assert data.startswith(MAGIC[fmt])
    back = load_for_model(data, 22050)
    lag, err = aligned_error(back, load_for_model(wav_bytes(audio, rate), 22050))
    assert back.size >= audio.size
    assert err < 0.15, (fmt, lag, err)
    if fmt in ("mp3", "opus", "flac", "wav"):  # gapless: the length comes back (Opus: at 48 kHz)
        assert abs(back.size - audio.size) <= (1 if fmt == "opus" else 0)


def test_flac_speech_is_the_wav_answer_exactly() -> None:
    audio, rate = speech()
    flac = codecs.encode_speech(audio, rate, "flac")
    wav = codecs.encode_speech(audio, rate, "wav")
    assert np.array_equal(load_for_model(flac, rate), load_for_model(wav, rate))


@pytest.mark.parametrize("fmt", list(codecs.SPEECH_AUDIO))
def test_a_stream_is_one_playable_file_arriving_in_pieces(fmt: str) -> None:
    audio, rate = speech()
    encoder = codecs.StreamEncoder(fmt, rate)
    pieces = [encoder.encode(part) for part in np.array_split(audio, 4)]
    pieces.append(encoder.finish())
    data = b"".join(pieces)
    assert sum(1 for p in pieces[:4] if p) >= 3  # bytes leave with each chunk, not at the end
    if fmt == "pcm":
        assert data == pcm16(audio)
        return
    assert data.startswith(MAGIC[fmt])
    if fmt == "wav":
        assert data[44:] == pcm16(audio)
    back = load_for_model(data, 22050)
    assert audio.size <= back.size <= audio.size + 2400
    _, err = aligned_error(back, load_for_model(wav_bytes(audio, rate), 22050))
    assert err < 0.15


@pytest.mark.parametrize("fmt", ["aac", "flac", "pcm", "wav"])
def test_a_stream_has_the_same_audio_as_the_whole_file(fmt: str) -> None:
    """Chunking does not change what the encoder writes (AAC and FLAC frames, PCM samples)."""
    audio, rate = speech()
    encoder = codecs.StreamEncoder(fmt, rate)
    data = b"".join(
        [encoder.encode(part) for part in np.array_split(audio, 3)] + [encoder.finish()]
    )
    whole = codecs.encode_speech(audio, rate, fmt)
    if fmt in ("aac", "pcm"):
        assert data == whole
    else:
        assert np.array_equal(load_for_model(data, rate), load_for_model(whole, rate))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_an_abandoned_stream_closes(fmt: str) -> None:
    audio, rate = speech()
    encoder = codecs.StreamEncoder(fmt, rate)
    encoder.encode(audio[:5000])
    encoder.close()
    encoder.close()
    codecs.StreamEncoder(fmt, rate).close()  # never fed


def test_content_types_and_rates() -> None:
    types = {k: v.content_type for k, v in codecs.SPEECH_AUDIO.items()}
    assert types == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
    }
    assert codecs.output_rate("opus", 22050) == 48000
    assert {codecs.output_rate(f, 22050) for f in ("mp3", "aac", "flac", "wav", "pcm")} == {22050}


# ---- voice aliases in server.json ------------------------------------------------------------


def config(**model: Any) -> Any:
    return parse_config({"models": [{"id": "p", "family": "piper", **model}]})


def test_default_voice_aliases() -> None:
    """OpenAI's voice names (all of them, as the openai package lists them) and ``default``."""
    openai_names = {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin"}
    openai_names |= {"nova", "onyx", "sage", "shimmer", "verse"}
    table = default_voice_aliases("piper")
    assert set(table) == openai_names | {"default"}
    assert set(table.values()) == {"joe"}
    assert config().models[0].voice_aliases == table
    assert default_voice_aliases("whisper") == {}


def test_voice_aliases_override_add_and_remove() -> None:
    aliases = config(
        voice_aliases={"alloy": "en_US-joe-medium", "narrator": "joe", "echo": None}
    ).models[0]
    table = aliases.voice_aliases
    assert table["alloy"] == "en_US-joe-medium" and table["narrator"] == "joe"
    assert "echo" not in table and table["nova"] == "joe"
    assert aliases.spec().extra["voice_aliases"] == table


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"voice_aliases": {"alloy": "nobody"}}, "must name a voice of piper"),
        ({"voice_aliases": {"joe": "en_US-joe-medium"}}, "is a voice, not an alias"),
        ({"voice_aliases": ["alloy"]}, "must be an object"),
        ({"voice_aliases": {"": "joe"}}, "1 to 64 characters"),
        ({"default_request_options": {"response_format": "ogg"}}, "response_format must be one"),
    ],
)
def test_bad_voice_aliases_are_config_errors(model: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**model)


def test_voice_aliases_only_for_tts() -> None:
    with pytest.raises(ConfigError, match="only for TTS"):
        parse_config(
            {"models": [{"id": "v", "family": "silero_vad", "voice_aliases": {"a": "joe"}}]}
        )


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_the_same_samples_give_the_same_bytes(fmt: str) -> None:
    """A seeded request's answer is reproducible in every format (Ogg's serial number included)."""
    audio, rate = speech()
    assert codecs.encode_speech(audio, rate, fmt) == codecs.encode_speech(audio, rate, fmt)
    streams = []
    for _ in range(2):
        encoder = codecs.StreamEncoder(fmt, rate)
        streams.append(encoder.encode(audio) + encoder.finish())
    assert streams[0] == streams[1]


@pytest.mark.parametrize(
    ("codec_id", "message"),
    [
        (b"A_QQQQ", "the file's audio codec is not supported"),  # FFmpeg knows no such codec
        (b"A_AC3\x00", "audio codec 'ac3' is not supported"),  # FFmpeg does, we do not take it
        (b"V_FLAC", "no audio stream"),
    ],
)
def test_codecs_outside_the_list_are_refused(codec_id: bytes, message: str) -> None:
    data = encode_as(HELLO, "mkv")
    at = data.index(b"A_FLAC")
    with pytest.raises(AudioError, match=message):
        load_for_model(data[:at] + codec_id + data[at + 6 :], 16000)


def test_mutated_files_raise_only_audio_errors() -> None:
    """Seeded corruptions of every format: a 400, or audio; never another exception (a 500)."""
    rng = np.random.default_rng(12)
    for ext in UPLOADS:
        good = encode_as(HELLO, ext)
        for _ in range(60):
            data = bytearray(good)
            for at in rng.integers(0, len(data), size=int(rng.integers(1, 12))):
                data[at] = int(rng.integers(0, 256))
            data = data[: int(rng.integers(8, len(data) + 1))]
            with contextlib.suppress(AudioError):
                load_for_model(bytes(data), 16000, max_seconds=600)
