"""Speech segments from per-chunk probabilities: silero's decision rules, on the host.

Offline (:func:`speech_segments`, silero ``get_speech_timestamps``; with
``max_speech_s``, faster-whisper's copy of it, which long audio is cut with before
batched Whisper decoding), with 512-sample chunks, chunk i at sample 512*i:

* speech starts at the first chunk with ``p >= threshold`` (while not in speech);
* in speech, a chunk with ``p < neg_threshold`` (default ``threshold - 0.15``,
  at least 0.01) marks a tentative end at its first sample; a later chunk with
  ``p >= threshold`` cancels it; once the silence since the tentative end reaches
  ``min_silence_duration_ms`` the segment closes at the tentative end, and is
  kept only if longer than ``min_speech_duration_ms``;
* a segment still open at the end of the audio closes at the last sample (kept
  if longer than ``min_speech_duration_ms``);
* padding: ``speech_pad_ms`` is added on both sides (clamped to the audio); where
  two segments are closer than two pads, the gap is split half and half.

Streaming (:class:`StreamTrigger`, silero ``VADIterator``): per chunk, emit
``start`` at ``max(0, chunk_start - pad)`` on the first chunk with
``p >= threshold``; in speech, the first chunk with ``p < neg_threshold`` sets a
tentative end at that chunk's end sample, a chunk with ``p >= threshold``
cancels it, and once ``min_silence_duration_ms`` has passed since it, emit
``end`` at ``tentative_end + pad - 512``. There is no minimum speech duration in
streaming. Addition of ours: when a final stream ends in speech, ``end`` is
emitted at the last sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from backends.silero_vad.types import SAMPLE_RATE, SpeechSegment, VadEvent, VadOptions

CHUNK = 512
MIN_SILENCE_AT_MAX_SPEECH_MS = 98  # a silence a max-speech cut may use


def _samples(ms: float) -> float:
    return SAMPLE_RATE * ms / 1000


def speech_segments(
    probs: Sequence[float] | np.ndarray,
    num_samples: int,
    options: VadOptions,
    max_speech_s: float = math.inf,
) -> tuple[SpeechSegment, ...]:
    """Port of ``get_speech_timestamps``; ``max_speech_s`` as faster-whisper's copy has it.

    With ``max_speech_s`` finite (default: unbounded, which changes nothing), speech
    that has lasted longer than ``max_speech_s`` minus one chunk and both pads is
    cut at the start of the last silence of more than 98 ms seen in it, speech then
    resuming where it came back (or, if it has not, after that silence); without
    such a silence it is cut at the current chunk. This is the rule of
    ``faster_whisper.vad.get_speech_timestamps`` (1.2.1); silero's own now
    prefers the longest such silence.
    """
    threshold, neg = options.threshold, options.exit_threshold
    min_speech = _samples(options.min_speech_duration_ms)
    min_silence = _samples(options.min_silence_duration_ms)
    pad = _samples(options.speech_pad_ms)
    max_speech = SAMPLE_RATE * max_speech_s - CHUNK - 2 * pad
    min_silence_at_max_speech = _samples(MIN_SILENCE_AT_MAX_SPEECH_MS)

    raw: list[list[int]] = []
    start: int | None = None
    temp_end = 0
    prev_end = next_start = 0  # where to cut, and to resume, should max_speech be reached
    for i, prob in enumerate(probs):
        p, cur = float(prob), CHUNK * i
        if p >= threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = cur
        if p >= threshold and start is None:
            start = cur
            continue
        if start is not None and cur - start > max_speech:
            if prev_end:
                raw.append([start, prev_end])
                start = None if next_start < prev_end else next_start
                prev_end = next_start = temp_end = 0
            else:
                raw.append([start, cur])
                start = None
                prev_end = next_start = temp_end = 0
                continue
        if p < neg and start is not None:
            if not temp_end:
                temp_end = cur
            if cur - temp_end > min_silence_at_max_speech:
                prev_end = temp_end
            if cur - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                raw.append([start, temp_end])
            start = None
            prev_end = next_start = temp_end = 0
    if start is not None and num_samples - start > min_speech:
        raw.append([start, num_samples])

    for i, seg in enumerate(raw):
        if i == 0:
            seg[0] = int(max(0, seg[0] - pad))
        if i != len(raw) - 1:
            gap = raw[i + 1][0] - seg[1]
            if gap < 2 * pad:
                seg[1] += int(gap // 2)
                raw[i + 1][0] = int(max(0, raw[i + 1][0] - gap // 2))
            else:
                seg[1] = int(min(num_samples, seg[1] + pad))
                raw[i + 1][0] = int(max(0, raw[i + 1][0] - pad))
        else:
            seg[1] = int(min(num_samples, seg[1] + pad))
    return tuple(SpeechSegment(int(s), int(e)) for s, e in raw)


@attrs.define
class StreamTrigger:
    """``VADIterator``'s state machine: one call per processed chunk."""

    options: VadOptions
    triggered: bool = False
    temp_end: int = 0

    def step(self, prob: float, chunk_end: int, chunk_len: int = CHUNK) -> VadEvent | None:
        """Feed the probability of the chunk ending at sample ``chunk_end``."""
        opts = self.options
        pad = _samples(opts.speech_pad_ms)
        p = float(prob)
        if p >= opts.threshold and self.temp_end:
            self.temp_end = 0
        if p >= opts.threshold and not self.triggered:
            self.triggered = True
            return VadEvent("start", int(max(0, chunk_end - pad - chunk_len)))
        if p < opts.exit_threshold and self.triggered:
            if not self.temp_end:
                self.temp_end = chunk_end
            if chunk_end - self.temp_end < _samples(opts.min_silence_duration_ms):
                return None
            end = self.temp_end + pad - chunk_len
            self.temp_end = 0
            self.triggered = False
            return VadEvent("end", int(end))
        return None

    def close(self, num_samples: int) -> VadEvent | None:
        """End of a final stream: close an open segment at the last sample."""
        if not self.triggered:
            return None
        self.triggered, self.temp_end = False, 0
        return VadEvent("end", int(num_samples))


def chunk_events(
    trigger: StreamTrigger, prob: float, chunk_end: int, total: int, last: bool
) -> tuple[VadEvent, ...]:
    """The events of one streamed chunk ending at sample ``chunk_end``, in order.

    The trigger's step, then, on the ``last`` chunk of a final stream, the close of
    an open segment; every sample is clipped to ``total`` (the samples received so far).
    """
    events = []
    event = trigger.step(prob, chunk_end)
    if event is not None:
        events.append(event)
    if last:
        closing = trigger.close(total)
        if closing is not None:
            events.append(closing)
    return tuple(attrs.evolve(e, sample=min(e.sample, total)) for e in events)
