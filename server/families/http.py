"""What the HTTP layer shares across families: field ranges, timing, the speech limits' 400.

Each family's adapter (``server/families/<family>_http.py``, a
:class:`~server.families.base.FamilyAdapter`) turns a validated JSON body (plus
decoded audio) into the family's request object and its results into JSON, with
the helpers and ranges here. Validation errors are :class:`ApiError` 400s naming
the field; the fields' types and ranges are checked by the validators of
:mod:`server.http.body`. The ranges are also what ``/openapi.json`` documents.
"""

from __future__ import annotations

from typing import Any

from server.families.base import SPEECH_RESPONSE_FORMATS, SpeechLimits
from server.http.errors import ApiError, bad
from server.runtime.phases import Phases

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
    "threshold": (0.0, 1.0),  # open at both ends (the VAD's own check)
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


def timing(wall_s: float, audio_s: float | None, phases: Phases | None = None) -> dict[str, Any]:
    """A response's ``timing``: the route's wall time, the audio's length and real-time
    factor, and where the runtime's part went (``queue_ms``, ``load_ms``, ``run_ms``)."""
    out: dict[str, Any] = {"wall_ms": round(wall_s * 1000.0, 3)}
    if phases is not None:
        out.update({f"{name}_ms": ms for name, ms in phases.durations_ms().items()})
    if audio_s is not None:
        out["audio_duration_ms"] = round(audio_s * 1000.0, 3)
        out["rtf"] = round(wall_s / audio_s, 6) if audio_s > 0 else None
    return out


def server_timing(phases: Phases) -> dict[str, str]:
    """The ``Server-Timing`` response header for a request's runtime phases."""
    value = phases.server_timing()
    return {"Server-Timing": value} if value else {}


def require(spec_id: str, mode: str, what: str, allowed_modes: tuple[str, ...]) -> None:
    """400 unless a model in ``mode`` can serve ``what``."""
    if mode not in allowed_modes:
        raise bad(
            f"model '{spec_id}' is in {mode} mode and cannot serve {what}; "
            f"register it with mode={allowed_modes[0]}"
        )


class ServesEveryMode:
    """Families whose sessions stream and batch in either mode: nothing to refuse."""

    def check(self, spec_id: str, mode: str, what: str) -> None:
        return None


def speech_seconds(config: SpeechLimits, chars: int) -> float:
    """The most audio a speech request of ``chars`` input characters may produce."""
    return min(config.max_speech_seconds, config.speech_seconds_per_char * max(chars, 1))


def no_speech_error() -> ApiError:
    """The 400 for a speech request whose text gave no audio (nothing the voice pronounces:
    punctuation only, a zero-width space, symbols), whichever route and format asked: a
    200 with an empty body would be a file no player opens."""
    return bad("the input produced no speech (nothing to pronounce)")


def speech_limit_error(exc: Exception, config: SpeechLimits) -> ApiError:
    """The 400 for a TTS family's limit error (its entry's ``limit_error``), naming the config
    key: the error carries ``limit`` (``"sentence"`` or the request) and ``seconds``."""
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
