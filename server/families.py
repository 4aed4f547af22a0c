"""What the HTTP layer knows about each model family: request fields in, JSON out.

One adapter per family turns a validated JSON body (plus decoded audio) into
the family's request object and its results into JSON. Validation errors are
:class:`ApiError` 400s naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from server.audio import b64encode, pcm16, wav_bytes


class ApiError(Exception):
    """An HTTP error with an OpenAI-shaped JSON body."""

    def __init__(self, status: int, message: str, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def number(body: Mapping[str, Any], key: str, *, minimum: float | None = None, positive: bool = False) -> float | None:
    """An optional finite number field."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise bad(f"'{key}' must be a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad(f"'{key}' must be a finite number")
    if positive and value <= 0:
        raise bad(f"'{key}' must be > 0")
    if minimum is not None and value < minimum:
        raise bad(f"'{key}' must be >= {minimum}")
    return float(value)


def integer(body: Mapping[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{key}' must be an integer")
    if minimum is not None and value < minimum:
        raise bad(f"'{key}' must be >= {minimum}")
    return value


def timing(wall_s: float, audio_s: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"wall_ms": round(wall_s * 1000.0, 3)}
    if audio_s is not None:
        out["audio_duration_ms"] = round(audio_s * 1000.0, 3)
        out["rtf"] = round(wall_s / audio_s, 6) if audio_s > 0 else None
    return out


def require(spec_id: str, mode: str, what: str, allowed_modes: tuple[str, ...]) -> None:
    """400 unless a model in ``mode`` can serve ``what``."""
    if mode not in allowed_modes:
        raise bad(f"model '{spec_id}' is in {mode} mode and cannot serve {what}; register it with mode={allowed_modes[0]}")


class TtsAdapter:
    """piper: text in, 22.05 kHz audio out. Streaming needs mode=streaming; batches mode=offline."""

    task = "tts"
    VOICES = ("joe", "en_US-joe-medium")

    def check(self, spec_id: str, mode: str, what: str) -> None:
        if what == "stream":
            require(spec_id, mode, "streamed responses", ("streaming",))
        elif what == "batch":
            require(spec_id, mode, "native batches", ("offline",))

    def voices(self) -> list[str]:
        return list(self.VOICES)

    def request(self, body: Mapping[str, Any], defaults: Mapping[str, str]) -> Any:
        from backends.piper import PiperRequest

        merged: dict[str, Any] = {**defaults, **{k: v for k, v in body.items() if v is not None}}
        text = merged.get("input", merged.get("text"))
        if not isinstance(text, str) or not text.strip():
            raise bad("'input' is required (non-empty text to speak)")
        if len(text) > 20_000:
            raise bad("'input' is too long (at most 20000 characters)")
        voice = merged.get("voice")
        if voice is not None and voice not in self.VOICES:
            raise bad(f"unknown voice {voice!r}; available: {', '.join(self.VOICES)}")
        speed = number(merged, "speed", positive=True)
        if speed is None:
            speed = number(merged, "speaking_rate", positive=True)
        if speed is not None and not 0.25 <= speed <= 4.0:
            raise bad("'speed' must be between 0.25 and 4.0")
        length_scale = number(merged, "length_scale", positive=True)
        if speed is not None:
            length_scale = (length_scale or 1.0) / speed
        seed = integer(merged, "seed", minimum=0)
        try:
            return PiperRequest(
                text=text,
                noise_scale=number(merged, "noise_scale", minimum=0.0),
                length_scale=length_scale,
                noise_w=number(merged, "noise_w", minimum=0.0),
                seed=seed,
            )
        except ValueError as exc:
            raise bad(str(exc)) from exc

    @staticmethod
    def audio(result: Any) -> tuple[np.ndarray, int]:
        return result.audio, int(result.sample_rate)

    def json(self, result: Any) -> dict[str, Any]:
        audio, rate = self.audio(result)
        return {"audio": b64encode(wav_bytes(audio, rate)), "sample_rate": rate, "channels": 1, "format": "wav"}

    def chunk_json(self, chunk: Any) -> dict[str, Any]:
        return {"audio": b64encode(pcm16(chunk.audio)), "sample_rate": int(chunk.sample_rate), "index": int(chunk.index)}

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

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        from backends.whisper import WhisperRequest

        language = body.get("language")
        if language not in (None, "", "en", "english", "English"):
            raise bad(f"language {language!r} is not supported: this model is English-only (tiny.en)")
        prompt = body.get("prompt", body.get("text"))
        if prompt is not None and not isinstance(prompt, str):
            raise bad("'prompt' must be a string")
        return WhisperRequest(audio=audio, initial_prompt=prompt or None)

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
        }

    def json(self, result: Any) -> dict[str, Any]:
        return {
            "text": result.text,
            "language": "en",
            "duration": round(float(result.duration), 3),
            "segments": [self.segment_json(s) for s in result.segments],
        }

    def chunk_json(self, seg: Any) -> dict[str, Any]:
        return self.segment_json(seg)

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration)


class VadAdapter(ServesEveryMode):
    """silero_vad: 16 kHz audio in, speech segments and probabilities out (every mode streams and batches)."""

    task = "vad"
    sample_rate = 16000


    def voices(self) -> list[str]:
        return []

    def request(self, body: Mapping[str, Any], audio: np.ndarray) -> Any:
        from backends.silero_vad import VadOptions, VadRequest

        try:
            given = {
                key: value
                for key in ("threshold", "min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms")
                if (value := number(body, key, minimum=0.0)) is not None
            }
            options = VadOptions(**given)
            return VadRequest(audio=audio, options=options)
        except (TypeError, ValueError) as exc:
            raise bad(str(exc)) from exc

    def json(self, result: Any, probabilities: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "segments": [
                {"start": round(s.start_s, 4), "end": round(s.end_s, 4), "start_sample": s.start, "end_sample": s.end}
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
            "events": [{"type": e.kind, "sample": int(e.sample), "time": round(e.seconds, 4)} for e in chunk.events],
        }

    @staticmethod
    def duration(result: Any) -> float:
        return float(result.duration_s)


ADAPTERS: dict[str, TtsAdapter | AsrAdapter | VadAdapter] = {
    "tts": TtsAdapter(),
    "asr": AsrAdapter(),
    "vad": VadAdapter(),
}
