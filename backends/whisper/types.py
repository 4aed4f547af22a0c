"""Request and result types of the Whisper ASR task."""

from __future__ import annotations

import attrs
import numpy as np

from backends.whisper.frontend import SAMPLE_RATE
from backends.whisper.longform import Segment, Window


def _as_audio(value: object) -> np.ndarray:
    audio = np.asarray(value)
    if audio.dtype == np.int16:
        audio = audio.astype(np.float32) / np.float32(32768.0)
    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError("audio must be mono (1-D)")
    return audio


@attrs.frozen(eq=False)
class WhisperRequest:
    """Transcribe 16 kHz mono audio (float32 in [-1, 1], or int16 PCM).

    Options mirror faster-whisper's ``transcribe`` defaults with beam size 1,
    temperature 0 (no fallback), VAD and word timestamps off.
    """

    audio: np.ndarray = attrs.field(converter=_as_audio)
    sample_rate: int = SAMPLE_RATE
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] = (-1,)
    max_initial_timestamp: float = 1.0
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float | None = -1.0
    record_top2: bool = False  # debug: keep each step's two best masked logits

    def __attrs_post_init__(self) -> None:
        if self.sample_rate != SAMPLE_RATE:
            raise ValueError(f"whisper expects {SAMPLE_RATE} Hz audio, got {self.sample_rate}")


@attrs.frozen
class WhisperResult:
    """The transcript: joined text, segments, audio duration (s) and the decoded windows."""

    text: str
    segments: tuple[Segment, ...]
    duration: float
    windows: tuple[Window, ...]
