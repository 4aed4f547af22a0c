"""Request and result types of the Piper text-to-speech task, and the WAV/PCM helpers."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from backends.wav import pcm16_bytes, wav_bytes

DEFAULT_SEED = 0
"""Noise seed of requests that give none, so repeating a request repeats its audio."""


def _finite_nonneg(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _finite_positive(_: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and not (np.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


class AudioLimitError(ValueError):
    """A request would produce more audio than its limit: nothing past the limit is synthesized.

    ``limit`` is ``"request"`` (``PiperRequest.max_seconds``, the whole request) or
    ``"sentence"`` (``max_sentence_seconds``, one sentence: its memory grows with it).
    """

    def __init__(self, limit: str, seconds: float, at_least: float) -> None:
        what = "this request" if limit == "request" else "one sentence"
        super().__init__(
            f"the speech would exceed {seconds:g} s of audio, the most {what} may produce "
            f"(at least {at_least:.1f} s needed)"
        )
        self.limit = limit
        self.seconds = seconds
        self.at_least = at_least


class FrameLimitError(ValueError):
    """Raised by the model when a sentence needs more frames than allowed.

    It is raised before the flow and vocoder run.
    """

    def __init__(self, frames: int, max_frames: int) -> None:
        super().__init__(f"sentence needs {frames} frames, at most {max_frames} allowed")
        self.frames = frames
        self.max_frames = max_frames


@attrs.frozen
class PiperRequest:
    """One synthesis.

    Unset scales take the voice config's values (noise 0.667, length 1, noise_w 0.8).

    ``normalize_audio`` and ``volume`` are piper's output stage (peak-normalise each
    sentence, scale, clip to [-1, 1]); ``seed`` seeds this request's own RNG.
    ``max_seconds`` bounds the request's audio, ``max_sentence_seconds`` each sentence's
    (its working memory is proportional to it): a request that would pass either gets
    :class:`AudioLimitError` before the sentence's flow and vocoder run.
    """

    text: str
    noise_scale: float | None = attrs.field(default=None, validator=_finite_nonneg)
    length_scale: float | None = attrs.field(default=None, validator=_finite_nonneg)
    noise_w: float | None = attrs.field(default=None, validator=_finite_nonneg)
    seed: int | None = None
    speaker: int | None = None
    normalize_audio: bool = True
    volume: float = attrs.field(default=1.0, validator=_finite_nonneg)
    max_seconds: float | None = attrs.field(default=None, validator=_finite_positive)
    max_sentence_seconds: float | None = attrs.field(default=None, validator=_finite_positive)

    def __attrs_post_init__(self) -> None:
        if self.length_scale == 0:
            raise ValueError("length_scale must be > 0")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            raise ValueError("seed must be an integer in [0, 2**64)")


@attrs.frozen(eq=False)
class PiperChunk:
    """The audio of one sentence (one streamed chunk)."""

    index: int
    phonemes: tuple[str, ...]
    phoneme_ids: tuple[int, ...]
    audio: np.ndarray
    sample_rate: int

    def pcm16(self) -> bytes:
        return pcm16_bytes(self.audio)


@attrs.frozen(eq=False)
class PiperResult:
    """A whole request: the sentences' audio concatenated, and the chunks themselves."""

    audio: np.ndarray
    sample_rate: int
    chunks: tuple[PiperChunk, ...]

    @property
    def duration_s(self) -> float:
        return self.audio.size / self.sample_rate

    def wav_bytes(self) -> bytes:
        return wav_bytes(self.audio, self.sample_rate)
