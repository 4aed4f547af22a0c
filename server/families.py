"""What the HTTP layer knows about each model family: request fields in, JSON out.

One adapter per family turns a validated JSON body (plus decoded audio) into
the family's request object and its results into JSON. Validation errors are
:class:`ApiError` 400s naming the field; the fields' types and ranges are checked
by the validators of :mod:`server.http.body`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from server.audio import b64encode, pcm16, wav_bytes
from server.config import (
    FAMILY_VOICES,
    SPEECH_RESPONSE_FORMATS,
    ServerConfig,
    default_voice_aliases,
)
from server.http.body import integer, number
from server.http.errors import ApiError, bad, show

MAX_PROMPT_CHARS = 2000
"""Longest Whisper ``prompt`` (the model keeps only its last 223 tokens anyway)."""
SPEECH_RANGES: dict[str, tuple[float, float]] = {
    "speed": (0.25, 4.0),
    "speaking_rate": (0.25, 4.0),
    "length_scale": (0.1, 10.0),
    "noise_scale": (0.0, 2.0),
    "noise_w": (0.0, 2.0),
}
"""Every numeric synthesis parameter's accepted range (docs/server.md, "Limits")."""
SEED_MAX = 2**64 - 1
VAD_RANGES: dict[str, tuple[float, float]] = {
    "threshold": (0.0, 1.0),  # open at both ends (silero's own check)
    "min_speech_duration_ms": (0.0, 3_600_000.0),
    "min_silence_duration_ms": (0.0, 3_600_000.0),
    "speech_pad_ms": (0.0, 3_600_000.0),
}
VAD_OPEN = frozenset({"threshold"})
"""VAD options whose range excludes its ends."""
LANGUAGES = ("en", "english", "English")
SPEECH_FORMATS = SPEECH_RESPONSE_FORMATS
"""Speech ``response_format`` values: the audio formats of :data:`server.codecs.SPEECH_AUDIO`,
then ``json`` / ``b64_json`` (a base64 WAV in JSON)."""
TRANSCRIPT_FORMATS = ("json", "verbose_json", "text", "srt", "vtt")
MAX_BATCH = 64
"""Most entries of one ``/v1/tasks/batch`` request."""
TIMESTAMP_GRANULARITIES = ("segment", "word")
"""OpenAI's ``timestamp_granularities[]`` values (``word`` adds ``words`` to verbose_json)."""
MAX_GRANULARITIES = 8
"""Longest ``timestamp_granularities`` list."""
TEMPERATURE_RANGE = (0.0, 1.0)
"""A transcription's ``temperature``: the first of the fallback temperatures."""


def timing(wall_s: float, audio_s: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_ms": round(wall_s * 1000.0, 3)}
    if audio_s is not None:
        out["audio_duration_ms"] = round(audio_s * 1000.0, 3)
        out["rtf"] = round(wall_s / audio_s, 6) if audio_s > 0 else None
    return out


def require(spec_id: str, mode: str, what: str, allowed_modes: tuple[str, ...]) -> None:
    """400 unless a model in ``mode`` can serve ``what``."""
    if mode not in allowed_modes:
        raise bad(
            f"model '{spec_id}' is in {mode} mode and cannot serve {what}; "
            f"register it with mode={allowed_modes[0]}"
        )


class TtsAdapter:
    """piper: text in, 22.05 kHz audio out. Streaming needs mode=streaming; batches mode=offline."""

    task = "tts"
    VOICES = FAMILY_VOICES["piper"]

    def check(self, spec_id: str, mode: str, what: str) -> None:
        if what == "stream":
            require(spec_id, mode, "streamed responses", ("streaming",))
        elif what == "batch":
            require(spec_id, mode, "native batches", ("offline",))

    def voices(self) -> list[str]:
        return list(self.VOICES)

    @staticmethod
    def aliases(spec_extra: Mapping[str, Any] | None = None) -> dict[str, str]:
        """A model's voice aliases (its spec's ``voice_aliases``, else the default table)."""
        table = (spec_extra or {}).get("voice_aliases")
        return dict(table) if table is not None else default_voice_aliases("piper")

    def voice(self, given: Any, aliases: Mapping[str, str]) -> str:
        """The voice a request names: a voice, an alias of one, or OpenAI's ``{"id": name}``."""
        name = given.get("id") if isinstance(given, Mapping) else given
        if isinstance(name, str):
            if name in self.VOICES:
                return name
            if name in aliases:
                return aliases[name]
        raise bad(
            f"unknown voice {show(given)}; available: {', '.join(self.VOICES)}"
            f" (or an alias: {', '.join(sorted(aliases)) or 'none'})"
        )

    def request(
        self,
        body: Mapping[str, Any],
        defaults: Mapping[str, str],
        config: ServerConfig,
        aliases: Mapping[str, str] | None = None,
    ) -> Any:
        """The PiperRequest of a body (``input`` or ``text``), with the config's audio limits.

        ``voice`` may be a voice or an alias (``aliases``, else the default table).
        """
        from backends.piper import PiperRequest

        merged: dict[str, Any] = {**defaults, **{k: v for k, v in body.items() if v is not None}}
        text = merged.get("input", merged.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise bad("'input' is required (non-empty text to speak)")
        if "\0" in text:  # espeak takes C strings
            raise bad("'input' must not contain NUL characters")
        if len(text) > config.max_input_chars:
            raise bad(
                "'input' is too long "
                f"(at most {config.max_input_chars} characters: max_input_chars)"
            )
        if merged.get("voice") is not None:  # one voice: it is checked, not passed on
            self.voice(merged["voice"], self.aliases() if aliases is None else aliases)
        speed = number(merged, "speed", *SPEECH_RANGES["speed"])
        if speed is None:
            speed = number(merged, "speaking_rate", *SPEECH_RANGES["speaking_rate"])
        length_scale = number(merged, "length_scale", *SPEECH_RANGES["length_scale"])
        if speed is not None:
            length_scale = (length_scale or 1.0) / speed
        return PiperRequest(
            text=text,
            noise_scale=number(merged, "noise_scale", *SPEECH_RANGES["noise_scale"]),
            length_scale=length_scale,
            noise_w=number(merged, "noise_w", *SPEECH_RANGES["noise_w"]),
            seed=integer(merged, "seed", 0, SEED_MAX),
            max_seconds=speech_seconds(config, len(text)),
            max_sentence_seconds=config.max_sentence_seconds,
        )

    @staticmethod
    def audio(result: Any) -> tuple[np.ndarray, int]:
        return result.audio, int(result.sample_rate)

    def json(self, result: Any) -> dict[str, Any]:
        audio, rate = self.audio(result)
        return {
            "audio": b64encode(wav_bytes(audio, rate)),
            "sample_rate": rate,
            "channels": 1,
            "format": "wav",
        }

    def chunk_json(self, chunk: Any) -> dict[str, Any]:
        return {
            "audio": b64encode(pcm16(chunk.audio)),
            "sample_rate": int(chunk.sample_rate),
            "index": int(chunk.index),
        }

    @staticmethod
    def duration(result: Any) -> float:
        audio, rate = TtsAdapter.audio(result)
        return audio.size / rate


class ServesEveryMode:
    """Families whose sessions stream and batch in either mode: nothing to refuse."""

    def check(self, spec_id: str, mode: str, what: str) -> None:
        return None


class AsrAdapter(ServesEveryMode):
    """whisper: 16 kHz audio in, text and segments out (every mode streams and batches)."""

    task = "asr"
    sample_rate = 16000

    def voices(self) -> list[str]:
        return []

    def check_fields(self, body: Mapping[str, Any]) -> None:
        """400 for a bad field, before any audio is decoded."""
        language = body.get("language")
        if language not in (None, "") and (
            not isinstance(language, str) or language not in LANGUAGES
        ):
            raise bad(
                f"language {show(language)} is not supported: this model is English-only (tiny.en)"
            )
        prompt = body.get("prompt", body.get("text"))
        if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS):
            raise bad(f"'prompt' must be a string of at most {MAX_PROMPT_CHARS} characters")
        number(body, "temperature", *TEMPERATURE_RANGE)
        integer(body, "seed", 0, SEED_MAX)
        self.granularities(body)

    @staticmethod
    def granularities(body: Mapping[str, Any]) -> tuple[str, ...]:
        """``timestamp_granularities`` (a JSON list or one string; a repeated multipart
        ``timestamp_granularities[]``), each ``segment`` or ``word``; 400 otherwise."""
        found: list[str] = []
        for key in ("timestamp_granularities", "timestamp_granularities[]"):
            value = body.get(key)
            if value is None:
                continue
            items = [value] if isinstance(value, str) else value
            if (
                not isinstance(items, list)
                or len(items) > MAX_GRANULARITIES
                or not all(isinstance(v, str) and v in TIMESTAMP_GRANULARITIES for v in items)
            ):
                raise bad(
                    f"'timestamp_granularities' must be a list of at most {MAX_GRANULARITIES}"
                    f" of: {', '.join(TIMESTAMP_GRANULARITIES)}; got {show(value)}"
                )
            found.extend(items)
        return tuple(dict.fromkeys(found))

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        """The WhisperRequest: ``prompt`` is the initial prompt, ``temperature`` the first of the
        fallback temperatures (0, or absent: 0.0 to 1.0 in steps of 0.2), ``seed`` seeds sampling,
        ``word`` in ``timestamp_granularities`` asks for word timestamps."""
        from backends.whisper import WhisperRequest, temperature_ladder

        self.check_fields(body)
        prompt = body.get("prompt", body.get("text"))
        temperature = number(body, "temperature", *TEMPERATURE_RANGE)
        seed = integer(body, "seed", 0, SEED_MAX)
        return WhisperRequest(
            audio=audio,
            initial_prompt=prompt or None,
            temperature=temperature_ladder(temperature or 0.0),
            seed=0 if seed is None else seed,
            word_timestamps="word" in self.granularities(body),
        )

    @staticmethod
    def segment_json(seg: Any) -> dict[str, Any]:
        return {
            "start": round(float(seg.start), 3),
            "end": round(float(seg.end), 3),
            "text": seg.text,
            "start_sample": round(seg.start * 16000),
            "end_sample": round(seg.end * 16000),
            "avg_logprob": float(seg.avg_logprob),
            "no_speech_prob": float(seg.no_speech_prob),
            "temperature": float(seg.temperature),
            "compression_ratio": float(seg.compression_ratio),
        }

    @staticmethod
    def word_json(word: Any) -> dict[str, Any]:
        """OpenAI's word shape: the word without its leading space, start and end in seconds."""
        return {
            "word": word.word.strip(),
            "start": round(float(word.start), 3),
            "end": round(float(word.end), 3),
        }

    def json(self, result: Any) -> dict[str, Any]:
        out = {
            "text": result.text,
            "language": "en",
            "duration": round(float(result.duration), 3),
            "segments": [self.segment_json(s) for s in result.segments],
        }
        if any(s.words is not None for s in result.segments):
            out["words"] = [self.word_json(w) for s in result.segments for w in s.words or ()]
        return out

    def chunk_json(self, seg: Any) -> dict[str, Any]:
        out = self.segment_json(seg)
        if seg.words is not None:
            out["words"] = [
                {**self.word_json(w), "probability": float(w.probability)} for w in seg.words
            ]
        return out

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration)


class VadAdapter(ServesEveryMode):
    """silero_vad: 16 kHz audio in, speech segments and probabilities out.

    Every mode streams and batches.
    """

    task = "vad"
    sample_rate = 16000

    def voices(self) -> list[str]:
        return []

    def check_fields(self, body: Mapping[str, Any]) -> dict[str, float]:
        """The given VAD options, each in its range (400 otherwise), before any audio is decoded."""
        return {
            key: value
            for key, (lo, hi) in VAD_RANGES.items()
            if (value := number(body, key, lo, hi, is_open=key in VAD_OPEN)) is not None
        }

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        from backends.silero_vad import VadOptions, VadRequest

        try:  # the ranges above are silero's own; its check stays the last word
            return VadRequest(audio=audio, options=VadOptions(**self.check_fields(body)))
        except (TypeError, ValueError) as exc:
            raise bad(str(exc)) from exc

    def json(self, result: Any, probabilities: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "segments": [
                {
                    "start": round(s.start_s, 4),
                    "end": round(s.end_s, 4),
                    "start_sample": s.start,
                    "end_sample": s.end,
                }
                for s in result.segments
            ],
            "sample_rate": int(result.sample_rate),
            "duration": round(float(result.duration_s), 4),
        }
        if probabilities:
            out["probabilities"] = [round(float(p), 6) for p in result.probabilities]
        return out

    def chunk_json(self, chunk: Any) -> dict[str, Any]:
        return {
            "index": int(chunk.index),
            "start_sample": int(chunk.start),
            "probability": round(float(chunk.probability), 6),
            "events": [
                {"type": e.kind, "sample": int(e.sample), "time": round(e.seconds, 4)}
                for e in chunk.events
            ],
        }

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration_s)


def speech_seconds(config: ServerConfig, chars: int) -> float:
    """The most audio a speech request of ``chars`` input characters may produce."""
    return min(config.max_speech_seconds, config.speech_seconds_per_char * max(chars, 1))


def speech_limit_error(exc: Exception, config: ServerConfig) -> ApiError:
    """The 400 for a piper :class:`~backends.piper.AudioLimitError`, naming the config key."""
    limit, seconds = getattr(exc, "limit", "request"), float(getattr(exc, "seconds", 0.0))
    if limit == "sentence":
        key = (
            f"max_sentence_seconds={config.max_sentence_seconds:g}; "
            "split long sentences with punctuation"
        )
    elif seconds >= config.max_speech_seconds:
        key = f"max_speech_seconds={config.max_speech_seconds:g}"
    else:
        key = (
            f"speech_seconds_per_char={config.speech_seconds_per_char:g} per input character, "
            f"at most max_speech_seconds={config.max_speech_seconds:g}"
        )
    return bad(f"{exc} ({key})")


ADAPTERS: dict[str, TtsAdapter | AsrAdapter | VadAdapter] = {
    "tts": TtsAdapter(),
    "asr": AsrAdapter(),
    "vad": VadAdapter(),
}
