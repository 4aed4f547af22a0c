"""Requests and results of the ``vad`` task (host-side attrs classes)."""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np

SAMPLE_RATE = 16000


def _unit_interval(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"silero_vad: {attribute.name} must be in (0, 1), got {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if float(value) < 0:
        raise ValueError(f"silero_vad: {attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class VadOptions:
    """Thresholds and durations of silero's ``get_speech_timestamps`` / ``VADIterator``."""

    threshold: float = attrs.field(default=0.5, validator=_unit_interval)
    neg_threshold: float | None = None  # None: max(threshold - 0.15, 0.01)
    min_speech_duration_ms: float = attrs.field(default=250.0, validator=_non_negative)
    min_silence_duration_ms: float = attrs.field(default=100.0, validator=_non_negative)
    speech_pad_ms: float = attrs.field(default=30.0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        neg = self.neg_threshold
        if neg is not None and not 0.0 <= float(neg) <= self.threshold:
            raise ValueError(f"silero_vad: neg_threshold must be in [0, threshold], got {neg!r}")

    @property
    def exit_threshold(self) -> float:
        """The threshold below which speech ends (silero's default: threshold - 0.15, >= 0.01)."""
        if self.neg_threshold is not None:
            return float(self.neg_threshold)
        return max(self.threshold - 0.15, 0.01)


def _audio(value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"silero_vad: audio must be a numpy array, got {type(value).__name__}")
    if value.ndim != 1:
        raise ValueError(f"silero_vad: audio must be mono (1-D), got shape {value.shape}")
    if value.dtype.kind != "f":
        raise ValueError(f"silero_vad: audio must be float samples in [-1, 1], got {value.dtype}")
    audio = np.ascontiguousarray(value, dtype=np.float32)
    if not np.isfinite(audio).all():
        raise ValueError("silero_vad: audio contains NaN or infinite samples")
    return audio


def _rate(_: object, __: attrs.Attribute[int], value: int) -> None:
    if value != SAMPLE_RATE:
        raise ValueError(
            f"silero_vad: only {SAMPLE_RATE} Hz audio is supported, got {value} Hz; resample first"
        )


@attrs.frozen(eq=False)
class VadRequest:
    """One VAD request: 16 kHz mono float audio plus options.

    ``continue_stream`` (``stream`` only) carries on from the session's previous
    stream (LSTM state, context, position, pending samples) instead of starting
    clean; ``final=False`` keeps a trailing partial chunk pending for the next
    piece instead of zero-padding it.
    """

    audio: np.ndarray = attrs.field(converter=_audio)
    sample_rate: int = attrs.field(default=SAMPLE_RATE, validator=_rate)
    options: VadOptions = attrs.field(factory=VadOptions)
    continue_stream: bool = False
    final: bool = True


def checked_request(request: object, offline: bool) -> VadRequest:
    """``request`` if it is a :class:`VadRequest` valid for ``run``/``batch`` (``offline``)
    or ``stream``; raises TypeError or ValueError otherwise."""
    if not isinstance(request, VadRequest):
        raise TypeError(f"silero_vad: expected a VadRequest, got {type(request).__name__}")
    if offline and (request.continue_stream or not request.final):
        raise ValueError("silero_vad: continue_stream/final=False apply to stream() only")
    return request


@attrs.frozen
class SpeechSegment:
    """A speech segment in samples (end exclusive) and seconds."""

    start: int
    end: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


@attrs.frozen(eq=False)
class VadResult:
    """Offline result: one probability per 512-sample chunk and the speech segments."""

    probabilities: np.ndarray  # float32 [ceil(num_samples / 512)]
    segments: tuple[SpeechSegment, ...]
    num_samples: int
    sample_rate: int = SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate


@attrs.frozen
class VadEvent:
    """A streaming speech boundary, at a sample position of the whole stream."""

    kind: Literal["start", "end"]
    sample: int

    @property
    def seconds(self) -> float:
        return self.sample / SAMPLE_RATE


@attrs.frozen
class VadChunk:
    """One streamed step: the probability of chunk ``index`` and any boundary it caused."""

    index: int
    start: int  # first sample of the chunk in the whole stream
    probability: float
    events: tuple[VadEvent, ...] = ()
