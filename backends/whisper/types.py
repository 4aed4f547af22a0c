"""Request and result types of the Whisper ASR task."""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from backends.whisper.alignment import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from backends.whisper.fallback import DEFAULT_TEMPERATURES
from backends.whisper.frontend import SAMPLE_RATE
from backends.whisper.longform import Segment, Window

DEFAULT_SEED = 0


def _as_audio(value: object) -> np.ndarray:
    audio = np.asarray(value)
    if audio.dtype == np.int16:
        audio = audio.astype(np.float32) / np.float32(32768.0)
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError("audio must be mono (1-D)")
    return audio


def _as_temperatures(value: float | Sequence[float]) -> tuple[float, ...]:
    values = (value,) if isinstance(value, int | float) else tuple(value)
    if not values:
        raise ValueError("temperature: at least one value is needed")
    out = tuple(float(v) for v in values)
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise ValueError(f"temperatures must be finite and >= 0, got {out}")
    return out


def _as_prompt(value: str | Sequence[int] | None) -> str | tuple[int, ...] | None:
    if value is None or isinstance(value, str):
        return value
    return tuple(int(t) for t in value)


@attrs.frozen(eq=False)
class WhisperRequest:
    """Transcribe 16 kHz mono audio (float32 in [-1, 1], or int16 PCM).

    Options mirror faster-whisper's ``transcribe`` defaults with beam size 1 and
    VAD off: temperature fallback over ``(0.0, 0.2, ..., 1.0)`` (a single float is
    one temperature, no fallback), sampling seeded by ``seed``, word timestamps
    off. ``initial_prompt`` is text (OpenAI's ``prompt``) or token ids.

    ``vad_chunking`` (off by default) transcribes long audio as faster-whisper's
    batched pipeline does: Silero VAD cuts it at silences into pieces of at most
    30 s, decoded together as one batch, each without the text of the others
    (:mod:`backends.whisper.pieces`).
    """

    audio: np.ndarray = attrs.field(converter=_as_audio)
    sample_rate: int = SAMPLE_RATE
    condition_on_previous_text: bool = True
    initial_prompt: str | tuple[int, ...] | None = attrs.field(default=None, converter=_as_prompt)
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] = (-1,)
    max_initial_timestamp: float = 1.0
    temperature: tuple[float, ...] = attrs.field(
        default=DEFAULT_TEMPERATURES, converter=_as_temperatures
    )
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    prompt_reset_on_temperature: float = 0.5
    best_of: int = 5
    seed: int = DEFAULT_SEED
    word_timestamps: bool = False
    prepend_punctuations: str = PREPEND_PUNCTUATIONS
    append_punctuations: str = APPEND_PUNCTUATIONS
    record_top2: bool = False  # debug: keep each step's two best masked logits
    vad_chunking: bool = False

    def __attrs_post_init__(self) -> None:
        if self.sample_rate != SAMPLE_RATE:
            raise ValueError(f"whisper expects {SAMPLE_RATE} Hz audio, got {self.sample_rate}")
        if self.best_of < 1:
            raise ValueError(f"best_of must be at least 1, got {self.best_of}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@attrs.frozen
class WhisperResult:
    """The transcript: joined text, segments, audio duration (s) and the decoded windows.

    ``pieces``: with ``vad_chunking``, the (start, end) seconds of each piece the
    audio was cut into; empty otherwise.
    """

    text: str
    segments: tuple[Segment, ...]
    duration: float
    windows: tuple[Window, ...]
    pieces: tuple[tuple[float, float], ...] = ()
